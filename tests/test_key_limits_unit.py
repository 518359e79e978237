"""Key policy units (docs/observability.md, "Key limits"; docs/auth.md, "API keys") that a client
cannot see: `KeyLimits` driven with the real `UsageLedger` and `Instances` (tokens of the day as the
gateway adds them, the refusal counters, a deleted key's state, alias resolution), the stored
policy's validation, and the conditional UPDATE that refuses an expired or edited key. What a
client sees is in tests/test_key_limits.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from vllm_use import config as config_mod
from vllm_use.clock import now_ms
from vllm_use.deployments.instances import Instances
from vllm_use.errors import CorruptRecord, ModelNotFound, RateLimited, Unauthenticated
from vllm_use.keys import material
from vllm_use.keys import store as key_store
from vllm_use.keys.authenticator import Authenticator
from vllm_use.keys.limits import KeyLimits, go_duration
from vllm_use.runtime.lifecycle import Lifecycle
from vllm_use.scopes import KeyPolicy
from vllm_use.storage import ApiKeyTable, Database
from vllm_use.usage.ledger import UsageLedger


@pytest.fixture
def instances(tmp_path: Path) -> Instances:
    config = config_mod.load(config_mod.build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]), {})
    found = Instances(config, Lifecycle())
    found.set_names([{"name": "llama", "aliases": ["lm"]}, {"name": "other", "aliases": []}])
    return found


def test_tokens_per_day_admits_below_the_limit_and_refuses_at_it(instances: Instances) -> None:
    usage = UsageLedger()
    limits = KeyLimits(usage, instances)
    policy = KeyPolicy(tokens_per_day=100)
    headers = dict(limits.admit("k" * 24, policy, "tiny"))
    assert headers["x-ratelimit-limit-tokens"] == "100"
    assert headers["x-ratelimit-remaining-tokens"] == "100"
    midnight = 86_400 - int(time.time()) % 86_400
    assert headers["x-ratelimit-reset-tokens"] in {go_duration(midnight), go_duration(midnight + 1)}
    limits.release("k" * 24)
    usage.add("k" * 24, 99)  # as the gateway does when a request ends
    assert dict(limits.admit("k" * 24, policy, "tiny"))["x-ratelimit-remaining-tokens"] == "1"
    limits.release("k" * 24)
    usage.add("k" * 24, 1)
    with pytest.raises(RateLimited) as caught:
        limits.admit("k" * 24, policy, "tiny")
    assert caught.value.limit == "tokens" and caught.value.http_status == 429
    assert abs(caught.value.retry_after_s - midnight) <= 1
    assert dict(caught.value.headers)["x-ratelimit-remaining-tokens"] == "0"
    assert limits.refusals == {"rpm": 0, "concurrency": 0, "tokens": 1}
    assert limits.in_flight("k" * 24) == 0  # a refusal holds no slot
    assert limits.admit("j" * 24, policy, "tiny")  # another key's count is its own


def test_refusals_are_counted_by_limit_and_a_deleted_key_leaves_no_state(instances: Instances) -> None:
    limits = KeyLimits(UsageLedger(), instances)
    key, policy = "a" * 24, KeyPolicy(rpm=1, max_concurrent=1)
    limits.admit(key, policy, None)
    with pytest.raises(RateLimited):
        limits.admit(key, policy, None)  # concurrency, checked before the window
    limits.release(key)
    with pytest.raises(RateLimited):
        limits.admit(key, policy, None)  # rpm
    assert limits.refusals == {"rpm": 1, "concurrency": 1, "tokens": 0}
    limits.forget_key(key)
    assert limits.admit(key, policy, None)  # the window went with the key
    assert limits.in_flight(key) == 1
    limits.release(key)
    limits.release(key)  # never below zero
    assert limits.in_flight(key) == 0


def test_retry_after_is_never_too_early_when_the_rpm_was_lowered_below_a_full_window(
    instances: Instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests at t=0, 30 and 40 s under rpm=3, then the limit lowered to 2: a place frees
    when the one of t=30 leaves (t=90), not the oldest (t=60, where a retry would be refused again).
    `limits` tells only the oldest, so the answer is the newest's leaving, t=100: late, never early."""
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])  # limits' storage and KeyLimits read it
    limits = KeyLimits(UsageLedger(), instances)
    key = "r" * 24
    for at in (0, 30, 40):
        clock[0] = 1_000_000.0 + at
        limits.admit(key, KeyPolicy(rpm=3), None)
        limits.release(key)
    clock[0] = 1_000_000.0 + 41
    with pytest.raises(RateLimited) as caught:
        limits.admit(key, KeyPolicy(rpm=2), None)
    assert 90 - 41 <= caught.value.retry_after_s <= 100 - 41
    with pytest.raises(RateLimited) as full:  # a window exactly full: its oldest leaving is exact
        limits.admit(key, KeyPolicy(rpm=3), None)
    assert full.value.retry_after_s == 60 - 41


def test_model_names_resolve_through_aliases_either_way_round(instances: Instances) -> None:
    limits = KeyLimits(UsageLedger(), instances)
    by_name, by_alias = frozenset({"llama"}), frozenset({"lm"})
    for models in (by_name, by_alias):
        for model in ("llama", "lm"):
            limits.check_model(models, model)
        with pytest.raises(ModelNotFound) as caught:
            limits.check_model(models, "other")
        assert caught.value.message == ModelNotFound.unknown("other").message
    with pytest.raises(ModelNotFound):
        limits.check_model(by_name, None)


def test_go_durations_as_openai_writes_them() -> None:
    assert [go_duration(s) for s in (0, 12, 60, 61, 3600, 3723)] == [
        "0s",
        "12s",
        "1m0s",
        "1m1s",
        "1h0m0s",
        "1h2m3s",
    ]


def test_store_refuses_to_confirm_an_expired_key(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir(mode=0o700)
    db = Database(tmp_path / "data" / "vllm-use.db")
    db.open()
    auth = Authenticator(db, "unit-admin-token-0123456789")
    try:
        secret, key_id, salt = material.new_secret(), material.new_key_id(), b"s" * material.SALT_LEN
        now = now_ms()
        row = {
            "id": key_id,
            "name": "expired",
            "prefix": secret[: material.PREFIX_LEN],
            "salt": salt.hex(),
            "hash": material.derive(secret, salt).hex(),
            "enabled": 1,
            "scopes": json.dumps(["inference"]),
            "created_at": now - 10_000,
            "last_used_at": None,
            "expires_at": now - 1,
        }
        db.run_sync(lambda: ApiKeyTable.insert(**row).execute())
        policy = key_store.policy_of(row)
        assert not db.query_sync(key_store.confirm, key_id, row["hash"], row["scopes"], policy, now)
        assert db.query_sync(key_store.confirm, key_id, row["hash"], row["scopes"], policy, now - 2)
        # An edit of the policy made outside this process fails the periodic re-check too.
        edited = (now + 60_000, *policy[1:])
        assert not db.query_sync(key_store.confirm, key_id, row["hash"], row["scopes"], edited, now - 2)
        with pytest.raises(Unauthenticated):
            asyncio.run(auth.authenticate(secret))
    finally:
        auth.close()
        db.close()


def stored_row(**policy: Any) -> dict[str, Any]:
    """An api_keys row as SQLite returns it (no scrypt: parse_row checks the hash's length only)."""
    return {
        "id": "r" * 24,
        "name": "stored",
        "prefix": "vu_abcdefgh",
        "salt": "00" * material.SALT_LEN,
        "hash": "00" * material.HASH_LEN,
        "enabled": 1,
        "scopes": '["inference"]',
        "created_at": 1_000,
        "last_used_at": None,
        **policy,
    }


@pytest.mark.parametrize(
    "policy",
    [
        {"rpm": 0},
        {"rpm": 100_001},
        {"rpm": "5"},
        {"rpm": 5.0},
        {"max_concurrent": True},
        {"tokens_per_day": 10**12 + 1},
        {"models": "[]"},
        {"models": '["a", "a"]'},
        {"models": '["bad name"]'},
        {"models": json.dumps([f"m{i}" for i in range(65)])},
        {"models": "llama"},
        {"expires_at": 1_000},  # not after created_at
        {"expires_at": material.EXPIRES_MAX_MS + 1},
    ],
)
def test_a_hand_edited_policy_out_of_bounds_is_a_corrupt_record(policy: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecord) as caught:
        material.parse_row(stored_row(**policy))
    assert next(iter(policy)) in caught.value.message


def test_a_stored_policy_at_its_bounds_is_read_back() -> None:
    record = material.parse_row(
        stored_row(
            rpm=100_000,
            max_concurrent=10_000,
            tokens_per_day=10**12,
            models=json.dumps(["lm", "llama"]),
            expires_at=material.EXPIRES_MAX_MS,
        )
    )
    assert record.policy() == KeyPolicy(frozenset({"lm", "llama"}), 100_000, 10_000, 10**12)
    assert record.expires_at == material.EXPIRES_MAX_MS and not record.expired()
    assert material.parse_row(stored_row()).policy() is None  # no policy: the gateway skips it

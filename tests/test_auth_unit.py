"""Authenticator internals that a real client cannot time precisely: races and the cache."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from pathlib import Path

import pytest

from vllm_use.clock import now_ms
from vllm_use.errors import Unauthenticated
from vllm_use.keys import authenticator as auth_mod
from vllm_use.keys import material
from vllm_use.keys import store as key_store
from vllm_use.keys.authenticator import Authenticator, parse_bearer
from vllm_use.scopes import Surface
from vllm_use.storage import ApiKeyTable, Database

ADMIN = "unit-admin-token-0123456789"


def insert_key(db: Database, scopes: list[str]) -> tuple[str, str]:
    secret, key_id, salt = (
        material.new_secret(),
        material.new_key_id(),
        secrets.token_bytes(material.SALT_LEN),
    )
    row = {
        "id": key_id,
        "name": "unit",
        "prefix": secret[: material.PREFIX_LEN],
        "salt": salt.hex(),
        "hash": material.derive(secret, salt).hex(),
        "enabled": 1,
        "scopes": json.dumps(scopes),
        "created_at": now_ms(),
        "last_used_at": None,
    }
    db.run_sync(lambda: ApiKeyTable.insert(**row).execute())
    return key_id, secret


@pytest.fixture
def db(tmp_path: Path):
    (tmp_path / "data").mkdir(mode=0o700)
    database = Database(tmp_path / "data" / "vllm-use.db")
    database.open()
    yield database
    database.close()


def hold_scrypt(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make scrypt wait: `started` is set when a derivation begins, it finishes after `release`."""
    started, release = threading.Event(), threading.Event()
    real = material.matches

    def slow_matches(*args):
        started.set()
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(auth_mod.material, "matches", slow_matches)
    return started, release


def test_parse_bearer_accepts_only_the_canonical_form() -> None:
    assert parse_bearer(["Bearer abc"]) == "abc"
    for values in (
        [],
        ["Bearer a", "Bearer a"],
        ["Bearer a, Bearer b"],
        ["bearer a"],
        ["Bearer  a"],
        ["Bearer "],
    ):
        with pytest.raises(Unauthenticated):
            parse_bearer(values)


def test_key_disabled_during_derivation_does_not_authenticate(db: Database, monkeypatch) -> None:
    key_id, secret = insert_key(db, ["admin.read"])
    started, release = hold_scrypt(monkeypatch)

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        attempt = asyncio.ensure_future(authenticator.authenticate(secret))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        authenticator.forget(key_id)
        await db.run(lambda: ApiKeyTable.update(enabled=0).where(ApiKeyTable.id == key_id).execute())
        release.set()
        with pytest.raises(Unauthenticated):
            await attempt
        authenticator.close()

    asyncio.run(scenario())


def test_repeat_authentication_does_not_pay_scrypt_again(db: Database, monkeypatch) -> None:
    _, secret = insert_key(db, ["admin.read"])
    calls = []
    real = material.matches
    monkeypatch.setattr(auth_mod.material, "matches", lambda *a: calls.append(1) or real(*a))

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        for _ in range(5):
            identity = await authenticator.authenticate(secret)
            assert identity.scopes == {"admin.read"}
        authenticator.close()

    asyncio.run(scenario())
    assert len(calls) == 1


def test_forget_makes_the_next_request_reread_sqlite(db: Database) -> None:
    key_id, secret = insert_key(db, ["admin.read"])

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        await authenticator.authenticate(secret)
        authenticator.forget(key_id)
        await db.run(lambda: ApiKeyTable.delete().where(ApiKeyTable.id == key_id).execute())
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate(secret)
        authenticator.close()

    asyncio.run(scenario())


def test_cached_key_is_rechecked_against_sqlite_after_the_revalidation_period(
    db: Database, monkeypatch
) -> None:
    key_id, secret = insert_key(db, ["admin.read"])

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        await authenticator.authenticate(secret)
        # disabled behind our back (by hand in SQLite): the cache notices at the next recheck
        await db.run(lambda: ApiKeyTable.update(enabled=0).where(ApiKeyTable.id == key_id).execute())
        monkeypatch.setattr(auth_mod, "REVALIDATE_S", 0.0)
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate(secret)
        authenticator.close()

    asyncio.run(scenario())


def test_admin_token_and_wrong_secrets(db: Database) -> None:
    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        assert (await authenticator.authenticate(ADMIN)).kind == "admin_token"
        for token in (ADMIN + "x", "vu_" + "a" * 48, "vu_short"):
            with pytest.raises(Unauthenticated):
                await authenticator.authenticate(token)
        authenticator.close()

    asyncio.run(scenario())


def test_concurrent_first_requests_with_one_key_share_one_scrypt(db: Database, monkeypatch) -> None:
    _, secret = insert_key(db, ["admin.read"])
    calls = []
    real = material.matches
    monkeypatch.setattr(auth_mod.material, "matches", lambda *a: calls.append(1) or real(*a))

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        identities = await asyncio.gather(*(authenticator.authenticate(secret) for _ in range(10)))
        assert {i.key_id for i in identities} == {identities[0].key_id}
        authenticator.close()

    asyncio.run(scenario())
    assert len(calls) == 1


def test_a_request_after_disable_does_not_join_an_older_verification(db: Database, monkeypatch) -> None:
    key_id, secret = insert_key(db, ["admin.read"])
    started, release = hold_scrypt(monkeypatch)

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        first = asyncio.ensure_future(authenticator.authenticate(secret))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        authenticator.forget(key_id)
        await db.run(lambda: ApiKeyTable.update(enabled=0).where(ApiKeyTable.id == key_id).execute())
        second = asyncio.ensure_future(authenticator.authenticate(secret))
        release.set()
        for attempt in (first, second):
            with pytest.raises(Unauthenticated):
                await attempt
        authenticator.close()

    asyncio.run(scenario())


# --- the known-prefix scrypt flood (docs/auth.md) ---------------------------------------------------


def wrong_secret_for(secret: str) -> str:
    """Another well-formed secret with the same display prefix: it costs a scrypt, then fails."""
    return secret[: material.PREFIX_LEN] + "".join(
        secrets.choice("abcdefghij") for _ in range(51 - material.PREFIX_LEN)
    )


def count_prefix_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    real = key_store.rows_with_prefix

    def counting(db: Database, prefix: str):
        rows = real(db, prefix)
        reads.append(prefix)
        return rows

    monkeypatch.setattr(key_store, "rows_with_prefix", counting)
    return reads


def test_a_flood_on_one_prefix_does_not_hold_up_another_keys_first_verification(
    db: Database, monkeypatch
) -> None:
    """Real scrypt, real SQLite: 32 wrong secrets for one key's prefix are all queued before a
    different key's first request. It must not wait for the flood: count the flood requests that
    finished a derivation before it did. (Before the bound: all 32.)"""
    _, victim = insert_key(db, ["admin.read"])
    _, other = insert_key(db, ["admin.read"])
    reads = count_prefix_reads(monkeypatch)
    finished: list[tuple[str, str]] = []

    async def attempt(tag: str, token: str) -> None:
        try:
            await authenticator.authenticate(token)
            finished.append((tag, "200"))
        except auth_mod.AuthBusy:
            finished.append((tag, "429"))
        except Unauthenticated:
            finished.append((tag, "401"))

    async def scenario() -> None:
        flood = [asyncio.ensure_future(attempt("flood", wrong_secret_for(victim))) for _ in range(32)]
        while len(reads) < 32:  # every flood request has read its rows and asked for scrypt
            await asyncio.sleep(0.001)
        for _ in range(5):
            await asyncio.sleep(0)
        first = asyncio.ensure_future(attempt("other", other))
        await asyncio.gather(*flood, first)

    authenticator = Authenticator(db, ADMIN)
    try:
        asyncio.run(scenario())
    finally:
        authenticator.close()
    flood_outcomes = [status for tag, status in finished if tag == "flood"]
    assert set(flood_outcomes) <= {"401", "429"}  # never let through
    assert "429" in flood_outcomes  # refused at once beyond the bounded queue, not queued
    position = finished.index(("other", "200"))
    derived_before = sum(1 for tag, status in finished[:position] if tag == "flood" and status == "401")
    assert derived_before <= 2, finished


def test_one_prefix_admits_one_derivation_and_a_bounded_queue_then_refuses(db: Database, monkeypatch) -> None:
    _, victim = insert_key(db, ["admin.read"])
    started, release = hold_scrypt(monkeypatch)
    reads = count_prefix_reads(monkeypatch)

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        admitted = [
            asyncio.ensure_future(authenticator.authenticate(wrong_secret_for(victim)))
            for _ in range(1 + auth_mod.PREFIX_WAITING_MAX)
        ]
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        while len(reads) < len(admitted):
            await asyncio.sleep(0.001)
        with pytest.raises(auth_mod.AuthBusy) as refused:
            await authenticator.authenticate(wrong_secret_for(victim))
        assert refused.value.http_status == 429 and refused.value.details["retry_after_s"] >= 1
        release.set()
        for attempt in admitted:
            with pytest.raises(Unauthenticated):
                await attempt
        with pytest.raises(Unauthenticated):  # the queue drained: admitted again
            await authenticator.authenticate(wrong_secret_for(victim))
        authenticator.close()

    asyncio.run(scenario())


def test_all_prefixes_together_admit_a_bounded_number(db: Database, monkeypatch) -> None:
    monkeypatch.setattr(auth_mod, "PENDING_MAX", 3)
    secrets_ = [insert_key(db, ["admin.read"])[1] for _ in range(4)]
    started, release = hold_scrypt(monkeypatch)
    reads = count_prefix_reads(monkeypatch)

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        admitted = [asyncio.ensure_future(authenticator.authenticate(s)) for s in secrets_[:3]]
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        while len(reads) < 3:
            await asyncio.sleep(0.001)
        with pytest.raises(auth_mod.AuthBusy):
            await authenticator.authenticate(secrets_[3])
        with pytest.raises(Unauthenticated):  # a prefix without a row takes no slot
            await authenticator.authenticate("vu_" + "Q" * 48)
        release.set()
        assert len({(await a).key_id for a in admitted}) == 3
        assert (await authenticator.authenticate(secrets_[3])).key_id is not None
        authenticator.close()

    asyncio.run(scenario())


def test_a_verified_key_pays_no_scrypt_during_a_flood_on_its_prefix(db: Database, monkeypatch) -> None:
    _, victim = insert_key(db, ["admin.read"])

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        await authenticator.authenticate(victim)  # verified once: cached
        started, release = hold_scrypt(monkeypatch)
        flood = [
            asyncio.ensure_future(authenticator.authenticate(wrong_secret_for(victim)))
            for _ in range(2 * auth_mod.PREFIX_WAITING_MAX)
        ]
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        identity = await authenticator.authenticate(victim)  # while the flood's scrypt is held
        assert identity.scopes == {"admin.read"}
        release.set()
        outcomes = await asyncio.gather(*flood, return_exceptions=True)
        assert all(isinstance(o, Unauthenticated | auth_mod.AuthBusy) for o in outcomes)
        authenticator.close()

    asyncio.run(scenario())


def test_a_key_changed_once_its_scrypt_is_done_is_not_handed_out(db: Database, monkeypatch) -> None:
    """`forget` lands after the publishing UPDATE but before the waiting request resumes: the
    identity must not slip past the revocation (the handler would register it as live)."""
    key_id, secret = insert_key(db, ["admin.read"])
    real_confirm = key_store.confirm

    async def scenario() -> None:
        authenticator = Authenticator(db, ADMIN)
        loop = asyncio.get_running_loop()

        def confirm_then_revoke(*args):
            ok = real_confirm(*args)
            loop.call_soon_threadsafe(authenticator.forget, key_id)  # runs before we resume
            return ok

        monkeypatch.setattr(key_store, "confirm", confirm_then_revoke)
        with pytest.raises(Unauthenticated):
            await authenticator.authenticate(secret)
        monkeypatch.setattr(key_store, "confirm", real_confirm)
        assert (await authenticator.authenticate(secret)).key_id == key_id  # not revoked: fine again
        authenticator.close()

    asyncio.run(scenario())


def test_refusals_are_counted_by_surface_with_the_last_time() -> None:
    failures = auth_mod.AuthFailures()
    assert failures.snapshot() == {
        "total": 0,
        "by_surface": {"api": 0, "mcp": 0, "gateway": 0, "tools": 0, "metrics": 0},
        "last_at": None,
    }
    for surface in (Surface.GATEWAY, Surface.GATEWAY, Surface.MCP):
        failures.record(surface)
    snap = failures.snapshot()
    assert snap["total"] == 3 and snap["by_surface"] == {
        "api": 0,
        "mcp": 1,
        "gateway": 2,
        "tools": 0,
        "metrics": 0,
    }
    assert snap["last_at"] is not None and snap["last_at"] <= now_ms()

"""Authenticator internals that a real client cannot time precisely: races and the cache."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from pathlib import Path

import pytest

from vllm_use import auth as auth_mod
from vllm_use import keys
from vllm_use.auth import Authenticator, parse_bearer
from vllm_use.errors import Unauthenticated
from vllm_use.storage import ApiKey, Database, now_ms

ADMIN = "unit-admin-token-0123456789"


def insert_key(db: Database, scopes: list[str]) -> tuple[str, str]:
    secret, key_id, salt = keys.new_secret(), keys.new_key_id(), secrets.token_bytes(keys.SALT_LEN)
    row = {
        "id": key_id,
        "name": "unit",
        "prefix": secret[: keys.PREFIX_LEN],
        "salt": salt.hex(),
        "hash": keys.derive(secret, salt).hex(),
        "enabled": 1,
        "scopes": json.dumps(scopes),
        "created_at": now_ms(),
        "last_used_at": None,
    }
    db.run_sync(lambda: ApiKey.insert(**row).execute())
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
    real = keys.matches

    def slow_matches(*args):
        started.set()
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(auth_mod.keys, "matches", slow_matches)
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
        await db.run(lambda: ApiKey.update(enabled=0).where(ApiKey.id == key_id).execute())
        release.set()
        with pytest.raises(Unauthenticated):
            await attempt
        authenticator.close()

    asyncio.run(scenario())


def test_repeat_authentication_does_not_pay_scrypt_again(db: Database, monkeypatch) -> None:
    _, secret = insert_key(db, ["admin.read"])
    calls = []
    real = keys.matches
    monkeypatch.setattr(auth_mod.keys, "matches", lambda *a: calls.append(1) or real(*a))

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
        await db.run(lambda: ApiKey.delete().where(ApiKey.id == key_id).execute())
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
        await db.run(lambda: ApiKey.update(enabled=0).where(ApiKey.id == key_id).execute())
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
    real = keys.matches
    monkeypatch.setattr(auth_mod.keys, "matches", lambda *a: calls.append(1) or real(*a))

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
        await db.run(lambda: ApiKey.update(enabled=0).where(ApiKey.id == key_id).execute())
        second = asyncio.ensure_future(authenticator.authenticate(secret))
        release.set()
        for attempt in (first, second):
            with pytest.raises(Unauthenticated):
                await attempt
        authenticator.close()

    asyncio.run(scenario())

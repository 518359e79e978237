"""Authentication: the Bearer header, the admin token, and API keys.

Design (docs/auth.md has the long form):

- `parse_bearer` accepts exactly one canonical `Authorization: Bearer <token>`;
  anything else is "no credential" (401), fail closed.
- The admin token is compared in constant time against its SHA-256.
- An API key costs one scrypt the first time it is seen: fixed-cost format
  check → rows with the same display prefix read and validated in full → scrypt
  in the crypto executor (never on the IOLoop) → a conditional UPDATE (same
  hash, scopes and policy, enabled=1, not expired) publishes the identity and
  moves `last_used_at` forward. A key disabled or deleted while scrypt ran fails that UPDATE.
- Verified keys are cached in memory, keyed by SHA-256 of the secret; a
  repeat request is a dict lookup and, for a key with `expires_at`, one
  integer compare: an expired key is refused like a disabled one, cached or
  not (the conditional UPDATE refuses it too). Every key mutation in this process calls
  `forget(key_id)` *before* its write, so disable/delete hold for the next
  request; the cache epoch makes a derivation that raced a mutation uncacheable.
  Entries are re-checked against SQLite (no scrypt) after `REVALIDATE_S`, which
  bounds how long an edit made outside this process goes unnoticed.
- `last_used_at` of cached hits is coalesced in memory and flushed every
  `FLUSH_S` and at shutdown with an UPDATE that never moves it backwards.
- scrypt is the expensive step, and anyone who knows a key's display prefix
  can make us pay it with wrong secrets. So per prefix at most one derivation
  runs and `PREFIX_WAITING_MAX` wait (FIFO), and at most `PENDING_MAX` are
  admitted across all prefixes; beyond either, the request is refused at once
  with `AuthBusy` (429), never queued and never let through. A flood on one
  prefix then delays only that key's *first* verification: other keys' first
  verifications get the other crypto thread or the next turn, and cached keys
  pay no scrypt at all. A token whose prefix matches no row costs one indexed
  query and no scrypt, so it takes no slot.
- Refusals are counted in memory by surface (`AuthFailures`), never written:
  a flood of bad credentials cannot evict audit records or grow a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import constant_time

from vllm_use.clock import now_ms
from vllm_use.errors import CorruptRecord, TooManyRequests, Unauthenticated
from vllm_use.keys import material, store
from vllm_use.scopes import ADMIN_TOKEN_IDENTITY, Identity, Surface
from vllm_use.storage import Database

log = logging.getLogger(__name__)

REVALIDATE_S = 30.0
FLUSH_S = 10.0
CACHE_MAX = 10_000
PREFIX_WAITING_MAX = 4  # derivations waiting behind the one running, per key prefix
PENDING_MAX = 64  # derivations admitted (running or waiting), all prefixes together
RETRY_AFTER_S = 1
BUSY_LOG_EVERY_S = 10.0
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
_MAX_TOKEN = 512


def parse_bearer(values: list[str]) -> str:
    """The token of exactly one `Authorization: Bearer <token>` header, else Unauthenticated."""
    if len(values) != 1:
        raise Unauthenticated("send exactly one Authorization: Bearer header")
    value = values[0]
    if not value.startswith("Bearer ") or len(value) > 7 + _MAX_TOKEN:
        raise Unauthenticated("expected Authorization: Bearer <token>")
    token = value[7:]
    if not token or not _TOKEN_CHARS.issuperset(token):
        raise Unauthenticated("expected Authorization: Bearer <token>")
    return token


class AuthBusy(TooManyRequests):
    """Too many first verifications are waiting for this key prefix, or for all (429)."""

    code = "auth_busy"


class AuthFailures:
    """Refused authentications, counted in memory by surface, with the time of the last one.

    Handlers call `record` wherever they refuse a credential (401, or 429 `AuthBusy`). Counting
    is all it does: no row, no log line per refusal, so a flood costs an integer increment. A
    metrics exporter can read `total`, `by_surface` and `last_at` as they are.
    """

    def __init__(self) -> None:
        self.total = 0
        self.by_surface: dict[str, int] = {surface.value: 0 for surface in Surface}
        self.last_at: int | None = None  # unix ms

    def record(self, surface: Surface) -> None:
        self.total += 1
        self.by_surface[surface.value] += 1
        self.last_at = now_ms()

    def snapshot(self) -> dict[str, Any]:
        return {"total": self.total, "by_surface": dict(self.by_surface), "last_at": self.last_at}


@dataclass
class _Gate:
    """One key prefix's derivations: `admitted` counts the running one and those waiting."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: waiters get turns in order
    admitted: int = 0


@dataclass
class _Verified:
    identity: Identity
    epoch: int
    checked_at: float
    hash_hex: str
    scopes_json: str
    policy: tuple[Any, ...]  # the row's policy columns (store.policy_of)


class Authenticator:
    """Turns a token into an Identity. Runs on the IOLoop; slow work goes to executors."""

    def __init__(self, db: Database, admin_token: str, crypto_workers: int | None = None) -> None:
        self._db = db
        self._admin_digest = material.token_digest(admin_token)
        # Leave a core to the IOLoop: with every core busy deriving, the loop waits for the
        # scheduler and /healthz p99 doubles (docs/performance.md).
        workers = crypto_workers or max(1, min(2, len(os.sched_getaffinity(0)) - 1))
        self._crypto = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="scrypt", initializer=_lower_thread_priority
        )
        # Verifications in flight, shared by concurrent first requests with one secret. Keyed
        # with the mutation generation, so a request arriving after a key changed never joins
        # a verification that started before.
        self._inflight: dict[tuple[bytes, int], asyncio.Future[tuple[Identity, int]]] = {}
        self._generation = 0
        self._cache: OrderedDict[bytes, _Verified] = OrderedDict()
        self._epochs: dict[str, int] = {}
        self._used: dict[str, int] = {}  # key id → newest last_used_at not yet written
        self._gates: dict[str, _Gate] = {}  # key prefix → its derivations
        self._admitted = 0  # sum of the gates' `admitted`
        self._busy_logged_at = -BUSY_LOG_EVERY_S
        self.failures = AuthFailures()

    async def authenticate(self, token: str) -> Identity:
        """Raise Unauthenticated unless `token` is the admin token or a valid, enabled key;
        `AuthBusy` when its first verification cannot be queued now."""
        digest = material.token_digest(token)  # one hash: the admin check and the cache's key
        if constant_time.bytes_eq(digest, self._admin_digest):
            return ADMIN_TOKEN_IDENTITY
        if len(token) != 51 or not material.SECRET_RE.fullmatch(token):
            raise Unauthenticated("unknown credential")
        hit = self._cache.get(digest)
        key_id = hit.identity.key_id if hit else None
        if hit and key_id and hit.epoch == self._epochs.get(key_id, 0):
            now = now_ms()
            expires_at = hit.identity.expires_at
            if expires_at is not None and expires_at <= now:
                del self._cache[digest]  # expired while cached: refused like a disabled key
                raise Unauthenticated("unknown credential")
            if time.monotonic() - hit.checked_at < REVALIDATE_S:
                self._cache.move_to_end(digest)
                if self._used.get(key_id, 0) < now:
                    self._used[key_id] = now
                return hit.identity
            if await self._recheck(hit):
                hit.checked_at = time.monotonic()
                return hit.identity
        self._cache.pop(digest, None)
        # Concurrent first requests with the same new key share one verification.
        slot = (digest, self._generation)
        future = self._inflight.get(slot)
        if future is None:
            future = asyncio.ensure_future(self._verify(token, digest))
            self._inflight[slot] = future
            future.add_done_callback(lambda done: self._settled(slot, done))
        identity, epoch = await asyncio.shield(future)
        assert identity.key_id is not None
        if epoch != self._epochs.get(identity.key_id, 0):
            # The key changed (disabled, deleted, edited) after scrypt: an identity handed out now
            # would slip past the revocation that `forget` started (docs/auth.md).
            raise Unauthenticated("unknown credential")
        return identity

    def _settled(self, slot: tuple[bytes, int], future: asyncio.Future[tuple[Identity, int]]) -> None:
        self._inflight.pop(slot, None)
        if not future.cancelled():
            future.exception()  # retrieved here: every waiter may have gone away

    async def _recheck(self, hit: _Verified) -> bool:
        """Cheap revalidation of a cached key against SQLite (no scrypt)."""
        key_id = hit.identity.key_id
        assert key_id is not None
        epoch = self._epochs.get(key_id, 0)
        ok = await self._db.query(store.confirm, key_id, hit.hash_hex, hit.scopes_json, hit.policy, now_ms())
        return ok and epoch == self._epochs.get(key_id, 0)

    async def _verify(self, token: str, digest: bytes) -> tuple[Identity, int]:
        """The identity and the key's epoch when its scrypt began (the caller re-checks it)."""
        prefix = token[: material.PREFIX_LEN]
        rows = await self._db.query(store.rows_with_prefix, prefix)
        candidates: list[tuple[material.KeyRecord, dict[str, Any]]] = []
        for row in rows:
            try:
                record = material.parse_row(row)
            except CorruptRecord as exc:
                log.warning("refusing a corrupt api key record: %s", exc.message)
                continue
            if record.enabled and not record.expired():  # an expired key costs no scrypt either
                candidates.append((record, row))
        if not candidates:
            raise Unauthenticated("unknown credential")  # no scrypt: nothing to compare with
        loop = asyncio.get_running_loop()
        async with self._scrypt_turn(prefix):
            for record, row in candidates:
                epoch = self._epochs.get(record.id, 0)
                if not await loop.run_in_executor(
                    self._crypto, material.matches, token, record.salt, record.hash
                ):
                    continue
                scopes_json, policy = row["scopes"], store.policy_of(row)
                if not await self._db.query(
                    store.confirm, record.id, row["hash"], scopes_json, policy, now_ms()
                ):
                    raise Unauthenticated("unknown credential")  # disabled/deleted/changed meanwhile
                identity = Identity(
                    kind="api_key",
                    key_id=record.id,
                    scopes=frozenset(record.scopes),
                    expires_at=record.expires_at,
                    policy=record.policy(),
                )
                if epoch == self._epochs.get(record.id, 0):
                    self._remember(
                        digest,
                        _Verified(identity, epoch, time.monotonic(), row["hash"], scopes_json, policy),
                    )
                return identity, epoch
        raise Unauthenticated("unknown credential")

    @contextlib.asynccontextmanager
    async def _scrypt_turn(self, prefix: str) -> AsyncIterator[None]:
        """Wait for this prefix's turn to derive, or raise `AuthBusy` at once when the prefix
        already has `PREFIX_WAITING_MAX` waiting or `PENDING_MAX` are admitted in all."""
        gate = self._gates.get(prefix)
        if gate is not None and gate.admitted > PREFIX_WAITING_MAX:
            raise AuthBusy(
                "too many first verifications are waiting for this key; try again shortly",
                retry_after_s=RETRY_AFTER_S,
            )
        if self._admitted >= PENDING_MAX:
            now = time.monotonic()
            if now - self._busy_logged_at >= BUSY_LOG_EVERY_S:  # one line per period, not per refusal
                self._busy_logged_at = now
                log.warning("api key verification: %d admitted, refusing more", self._admitted)
            raise AuthBusy(
                "too many key verifications are waiting; try again shortly", retry_after_s=RETRY_AFTER_S
            )
        if gate is None:
            gate = self._gates[prefix] = _Gate()
        gate.admitted += 1
        self._admitted += 1
        try:
            async with gate.lock:
                yield
        finally:
            gate.admitted -= 1
            self._admitted -= 1
            if not gate.admitted:
                del self._gates[prefix]

    async def derive(self, secret: str, salt: bytes) -> bytes:
        """scrypt for a new key, in the crypto executor."""
        return await asyncio.get_running_loop().run_in_executor(self._crypto, material.derive, secret, salt)

    def _remember(self, digest: bytes, entry: _Verified) -> None:
        self._cache[digest] = entry
        while len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)

    def forget(self, key_id: str) -> None:
        """Call before writing any change to a key: the next request re-reads SQLite."""
        self._epochs[key_id] = self._epochs.get(key_id, 0) + 1
        self._generation += 1
        for digest in [d for d, v in self._cache.items() if v.identity.key_id == key_id]:
            del self._cache[digest]

    def pending_last_used(self, key_id: str) -> int | None:
        return self._used.get(key_id)

    async def flush_last_used(self) -> None:
        """Write coalesced `last_used_at` values (never backwards). Runs on the IOLoop."""
        if not self._used:
            return
        pending, self._used = self._used, {}
        await self._db.query(store.write_last_used, pending)

    def flush_last_used_sync(self) -> None:
        pending, self._used = self._used, {}
        if pending:
            self._db.query_sync(store.write_last_used, pending)

    def close(self) -> None:
        self._crypto.shutdown(wait=False, cancel_futures=True)


def _lower_thread_priority() -> None:
    """Runs in each scrypt thread: on Linux this lowers the calling thread only, not the loop."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 10)
    except (AttributeError, OSError):
        pass

"""The `/v1` requests in flight, by API key id, so that revoking a key cuts them off.

`api_keys.disable` and `api_keys.delete` refuse the key's next request (`Authenticator.forget`),
but a request that authenticated before is already past that check: a streaming response, an
attached generation or a `/v1/stream` replay could go on for minutes. So `GatewaySurface`
registers each request here right after authenticating it, and `revoke(key_id)` closes every
connection still open for that key (tornado then runs the handler's `on_finish`, which removes
the entry; `docs/gateway.md`).

Runs on the IOLoop; no tornado import: an entry is two callables, how to close the connection and
whether it is closed already. An entry whose handler never finished (a client that left while
sending its body, so tornado never called the verb method) is pruned when its key registers
another request or is revoked, so entries per key stay bounded by that key's open connections.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Entry:
    close: Callable[[], None]
    closed: Callable[[], bool]


class LiveRequests:
    """key id → its open `/v1` requests. Runs on the IOLoop."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[int, _Entry]] = {}
        self._tokens = itertools.count(1)

    def add(self, key_id: str, close: Callable[[], None], closed: Callable[[], bool]) -> int:
        """Register one request; returns the token `remove` takes."""
        entries = self._by_key.setdefault(key_id, {})
        self._prune(entries)
        token = next(self._tokens)
        entries[token] = _Entry(close, closed)
        return token

    def remove(self, key_id: str, token: int) -> None:
        """The request finished (idempotent)."""
        entries = self._by_key.get(key_id)
        if entries is not None:
            entries.pop(token, None)
            if not entries:
                del self._by_key[key_id]

    def count(self, key_id: str | None = None) -> int:
        """Open requests of one key, or of all keys."""
        if key_id is not None:
            return len(self._by_key.get(key_id, {}))
        return sum(len(entries) for entries in self._by_key.values())

    def revoke(self, key_id: str) -> int:
        """Close every open connection of `key_id`; returns how many were open."""
        entries = self._by_key.pop(key_id, {})
        closed = 0
        for entry in entries.values():
            if entry.closed():
                continue
            try:
                entry.close()
                closed += 1
            except Exception:
                # The others must still be closed; the traceback is for us.
                log.exception("could not close a /v1 connection of key %s", key_id)
        if closed:
            log.info("closed %d open /v1 connection(s) of revoked key %s", closed, key_id)
        return closed

    @staticmethod
    def _prune(entries: dict[int, _Entry]) -> None:
        for token in [t for t, e in entries.items() if e.closed()]:
            del entries[token]

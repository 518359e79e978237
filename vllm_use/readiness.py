"""Is this vllm-use ready to serve? The answer `/readyz` gives (docs/observability.md, "Probes").

Ready means all of:

- not shutting down;
- SQLite takes a write: `BEGIN IMMEDIATE; ROLLBACK` on the DB thread, waiting at most
  `BUSY_MS` for another writer's lock (a bounded `busy_timeout` for this check only);
- start-up recovery is done: it runs before the port is opened (vllm_use/app.py), so a process
  that answers has recovered; nothing to check at request time;
- every deployment saved with `load_on_start` has been ready since vllm-use started, and is not
  `starting` or `failed` now. Sleeping, waking, stopping or unloaded later (an idle action, an
  eviction, an operator) still counts: a `/v1` request brings it back.

A probe is answered from memory except the database check, which is shared: at most one is on the
DB thread at a time (later probes await the one in flight) and its result is kept for `CACHE_S`,
so a flood of probes queues at most one SQLite write per second, never one per probe. A probe waits
at most `WAIT_S` for it (a DB thread busy with other work is itself a reason).

Reasons name a deployment or "database", never a path or a secret. The database's reason is logged
once when the check starts failing (the SQLite error itself at debug).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import TYPE_CHECKING

from vllm_use.deployments.instances import InstanceState
from vllm_use.runtime.supervisor import RuntimeState
from vllm_use.storage import PRAGMAS, Database

if TYPE_CHECKING:
    from vllm_use.context import AppContext

log = logging.getLogger(__name__)

BUSY_MS = 250  # how long the write check waits for another writer's lock
CACHE_S = 1.0  # a database check's result is reused this long
WAIT_S = 1.0  # how long a probe waits for the DB thread to run the check
_NOT_NOW = (InstanceState.STARTING, InstanceState.FAILED)
_BUSY_DEFAULT = dict(PRAGMAS)["busy_timeout"]


def write_check(db: Database) -> str | None:
    """Runs on the DB thread: None when SQLite takes a write, else a reason (no path in it)."""
    connection = db.connection()
    connection.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        busy = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
        log.debug("readiness: the database write check failed: %s", exc)
        return "database: locked by another writer" if busy else "database: not writable"
    finally:
        connection.execute(f"PRAGMA busy_timeout = {_BUSY_DEFAULT}")


class Readiness:
    """The `/readyz` answer. Build it before the start-up loads begin (it watches the deployments
    from then on); `reasons()` runs on the IOLoop."""

    def __init__(self, app: AppContext) -> None:
        self.app = app
        self._reached: set[str] = set()  # deployments ready at least once since start
        self._check: asyncio.Future[str | None] | None = None  # the database check in flight
        self._checked_at = -CACHE_S  # time.monotonic() of the last result
        self._last: str | None = None
        app.instances.subscribe(self._on_change)

    def _on_change(self, name: str) -> None:
        # Called on every change of a deployment, a /v1 request's start and end included (the
        # gateway's hot path): a set lookup and a dict lookup, nothing built.
        instances = self.app.instances
        if name in self._reached:
            if instances.names.get(name) != name:  # deleted: a new one of that name starts over
                self._reached.discard(name)
            return
        supervisor = instances.supervisor(name)
        if supervisor is not None and supervisor.state is RuntimeState.READY:
            self._reached.add(name)

    async def reasons(self) -> list[str]:
        """What is not ready, in a stable order; empty when ready."""
        if self.app.stopping.is_set():
            return ["shutting down"]
        found = self._deployments()
        database = await self._database()
        return ([database] if database else []) + found

    def _deployments(self) -> list[str]:
        instances, found = self.app.instances, []
        for name in instances.saved_names():
            view = instances.view(name)
            if view is None or not view["load_on_start"]:
                continue
            state = view["instance"]["state"]
            if state in _NOT_NOW:
                found.append(f"deployment {name}: {state}")
            elif name not in self._reached:
                found.append(f"deployment {name}: not ready since start ({state})")
        return found

    async def _database(self) -> str | None:
        if time.monotonic() - self._checked_at < CACHE_S:
            return self._last
        if self._check is None:
            self._check = asyncio.ensure_future(self.app.db.query(write_check))
            self._check.add_done_callback(self._settled)
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), WAIT_S)
        except TimeoutError:
            return "database: no answer from the database thread"
        except Exception:  # logged by _settled
            return "database: check failed"

    def _settled(self, check: asyncio.Future[str | None]) -> None:
        self._check = None
        self._checked_at = time.monotonic()
        failed = check.cancelled() or check.exception() is not None
        if failed and not check.cancelled():
            log.error("readiness: the database check raised", exc_info=check.exception())
        result = "database: check failed" if failed else check.result()
        if result and not self._last:
            log.warning("not ready: %s", result)
        self._last = result

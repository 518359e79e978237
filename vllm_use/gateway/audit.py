"""Gateway audit (docs/gateway.md, "Audit"): one record per authenticated `/v1` request, written off the
hot path.

Records are queued in memory and written every `FLUSH_S` in one transaction that
also evicts the oldest beyond `--max-audit-records` (0: record nothing new,
delete nothing). `flush_sync` runs at shutdown. Prompts and outputs are never
recorded: method, path, the model as sent (truncated on a UTF-8 boundary), the
key id, status, duration, stream flag and time.

Only requests whose key was recognised are recorded: refused credentials are
counted in memory (`vllm_use.auth.AuthFailures`), because a record per refusal
let anyone evict every real record with a burst of bad requests. Every field is
bounded here to what `requests.recent` accepts on read (method ≤ `METHOD_MAX`,
path ≤ `PATH_MAX`, model ≤ `MODEL_MAX_BYTES`), so nothing we write reads back
as corrupt.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from tornado.ioloop import PeriodicCallback

from vllm_use.clock import now_ms
from vllm_use.logbuffer import cut_utf8
from vllm_use.storage import AuditRecord, Database

log = logging.getLogger(__name__)

FLUSH_S = 0.5
MODEL_MAX_BYTES = 1024
METHOD_MAX = 16  # characters; tornado accepts any token as a method
PATH_MAX = 2048
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")


def request_id_or(value: str | None, audit_id: str) -> str:
    """The client's X-Request-ID if it is ≤ 128 bytes of visible ASCII, else the audit id."""
    return value if value is not None and _REQUEST_ID.fullmatch(value) else audit_id


def new_audit_id() -> str:
    return "au_" + secrets.token_hex(12)


class AuditWriter:
    def __init__(self, db: Database, max_records: int) -> None:
        self.db = db
        self.max_records = max_records
        self._pending: list[tuple[Any, ...]] = []  # rows in _INSERT's column order
        self._timer: PeriodicCallback | None = None
        self.failed = False

    def start(self) -> None:
        self._timer = PeriodicCallback(self.flush, FLUSH_S * 1000)
        self._timer.start()

    def record(
        self,
        *,
        audit_id: str,
        request_id: str,
        key_id: str | None,
        method: str,
        path: str,
        model: str | None,
        status: int,
        duration_ms: float,
        stream: bool,
    ) -> None:
        """Queue one record, each field cut to its bound. Runs on the IOLoop, costs a tuple and an
        append."""
        if self.max_records == 0:
            return
        if model is not None:
            model = cut_utf8(model.encode("utf-8", "replace"), MODEL_MAX_BYTES).decode("utf-8", "ignore")
        self._pending.append(
            (
                audit_id,
                request_id,
                key_id,
                method[:METHOD_MAX] or "-",
                path[:PATH_MAX] or "/",
                model,
                status,
                round(duration_ms, 3),
                int(stream),
                now_ms(),
            )
        )

    async def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            await self.db.run(_write, batch, self.max_records)
        except Exception:
            log.exception("could not write %d audit record(s)", len(batch))
            self.failed = True

    def flush_sync(self) -> bool:
        """At shutdown, after the loop's work is done. False if records could not be written."""
        if self._timer is not None:
            self._timer.stop()
        batch, self._pending = self._pending, []
        if batch:
            try:
                self.db.run_sync(_write, batch, self.max_records)
            except Exception:
                log.exception("could not write %d audit record(s) at shutdown", len(batch))
                return False
        return not self.failed


# The columns in the order `record` queues them.
_INSERT = (
    "INSERT INTO audit_records (audit_id, request_id, key_id, method, path, model, status,"
    " duration_ms, stream, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _write(batch: list[tuple[Any, ...]], max_records: int) -> None:
    """Runs on the DB thread: insert the batch and evict the oldest beyond the cap, one transaction.

    `executemany` on the sqlite3 cursor binds the rows in C: building the INSERT with peewee cost
    ~20 µs of Python per row, and that thread holding the GIL is time the event loop waits.
    """
    db = AuditRecord._meta.database
    with db.atomic():
        db.cursor().executemany(_INSERT, batch)
        db.execute_sql(
            "DELETE FROM audit_records WHERE rowid IN (SELECT rowid FROM audit_records "
            "ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
            (max_records,),
        )

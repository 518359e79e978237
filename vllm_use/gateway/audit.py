"""Gateway audit (docs/gateway.md, "Audit"): one record per authenticated `/v1` request, written off the
hot path.

Records are queued in memory and written every `FLUSH_S` in one transaction that
also evicts the oldest beyond `--max-audit-records` (0: record nothing new,
delete nothing) and adds the batch's `/v1` requests and tokens to the daily
rollups (vllm_use/usage/store.py), which are written with or without audit
records and outlive them (docs/observability.md, "Token accounting").
`flush_sync` runs at shutdown. Prompts and outputs are never recorded: method,
path, the model as sent (truncated on a UTF-8 boundary), the key id, status,
duration, stream flag, time, the deployment that served it and the token counts
of the answer's usage (NULL: not known).

Only requests whose key was recognised are recorded: refused credentials are
counted in memory (`vllm_use.keys.authenticator.AuthFailures`), because a record per refusal
let anyone evict every real record with a burst of bad requests. Every field is
bounded here to what `requests.recent` accepts on read (method ≤ `METHOD_MAX`,
path ≤ `PATH_MAX`, model ≤ `MODEL_MAX_BYTES`), so nothing we write reads back
as corrupt.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tornado.ioloop import PeriodicCallback

from vllm_use.clock import iso, now_ms
from vllm_use.logbuffer import cut_utf8
from vllm_use.storage import AuditTable, Database
from vllm_use.usage import store
from vllm_use.usage.ledger import utc_day
from vllm_use.usage.tap import COUNT_MAX

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
        # (day, key id, deployment or "") → [requests, prompt tokens, completion tokens]
        self._rollups: dict[tuple[str, str, str], list[int]] = {}
        self._timer: PeriodicCallback | None = None
        self.failed = False
        # Rows in audit_records after the last write (None: not counted yet, done at the first):
        # the eviction deletes only the excess, without walking the kept rows (`write`).
        self._stored: int | None = None

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
        deployment: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        """Queue one record, each field cut to its bound, and add a `/v1` request to its rollup.
        Runs on the IOLoop, costs a tuple, an append and a dict update."""
        created = now_ms()
        if key_id is not None and path.startswith("/v1/"):
            tally = self._rollups.setdefault((utc_day(created), key_id, deployment or ""), [0, 0, 0])
            tally[0] += 1
            tally[1] += prompt_tokens or 0
            tally[2] += completion_tokens or 0
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
                created,
                deployment,
                prompt_tokens,
                completion_tokens,
            )
        )

    def _take(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        batch, self._pending = self._pending, []
        rollups = [(*group, *tally) for group, tally in self._rollups.items()]
        self._rollups = {}
        return batch, rollups

    async def flush(self) -> None:
        if not self._pending and not self._rollups:
            return
        batch, rollups = self._take()
        try:
            self._stored = await self.db.query(write, batch, self.max_records, rollups, self._stored)
        except Exception:
            log.exception("could not write %d audit record(s)", len(batch))
            self.failed = True

    def flush_sync(self) -> bool:
        """At shutdown, after the loop's work is done. False if records could not be written."""
        if self._timer is not None:
            self._timer.stop()
        batch, rollups = self._take()
        if batch or rollups:
            try:
                self._stored = self.db.query_sync(write, batch, self.max_records, rollups, self._stored)
            except Exception:
                log.exception("could not write %d audit record(s) at shutdown", len(batch))
                return False
        return not self.failed


# The columns in the order `record` queues them.
_INSERT = (
    "INSERT INTO audit_records (audit_id, request_id, key_id, method, path, model, status,"
    " duration_ms, stream, created_at, deployment, prompt_tokens, completion_tokens)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def write(
    db: Database,
    batch: list[tuple[Any, ...]],
    max_records: int,
    rollups: Sequence[tuple[Any, ...]] = (),
    stored: int | None = None,
) -> int | None:
    """Runs on the DB thread: insert the batch, evict the oldest beyond the cap and add `rollups`
    (`store.add_rollups`), one transaction. Returns the rows now stored.

    `stored` is what the last call returned (None: counted here, once): the eviction deletes the
    `stored - max_records` oldest rows through the created_at index, so a flush costs what it adds,
    not what the table keeps (skipping the newest `max_records` with OFFSET walked them all, every
    flush: 21 ms at a million records). Only this writer deletes audit records.

    `executemany` on the sqlite3 connection binds the rows in C: building the INSERT with peewee cost
    ~20 µs of Python per row, and that thread holding the GIL is time the event loop waits.
    """
    with db.atomic():
        if batch:
            if stored is None:
                stored = db.execute("SELECT count(*) FROM audit_records").fetchone()[0]
            db.connection().executemany(_INSERT, batch)
            stored += len(batch)
            if stored > max_records:
                evicted = db.execute(
                    "DELETE FROM audit_records WHERE rowid IN (SELECT rowid FROM audit_records "
                    "ORDER BY created_at, rowid LIMIT ?)",
                    (stored - max_records,),
                )
                stored -= evicted.rowcount
        store.add_rollups(db, rollups)
    return stored


def count(db: Database) -> int:
    return AuditTable.select().count(db.peewee_db)


# --- reading back (`requests.recent`): every row is untrusted -----------------------------------

_VISIBLE = re.compile(r"[\x21-\x7e]{1,128}")
_KEY_ID = re.compile(r"[A-Za-z0-9]{24}")
_LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last time `iso` can write


class _Undecodable:
    """A TEXT value that is not UTF-8: its field reads as corrupt, never fails the page."""


def read_newest(
    db: Database, limit: int, where: AuditFilter | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The newest `limit` rows that pass `where`: (valid records, corrupt rows). Runs on the DB thread.

    Each record carries its key's name (`key_name`, joined from `api_keys`; None when there was no
    key or the key is gone) and `key_deleted` (a key id whose key no longer exists). The filter is
    SQL on the stored columns, so a corrupt row that matches it is reported like any other.

    Text is fetched as bytes and decoded here: sqlite3 raises on a TEXT value that is not UTF-8
    while it builds the row, which would fail the whole page for one bad row.
    """
    where = where or AuditFilter()
    lo, hi = where.status or (None, None)
    connection = db.connection()
    previous = connection.text_factory
    connection.text_factory = bytes  # this thread only runs one query at a time
    try:
        fetched = db.execute(
            _READ,
            (where.key_id, where.model, lo, hi, where.since_ms, where.until_ms, limit),
        ).fetchall()
    finally:
        connection.text_factory = previous
    records: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    for rowid, *raw in fetched:
        *fields, key_exists, key_name = (_decoded(value) for value in raw)
        row = tuple(fields)
        problem = _problem(row)
        if problem is None:
            record = _record(row)
            record["key_deleted"] = record["key_id"] is not None and not key_exists
            record["key_name"] = key_name if key_exists and isinstance(key_name, str) else None
            records.append(record)
        else:
            audit_id = row[0] if isinstance(row[0], str) and _VISIBLE.fullmatch(row[0]) else None
            corrupt.append({"rowid": rowid, "audit_id": audit_id, "problem": problem})
    return records, corrupt


# One statement for every filter: a part left out (NULL) matches every row.
_READ = (
    "SELECT a.rowid, a.audit_id, a.request_id, a.key_id, a.method, a.path, a.model, a.status,"
    " a.duration_ms, a.stream, a.created_at, a.deployment, a.prompt_tokens, a.completion_tokens,"
    " k.id IS NOT NULL, k.name"
    " FROM audit_records AS a LEFT JOIN api_keys AS k ON k.id = a.key_id"
    " WHERE (?1 IS NULL OR a.key_id = ?1) AND (?2 IS NULL OR instr(a.model, ?2) > 0)"
    " AND (?3 IS NULL OR a.status BETWEEN ?3 AND ?4)"
    " AND (?5 IS NULL OR a.created_at >= ?5) AND (?6 IS NULL OR a.created_at <= ?6)"
    " ORDER BY a.created_at DESC, a.rowid DESC LIMIT ?7"
)


@dataclass(frozen=True)
class AuditFilter:
    """What `requests.recent` narrows to; every part optional, all given parts must hold.

    `model` matches a part of the model as sent (case-sensitive); `status` is an inclusive range
    (one code: lo == hi; a class such as 4xx: 400–499); `since_ms`/`until_ms` bound `created_at`
    inclusively (unix ms)."""

    key_id: str | None = None
    model: str | None = None
    status: tuple[int, int] | None = None
    since_ms: int | None = None
    until_ms: int | None = None


def _decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return _Undecodable()
    return value


def _text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _problem(row: tuple[Any, ...]) -> str | None:
    """What is wrong with a row, naming the first bad field (never its value); None if valid."""
    audit_id, request_id, key_id, method, path, model, status, duration, stream, created, *usage = row
    deployment, prompt_tokens, completion_tokens = usage
    checks = (
        ("audit_id", isinstance(audit_id, str) and _VISIBLE.fullmatch(audit_id)),
        ("request_id", isinstance(request_id, str) and _VISIBLE.fullmatch(request_id)),
        ("key_id", key_id is None or (isinstance(key_id, str) and _KEY_ID.fullmatch(key_id))),
        ("method", _text(method, METHOD_MAX)),
        ("path", _text(path, PATH_MAX)),
        ("model", model is None or (isinstance(model, str) and len(model) <= MODEL_MAX_BYTES)),
        ("status", type(status) is int and 100 <= status <= 599),
        ("duration_ms", isinstance(duration, int | float) and 0 <= duration < math.inf),
        ("stream", type(stream) is int and stream in (0, 1)),
        ("created_at", type(created) is int and 0 < created <= _LAST_MS),
        ("deployment", deployment is None or _text(deployment, MODEL_MAX_BYTES)),
        ("prompt_tokens", _tokens(prompt_tokens)),
        ("completion_tokens", _tokens(completion_tokens)),
    )
    for name, ok in checks:
        if not ok:
            return f"{name} is missing, of the wrong type, out of bounds or not UTF-8"
    return None


def _tokens(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value <= COUNT_MAX)


def _record(row: tuple[Any, ...]) -> dict[str, Any]:
    audit_id, request_id, key_id, method, path, model, status, duration, stream, created, *usage = row
    deployment, prompt_tokens, completion_tokens = usage
    return {
        "audit_id": audit_id,
        "request_id": request_id,
        "key_id": key_id,
        "method": method,
        "path": path,
        "model": model,
        "status": status,
        "duration_ms": float(duration),
        "stream": bool(stream),
        "created_at": iso(created),
        "deployment": deployment,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }

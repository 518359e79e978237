"""`requests.recent` (docs/gateway.md, "Audit"): the gateway's audit records, newest first, validated on read.

One bad row never fails a page: a row that fails validation (edited by hand, written by an older
version) is left out of `requests` and reported in `corrupt` with its problem, never silently
dropped and never shown as a record. The answer also carries `auth_failures`, the refused
credentials counted in memory since start (they are not audit records: docs/gateway.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

from vllm_use.clock import iso
from vllm_use.context import Call
from vllm_use.gateway.audit import METHOD_MAX, MODEL_MAX_BYTES, PATH_MAX
from vllm_use.registry import Args, Registry, Result
from vllm_use.scopes import READ
from vllm_use.storage import AuditRecord

_VISIBLE = re.compile(r"[\x21-\x7e]{1,128}")
_KEY_ID = re.compile(r"[A-Za-z0-9]{24}")
_LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last time `iso` can write


class RecentArgs(Args):
    limit: int = Field(default=50, ge=1, le=1000)


class AuditOut(Result):
    audit_id: str
    request_id: str
    key_id: str | None
    method: str
    path: str
    model: str | None
    status: int
    duration_ms: float
    stream: bool
    created_at: str


class CorruptAudit(BaseModel):
    """A row left out of `requests`: where it is (`rowid` in audit_records) and what is wrong."""

    rowid: int
    audit_id: str | None = Field(description="null when the id itself is malformed")
    problem: str


class AuthFailureCounts(BaseModel):
    """Refused credentials since the server started (in memory, not audit records)."""

    total: int
    by_surface: dict[str, int]
    last_at: str | None


class RecentList(Result):
    requests: list[AuditOut]
    corrupt: list[CorruptAudit]
    auth_failures: AuthFailureCounts


class _Undecodable:
    """A TEXT value that is not UTF-8: its field reads as corrupt, never fails the page."""


def _read(limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The newest `limit` rows: (valid records, corrupt rows). Runs on the DB thread.

    Text is fetched as bytes and decoded here: sqlite3 raises on a TEXT value that is not UTF-8
    while it builds the row, which would fail the whole page for one bad row.
    """
    db = AuditRecord._meta.database
    connection = db.connection()
    previous = connection.text_factory
    connection.text_factory = bytes  # this thread only runs one query at a time
    try:
        fetched = db.execute_sql(
            "SELECT rowid, audit_id, request_id, key_id, method, path, model, status, duration_ms,"
            " stream, created_at FROM audit_records ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (limit,),
        ).fetchall()
    finally:
        connection.text_factory = previous
    records: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    for rowid, *raw in fetched:
        row = tuple(_decoded(value) for value in raw)
        problem = _problem(row)
        if problem is None:
            records.append(_record(tuple(row)))
        else:
            audit_id = row[0] if isinstance(row[0], str) and _VISIBLE.fullmatch(row[0]) else None
            corrupt.append({"rowid": rowid, "audit_id": audit_id, "problem": problem})
    return records, corrupt


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
    audit_id, request_id, key_id, method, path, model, status, duration, stream, created = row
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
    )
    for name, ok in checks:
        if not ok:
            return f"{name} is missing, of the wrong type, out of bounds or not UTF-8"
    return None


def _record(row: tuple[Any, ...]) -> dict[str, Any]:
    audit_id, request_id, key_id, method, path, model, status, duration, stream, created = row
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
    }


def register(registry: Registry) -> None:
    @registry.method(
        "requests.recent",
        "Recent gateway (/v1) requests with a recognised key, newest first: status, latency, model, "
        "key id; never prompts or outputs. Rows that fail validation are listed in `corrupt`; "
        "refused credentials (on /api, /mcp and /v1) are counted in `auth_failures`.",
        RecentArgs,
        RecentList,
        READ,
    )
    async def recent(call: Call, args: RecentArgs) -> dict[str, Any]:
        records, corrupt = await call.app.db.run(_read, args.limit)
        failures = call.app.auth.failures.snapshot()
        return {
            "requests": records,
            "corrupt": corrupt,
            "auth_failures": {**failures, "last_at": iso(failures["last_at"])},
        }

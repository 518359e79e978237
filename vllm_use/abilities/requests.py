"""`requests.recent` (S4.6, S5.3): the gateway's audit records, newest first, validated on read."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from vllm_use.context import Call
from vllm_use.errors import CorruptRecord
from vllm_use.keys import iso
from vllm_use.registry import Args, Registry, Result
from vllm_use.scopes import READ
from vllm_use.storage import AuditRecord

_VISIBLE = re.compile(r"[\x21-\x7e]{1,128}")


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


class RecentList(Result):
    requests: list[AuditOut]


def _read(limit: int) -> list[dict[str, Any]]:
    db = AuditRecord._meta.database
    cursor = db.execute_sql(
        "SELECT audit_id, request_id, key_id, method, path, model, status, duration_ms, stream, created_at "
        "FROM audit_records ORDER BY created_at DESC, rowid DESC LIMIT ?",
        (limit,),
    )
    return [_validated(row) for row in cursor.fetchall()]


def _validated(row: tuple[Any, ...]) -> dict[str, Any]:
    audit_id, request_id, key_id, method, path, model, status, duration, stream, created = row

    def text(value: Any, limit: int) -> bool:
        return isinstance(value, str) and 0 < len(value) <= limit

    ok = (
        isinstance(audit_id, str)
        and _VISIBLE.fullmatch(audit_id)
        and isinstance(request_id, str)
        and _VISIBLE.fullmatch(request_id)
        and (key_id is None or (isinstance(key_id, str) and re.fullmatch(r"[A-Za-z0-9]{24}", key_id)))
        and text(method, 16)
        and text(path, 2048)
        and (model is None or (isinstance(model, str) and len(model) <= 1024))
        and type(status) is int
        and 100 <= status <= 599
        and isinstance(duration, int | float)
        and duration >= 0
        and stream in (0, 1)
        and type(created) is int
        and created > 0
    )
    if not ok:
        label = audit_id if isinstance(audit_id, str) and _VISIBLE.fullmatch(audit_id) else "<malformed id>"
        raise CorruptRecord(f"audit record {label} is corrupt", record=label)
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
        "Recent gateway (/v1) requests, newest first: status, latency, model, key id. "
        "Never prompts or outputs.",
        RecentArgs,
        RecentList,
        READ,
    )
    async def recent(call: Call, args: RecentArgs) -> dict[str, Any]:
        return {"requests": await call.app.db.run(_read, args.limit)}

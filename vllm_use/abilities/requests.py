"""`requests.recent` (docs/gateway.md, "Audit"): the gateway's audit records, newest first, validated on read.

One bad row never fails a page: a row that fails validation (edited by hand, written by an older
version) is left out of `requests` and reported in `corrupt` with its problem, never silently
dropped and never shown as a record. The answer also carries `auth_failures`, the refused
credentials counted in memory since start (they are not audit records: docs/gateway.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from vllm_use.clock import iso
from vllm_use.context import Call
from vllm_use.gateway import audit
from vllm_use.registry import Args, Registry, Result
from vllm_use.scopes import READ


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


async def recent(call: Call, args: RecentArgs) -> dict[str, Any]:
    records, corrupt = await call.app.db.query(audit.read_newest, args.limit)
    failures = call.app.auth.failures.snapshot()
    return {
        "requests": records,
        "corrupt": corrupt,
        "auth_failures": {**failures, "last_at": iso(failures["last_at"])},
    }


def register(registry: Registry) -> None:
    registry.method(
        "requests.recent",
        "Recent gateway (/v1) requests with a recognised key, newest first: status, latency, model, "
        "key id; never prompts or outputs. Rows that fail validation are listed in `corrupt`; "
        "refused credentials (on /api, /mcp and /v1) are counted in `auth_failures`.",
        RecentArgs,
        RecentList,
        READ,
    )(recent)

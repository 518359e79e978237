"""`requests.recent` (docs/gateway.md, "Audit"): the gateway's audit records, newest first, validated on read.

Filters (all optional, all must hold, applied in SQL before `limit`): `key_id` (a key id; one
that no key has any more still finds its records, an id nobody ever had finds none), `model`
(a part of the model as sent), `status` (a code such as 404 or a class such as 4xx) and the time
range `since`/`until` (ISO 8601 with a time zone, inclusive). Bad input is a 400 naming the field.

Each record names its key (`key_name`, from `api_keys`) for a caller that may list keys (on /mcp
that is `mcp.admin`, as for `api_keys.list`); others get the id only. `key_deleted` marks a
record whose key has since been deleted.

One bad row never fails a page: a row that fails validation (edited by hand, written by an older
version) is left out of `requests` and reported in `corrupt` with its problem, never silently
dropped and never shown as a record. The answer also carries `auth_failures`, the refused
credentials counted in memory since start (they are not audit records: docs/gateway.md).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StringConstraints, ValidationInfo, field_validator

from vllm_use.clock import iso
from vllm_use.clock import parse_aware as _parse_time
from vllm_use.context import Call
from vllm_use.fields import NO_CONTROL, KeyId
from vllm_use.gateway import audit
from vllm_use.registry import Args, Registry, Result
from vllm_use.scopes import KEYS_READ, READ

STATUS = r"^([1-5]xx|[1-5][0-9]{2})$"
Time = Annotated[
    str,
    StringConstraints(max_length=64),
    Field(description="ISO 8601 date and time with a time zone, e.g. 2026-12-02T08:00:00Z"),
]


class RecentArgs(Args):
    limit: int = Field(default=50, ge=1, le=1000)
    key_id: Annotated[KeyId, Field(description="an API key id: 24 letters and digits")] | None = None
    model: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=audit.MODEL_MAX_BYTES, pattern=NO_CONTROL),
            Field(description="a part of the model name as sent (case-sensitive), no control characters"),
        ]
        | None
    ) = None
    status: (
        Annotated[
            str, StringConstraints(pattern=STATUS), Field(description="a status code (404) or class (4xx)")
        ]
        | None
    ) = None
    since: Time | None = None
    until: Time | None = None

    @field_validator("since", "until")
    @classmethod
    def _aware_time(cls, value: str | None) -> str | None:
        if value is not None:
            _parse_time(value)
        return value

    @field_validator("until")
    @classmethod
    def _after_since(cls, value: str | None, info: ValidationInfo) -> str | None:
        since = info.data.get("since")
        if value is not None and since is not None and _parse_time(value) < _parse_time(since):
            raise ValueError("is before since")
        return value

    def where(self) -> audit.AuditFilter:
        status = None
        if self.status is not None:
            status = (
                (int(self.status[0]) * 100, int(self.status[0]) * 100 + 99)
                if self.status.endswith("xx")
                else (int(self.status), int(self.status))
            )
        return audit.AuditFilter(
            key_id=self.key_id,
            model=self.model,
            status=status,
            since_ms=None if self.since is None else _ms(self.since),
            until_ms=None if self.until is None else _ms(self.until),
        )


def _ms(value: str) -> int:
    return int(_parse_time(value).timestamp() * 1000)


class AuditOut(Result):
    audit_id: str
    request_id: str
    key_id: str | None
    key_name: str | None = Field(
        description="the key's name; null without a key, for a deleted key, or for a caller that may not list keys"
    )
    key_deleted: bool = Field(description="the record's key has been deleted since")
    method: str
    path: str
    model: str | None
    status: int
    duration_ms: float
    stream: bool
    created_at: str
    deployment: str | None = Field(
        description="the deployment that served it; null: none (--upstream, the runtime)"
    )
    prompt_tokens: int | None = Field(
        description="from the answer's usage; null: not known (docs/observability.md)"
    )
    completion_tokens: int | None = Field(description="from the answer's usage; null: not known")


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
    records, corrupt = await call.app.db.query(audit.read_newest, args.limit, args.where())
    if not call.identity.may_call(KEYS_READ, call.surface):
        for record in records:
            record["key_name"] = None
    failures = call.app.auth.failures.snapshot()
    return {
        "requests": records,
        "corrupt": corrupt,
        "auth_failures": {**failures, "last_at": iso(failures["last_at"])},
    }


def register(registry: Registry) -> None:
    registry.method(
        "requests.recent",
        "Recent gateway (/v1) requests and tool calls (/tools, path /tools/<tool>) with a recognised "
        "key, newest first: status, latency, model, deployment, tokens, key id and name; never prompts, arguments or outputs. Optional filters: `key_id`, `model` (a part of it), "
        "`status` (404 or 4xx), `since`/`until` (ISO 8601 with a time zone). Rows that fail validation "
        "are listed in `corrupt`; refused credentials (on /api, /mcp, /v1 and /tools) are counted in `auth_failures`.",
        RecentArgs,
        RecentList,
        READ,
    )(recent)

"""`usage.summary` (docs/observability.md, "Token accounting"): requests and tokens by day, key and
deployment, from the daily rollups (vllm_use/usage/store.py).

The range is UTC days, `since` to `until` inclusive (YYYY-MM-DD), by default the last 30 days
ending today, at most 366 days; bad dates are a 400 naming the field. Filters: `key_id` and
`deployment` ("" is the requests that named no deployment). As in `requests.recent`, a key's
name is given to a caller that may list keys (on /mcp that is `mcp.admin`); others get the id.
"""

from __future__ import annotations

import time
from datetime import date, timedelta
from typing import Annotated, Any

from pydantic import Field, field_validator

from vllm_use.context import Call
from vllm_use.errors import InvalidArguments
from vllm_use.fields import KeyId
from vllm_use.registry import Args, Registry, Result
from vllm_use.runtime.options import NAME_PATTERN
from vllm_use.scopes import KEYS_READ, READ
from vllm_use.usage import store
from vllm_use.usage.ledger import utc_day

DEFAULT_DAYS = 30
MAX_DAYS = 366
Day = Annotated[
    str,
    Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", description="a UTC date, YYYY-MM-DD"),
]


def _day(value: str | None) -> str | None:
    if value is not None:
        try:
            date.fromisoformat(value)
        except ValueError:
            raise ValueError("is not a date (YYYY-MM-DD)") from None
    return value


class SummaryArgs(Args):
    since: Day | None = Field(default=None, description="the first UTC day; default: 29 days before `until`")
    until: Day | None = Field(default=None, description="the last UTC day; default: today")
    key_id: Annotated[KeyId, Field(description="an API key id: 24 letters and digits")] | None = None
    deployment: (
        Annotated[
            str,
            Field(
                pattern=f"({NAME_PATTERN})|^$",
                description='a deployment name; "" for the requests that named no deployment',
            ),
        ]
        | None
    ) = None

    @field_validator("since")
    @classmethod
    def _since(cls, value: str | None) -> str | None:
        return _day(value)

    @field_validator("until")
    @classmethod
    def _until(cls, value: str | None) -> str | None:
        return _day(value)

    def days(self) -> tuple[str, str]:
        """(since, until) with the defaults filled in; InvalidArguments naming the field when the
        range is backwards or longer than MAX_DAYS."""
        until = self.until or utc_day(int(time.time() * 1000))
        since = self.since or (date.fromisoformat(until) - timedelta(days=DEFAULT_DAYS - 1)).isoformat()
        span = (date.fromisoformat(until) - date.fromisoformat(since)).days + 1
        field = "until" if self.until is not None else "since"
        if span < 1:
            _refuse(field, "is before since" if field == "until" else "is after until (default: today)")
        if span > MAX_DAYS:
            _refuse(field, f"makes a range of more than {MAX_DAYS} days")
        return since, until


def _refuse(field: str, message: str) -> None:
    raise InvalidArguments(
        f"invalid arguments: {field}: {message}", errors=[{"loc": [field], "msg": message}]
    )


class Counts(Result):
    requests: int
    prompt_tokens: int
    completion_tokens: int


class DayUsage(Counts):
    day: str


class KeyUsage(Counts):
    key_id: str
    key_name: str | None = Field(description="null for a deleted key, or for a caller that may not list keys")


class DeploymentUsage(Counts):
    deployment: str = Field(description='"" for the requests that named no deployment')


class Summary(Result):
    since: str
    until: str
    totals: Counts
    days: list[DayUsage] = Field(description="every day of the range, oldest first, zeros included")
    keys: list[KeyUsage] = Field(description="most tokens first")
    deployments: list[DeploymentUsage] = Field(description="most tokens first")


async def summary(call: Call, args: SummaryArgs) -> dict[str, Any]:
    since, until = args.days()
    found = await call.app.db.query(store.summary, since, until, args.key_id, args.deployment)
    if not call.identity.may_call(KEYS_READ, call.surface):
        for key in found["keys"]:
            key["key_name"] = None
    return found


def register(registry: Registry) -> None:
    registry.method(
        "usage.summary",
        "Requests and tokens used through /v1, from the daily rollups: totals, each UTC day, each key "
        "(most tokens first) and each deployment. `since`/`until` are UTC dates (YYYY-MM-DD, "
        f"inclusive; default the last {DEFAULT_DAYS} days, at most {MAX_DAYS}); optional `key_id` and "
        '`deployment` ("" = none) filters.',
        SummaryArgs,
        Summary,
        READ,
    )(summary)

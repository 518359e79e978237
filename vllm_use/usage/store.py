"""The daily usage rollups, table `usage_daily` (docs/observability.md, "Token accounting").

One row per (UTC day, key id, deployment; "" when the request named none): the `/v1` requests
audited that day and the tokens of their answers' usage (a count not known adds nothing). The
audit writer adds each batch in the transaction that writes its audit rows
(vllm_use/gateway/audit.py); the rows are never evicted with them, and are written even when
`--max-audit-records 0` keeps no audit row. Every function here runs on the DB thread.

Rows are read back as untrusted: a value that is not a non-negative int counts as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from typing import Any

from vllm_use.storage import Database

_ADD = (
    "INSERT INTO usage_daily (day, key_id, deployment, requests, prompt_tokens, completion_tokens)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(day, key_id, deployment) DO UPDATE SET"
    " requests = requests + excluded.requests,"
    " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = completion_tokens + excluded.completion_tokens"
)


def add_rollups(db: Database, rows: Sequence[tuple[Any, ...]]) -> None:
    """Add (day, key id, deployment, requests, prompt tokens, completion tokens) rows to the
    rollups. Inside the caller's transaction."""
    if rows:
        db.connection().executemany(_ADD, rows)


def _n(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def tokens_on(db: Database, day: str) -> dict[str, int]:
    """Each key's tokens (prompt + completion) on `day`: what `UsageLedger.seed` starts from."""
    rows = db.execute(
        "SELECT key_id, SUM(prompt_tokens), SUM(completion_tokens) FROM usage_daily WHERE day = ?"
        " GROUP BY key_id",
        (day,),
    ).fetchall()
    return {
        key_id: _n(prompt) + _n(completion) for key_id, prompt, completion in rows if isinstance(key_id, str)
    }


# One filter for every query: a part left out (NULL) matches every row.
_BY_DAY = (
    "SELECT u.day, SUM(u.requests), SUM(u.prompt_tokens), SUM(u.completion_tokens) FROM usage_daily AS u"
    " WHERE u.day BETWEEN ?1 AND ?2 AND (?3 IS NULL OR u.key_id = ?3) AND (?4 IS NULL OR u.deployment = ?4)"
    " GROUP BY u.day"
)
_BY_KEY = (
    "SELECT u.key_id, k.name, SUM(u.requests), SUM(u.prompt_tokens), SUM(u.completion_tokens)"
    " FROM usage_daily AS u LEFT JOIN api_keys AS k ON k.id = u.key_id"
    " WHERE u.day BETWEEN ?1 AND ?2 AND (?3 IS NULL OR u.key_id = ?3) AND (?4 IS NULL OR u.deployment = ?4)"
    " GROUP BY u.key_id"
)
_BY_DEPLOYMENT = (
    "SELECT u.deployment, SUM(u.requests), SUM(u.prompt_tokens), SUM(u.completion_tokens) FROM usage_daily AS u"
    " WHERE u.day BETWEEN ?1 AND ?2 AND (?3 IS NULL OR u.key_id = ?3) AND (?4 IS NULL OR u.deployment = ?4)"
    " GROUP BY u.deployment"
)


def _counts(requests: Any, prompt: Any, completion: Any) -> dict[str, int]:
    return {"requests": _n(requests), "prompt_tokens": _n(prompt), "completion_tokens": _n(completion)}


def summary(
    db: Database, since: str, until: str, key_id: str | None, deployment: str | None
) -> dict[str, Any]:
    """Requests and tokens from `since` to `until` (UTC days, YYYY-MM-DD, inclusive): totals, every
    day (zeros included), keys (most tokens first, with their names; None for a deleted key) and
    deployments (most tokens first)."""
    params = (since, until, key_id, deployment)
    by_day = {day: _counts(*sums) for day, *sums in db.execute(_BY_DAY, params).fetchall()}
    keys = [
        {"key_id": key, "key_name": name if isinstance(name, str) else None, **_counts(*sums)}
        for key, name, *sums in db.execute(_BY_KEY, params).fetchall()
        if isinstance(key, str)
    ]
    deployments = [
        {"deployment": name, **_counts(*sums)}
        for name, *sums in db.execute(_BY_DEPLOYMENT, params).fetchall()
        if isinstance(name, str)
    ]
    days = []
    first, last = date.fromisoformat(since), date.fromisoformat(until)
    for offset in range((last - first).days + 1):
        day = (first + timedelta(days=offset)).isoformat()
        days.append({"day": day, **by_day.get(day, _counts(0, 0, 0))})
    totals = {
        name: sum(day[name] for day in days) for name in ("requests", "prompt_tokens", "completion_tokens")
    }

    def most_tokens(row: dict[str, Any]) -> tuple[int, str]:
        return (
            -(row["prompt_tokens"] + row["completion_tokens"]),
            row.get("key_id") or row.get("deployment", ""),
        )

    return {
        "since": since,
        "until": until,
        "totals": totals,
        "days": days,
        "keys": sorted(keys, key=most_tokens),
        "deployments": sorted(deployments, key=most_tokens),
    }

"""Time as the records keep it: unix milliseconds in every `*_at` column, ISO 8601 in UTC with
milliseconds (`2026-12-01T18:27:12.345Z`) in every answer."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    """Wall-clock time in unix milliseconds, the unit of every *_at column."""
    return time.time_ns() // 1_000_000


def parse_aware(value: str) -> datetime:
    """An ISO 8601 date and time that names its time zone; ValueError (its message for a person)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 date and time (e.g. 2026-12-02T08:00:00Z)") from None
    if parsed.tzinfo is None:
        raise ValueError("has no time zone (end it with Z or ±hh:mm)")
    return parsed


def iso(ms: int | None) -> str | None:
    """`ms` (unix milliseconds) as ISO 8601 in UTC with milliseconds; None stays None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

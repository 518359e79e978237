"""Today's tokens per key, in memory: what `tokens_per_day` is checked against (docs/observability.md).

The day is the UTC date. The counters start from the day's rollups at start-up (`seed`) and grow
as requests end (`add`); at midnight UTC they start again from zero. Runs on the IOLoop; a lookup
is one dict read.
"""

from __future__ import annotations

import time

DAY_MS = 86_400_000
_last_day: tuple[int, str] = (-1, "")  # (days since the epoch, its date): the one asked last


def utc_day(at_ms: int) -> str:
    """The UTC date of a unix-ms time, YYYY-MM-DD: the rollups' `day`. Each ended /v1 request asks
    twice (audit rollup, ledger): the last day's text is kept, so that costs a division, not a
    `gmtime` and a `strftime`. (UTC days are all 86,400 s long: unix time has no leap seconds.)"""
    global _last_day
    number, last = at_ms // DAY_MS, _last_day  # read once: any thread may call this
    if last[0] != number:
        last = _last_day = (number, time.strftime("%Y-%m-%d", time.gmtime(number * 86_400)))
    return last[1]


class UsageLedger:
    def __init__(self, now_ms: int | None = None) -> None:
        self.day = utc_day(now_ms if now_ms is not None else int(time.time() * 1000))
        self._tokens: dict[str, int] = {}

    def _roll(self, at_ms: int) -> None:
        day = utc_day(at_ms)
        if day != self.day:
            self.day = day
            self._tokens.clear()

    def seed(self, day: str, tokens_by_key: dict[str, int]) -> None:
        """Start from what the rollups hold for `day` (ignored when it is not today)."""
        if day == self.day:
            for key_id, tokens in tokens_by_key.items():
                self._tokens[key_id] = self._tokens.get(key_id, 0) + tokens

    def add(self, key_id: str, tokens: int, at_ms: int | None = None) -> None:
        self._roll(at_ms if at_ms is not None else int(time.time() * 1000))
        if tokens > 0:
            self._tokens[key_id] = self._tokens.get(key_id, 0) + tokens

    def tokens_today(self, key_id: str, now_ms: int | None = None) -> int:
        self._roll(now_ms if now_ms is not None else int(time.time() * 1000))
        return self._tokens.get(key_id, 0)

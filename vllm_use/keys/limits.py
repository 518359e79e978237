"""A key's model list and limits, enforced at the gateway (docs/observability.md, "Key limits").

`KeyLimits.admit` runs in `RelayHandler.post` once the request's model is known and before
anything is sent upstream, for keys that have a policy (the others never get here):

- models: a name outside the key's list is answered exactly as a name no deployment has
  (`ModelNotFound.unknown`, 404). Names compare after resolving aliases, so a key that lists a
  deployment may use its aliases, and one that lists an alias may use the deployment's name.
- tokens_per_day: admitted while the key's prompt + completion tokens of the UTC day so far
  (`UsageLedger.tokens_today`) are below the limit. A request's own tokens are known only once it
  ended, so the request that crosses the limit completes; the next one is refused.
- max_concurrent: the key's requests in flight, counted here; `release` (the handler's
  `on_finish`) gives the slot back, whatever the outcome.
- rpm: a moving window of 60 s per key (`limits`' MovingWindowRateLimiter on its MemoryStorage):
  admitted when fewer than `rpm` requests were admitted in the last 60 s. Refused requests do not
  count.

Checked in that order, nothing awaited in between: two requests cannot both take the last slot.
A refusal raises `RateLimited` (429) with `Retry-After` and OpenAI's x-ratelimit-* headers, and is
counted in `refusals`. The state is keyed by key id alone (not by the limit's value): an edit of a
key keeps it, `forget_key` (the key deleted) drops it. Runs on the IOLoop.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from vllm_use.errors import ModelNotFound, RateLimited
from vllm_use.scopes import KeyPolicy
from vllm_use.usage.ledger import UsageLedger

if TYPE_CHECKING:
    from vllm_use.deployments.instances import Instances

WINDOW_S = 60
DAY_S = 86_400
CONCURRENCY_RETRY_S = 1  # when a running request ends is not known: try again soon


class _Windows:
    """`limits`' moving windows: its MemoryStorage, a MovingWindowRateLimiter on it, and the
    limit item. Built on the first key with `rpm`: importing `limits` costs every start ~40 ms,
    and most servers never need it."""

    def __init__(self) -> None:
        from limits import RateLimitItemPerMinute
        from limits.storage import MemoryStorage
        from limits.strategies import MovingWindowRateLimiter

        class PerMinute(RateLimitItemPerMinute):
            """`rpm` per minute, stored under the key id alone: `limits` puts the amount in the
            storage key, which would start a fresh window whenever the limit is edited."""

            def key_for(self, *identifiers: bytes | str | int | float) -> str:
                return window_key(str(identifiers[0]))

        self.storage: Any = MemoryStorage()
        self.limiter: Any = MovingWindowRateLimiter(self.storage)
        self.per_minute: Any = PerMinute


def window_key(key_id: str) -> str:
    """Where a key's moving window lives in the storage."""
    return "rpm/" + key_id


def go_duration(seconds: int) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it: 12s, 1m0s, 3h2m5s."""
    hours, rest = divmod(max(seconds, 0), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class KeyLimits:
    """The limiters of every key with a policy, and the refusals counted by limit."""

    def __init__(self, usage: UsageLedger, instances: Instances) -> None:
        self._usage = usage
        self._instances = instances
        self._windows_built: _Windows | None = None
        self._in_flight: dict[str, int] = {}
        self._newest: dict[str, float] = {}  # key id → when its newest counted request came
        self.refusals: dict[str, int] = {"rpm": 0, "concurrency": 0, "tokens": 0}

    @property
    def _windows(self) -> _Windows:
        if self._windows_built is None:
            self._windows_built = _Windows()
        return self._windows_built

    # --- the model list ------------------------------------------------------------------------

    def _canonical(self, name: str) -> str:
        """The deployment a name resolves to, else the target of an alias, else the name."""
        instances = self._instances
        return instances.deployment_of(name) or instances.aliases.get(name, name)

    def allows(self, models: frozenset[str], model: str) -> bool:
        """Whether `model` is one of `models`, directly or through an alias (either way round)."""
        return model in models or self._canonical(model) in {self._canonical(name) for name in models}

    def check_model(self, models: frozenset[str], model: str | None) -> None:
        """ModelNotFound, worded as for a name nothing has, unless `models` allows `model`."""
        if model is None:
            raise ModelNotFound("this key may use only the models named in its list: send `model`")
        if not self.allows(models, model):
            raise ModelNotFound.unknown(model)

    # --- the limits ----------------------------------------------------------------------------

    def admit(self, key_id: str, policy: KeyPolicy, model: str | None) -> list[tuple[str, str]]:
        """Admit one request of `key_id` (it then holds a slot until `release`), or raise
        ModelNotFound / RateLimited. Returns the x-ratelimit-* headers of its answer."""
        if policy.models is not None:
            self.check_model(policy.models, model)
        now = time.time()
        if policy.tokens_per_day is not None:
            if self._usage.tokens_today(key_id) >= policy.tokens_per_day:
                until_midnight = DAY_S - int(now) % DAY_S
                self._refuse(
                    key_id,
                    policy,
                    now,
                    "tokens",
                    f"this key has used its {policy.tokens_per_day} tokens for today; "
                    "the limit starts again at midnight UTC",
                    until_midnight,
                )
        if policy.max_concurrent is not None and self._in_flight.get(key_id, 0) >= policy.max_concurrent:
            self._refuse(
                key_id,
                policy,
                now,
                "concurrency",
                f"this key already has {policy.max_concurrent} requests running, its limit; "
                "try again when one has ended",
                CONCURRENCY_RETRY_S,
            )
        if policy.rpm is not None:
            windows = self._windows
            if not windows.limiter.hit(windows.per_minute(policy.rpm), key_id):
                oldest, used = windows.storage.get_moving_window(window_key(key_id), policy.rpm, WINDOW_S)
                # A full window frees a place when its oldest request leaves it. One fuller than the
                # limit (the limit was lowered since) needs more to leave, and `limits` tells only
                # the oldest: the newest leaving is a bound that is never too early.
                leaves = oldest if used <= policy.rpm else self._newest.get(key_id, now)
                self._refuse(
                    key_id,
                    policy,
                    now,
                    "rpm",
                    f"this key may send {policy.rpm} requests per minute; try again shortly",
                    math.ceil(leaves + WINDOW_S - now),
                    rpm_left=0,
                )
            self._newest[key_id] = now
        self._in_flight[key_id] = self._in_flight.get(key_id, 0) + 1
        return self._headers(key_id, policy, now)

    def release(self, key_id: str) -> None:
        """The end of a request `admit` let through (on_finish, whatever its outcome)."""
        left = self._in_flight.get(key_id, 0) - 1
        if left > 0:
            self._in_flight[key_id] = left
        else:
            self._in_flight.pop(key_id, None)

    def in_flight(self, key_id: str) -> int:
        return self._in_flight.get(key_id, 0)

    def forget_key(self, key_id: str) -> None:
        """The key was deleted: drop its window (its requests in flight release nothing more)."""
        if self._windows_built is not None:
            self._windows_built.storage.clear(window_key(key_id))
        self._newest.pop(key_id, None)
        self._in_flight.pop(key_id, None)

    # --- answers -------------------------------------------------------------------------------

    def _refuse(
        self,
        key_id: str,
        policy: KeyPolicy,
        now: float,
        limit: str,
        message: str,
        retry_after_s: int,
        rpm_left: int | None = None,
    ) -> None:
        self.refusals[limit] += 1
        raise RateLimited(
            message,
            limit=limit,
            retry_after_s=max(1, retry_after_s),
            headers=self._headers(key_id, policy, now, rpm_left),
        )

    def _headers(
        self, key_id: str, policy: KeyPolicy, now: float, rpm_left: int | None = None
    ) -> list[tuple[str, str]]:
        """OpenAI's x-ratelimit-* headers for the limits the key has. `reset` is how long until the
        limit is back to its full value: the newest counted request leaving the 60 s window, or
        midnight UTC for tokens."""
        headers: list[tuple[str, str]] = []
        if policy.rpm is not None:
            if rpm_left is None:
                _, used = self._windows.storage.get_moving_window(window_key(key_id), policy.rpm, WINDOW_S)
                rpm_left = max(0, policy.rpm - used)
            newest = self._newest.get(key_id)
            reset = 0 if newest is None else math.ceil(newest + WINDOW_S - now)
            headers += [
                ("x-ratelimit-limit-requests", str(policy.rpm)),
                ("x-ratelimit-remaining-requests", str(rpm_left)),
                ("x-ratelimit-reset-requests", go_duration(reset)),
            ]
        if policy.tokens_per_day is not None:
            left = max(0, policy.tokens_per_day - self._usage.tokens_today(key_id))
            headers += [
                ("x-ratelimit-limit-tokens", str(policy.tokens_per_day)),
                ("x-ratelimit-remaining-tokens", str(left)),
                ("x-ratelimit-reset-tokens", go_duration(DAY_S - int(now) % DAY_S)),
            ]
        return headers

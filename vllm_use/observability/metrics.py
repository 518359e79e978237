"""The counters vllm-use keeps as things happen, on a registry of its own (docs/observability.md).

`Metrics` holds what must be counted when it happens: `/v1` requests (one `request_ended` call from
the gateway's `on_finish`), their duration and time to first byte, tokens, downloads, and failed
scrapes of vLLM. What can be read at scrape time instead (states, gauges, counts others keep) is
read then, by `collector.StateCollector`; vLLM's own metrics are fetched then too
(`vllm_scrape.py`). `exposition` puts the three together.

Labels stay bounded: `deployment` is a saved deployment's name or "" (none: `--upstream`, or
the runtime serving a path), never the model a client typed; `route` is one of the gateway's
fixed `/v1` paths; no key ids. Everything here runs on the IOLoop except `render`, which runs in
the executor (prometheus_client's values are locked, so that is safe).

The families live on a private `CollectorRegistry`, never prometheus_client's global one: two apps
in one process (the tests' `start_app`) keep their counts apart.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, disable_created_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from vllm_use.downloads.tasks import FINISHED
from vllm_use.observability.collector import StateCollector
from vllm_use.observability.vllm_scrape import scrape_instances

if TYPE_CHECKING:
    from vllm_use.context import AppContext

# Every value `_created` would add is the process start, which `process_start_time_seconds` says once.
disable_created_metrics()

# /v1 requests last from milliseconds (an error, /v1/models) to minutes (a long generation).
DURATION_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The first byte: a prefill on a warm instance, or a load on demand before it.
FIRST_BYTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
WINDOW_S = 60  # dashboard.get's traffic: request ends over the last minute


def status_class(status: int) -> str:
    """The `status` label: "2xx" … "5xx", and "499" for a client that left before the end (the
    audit's 499), which is neither the client's error nor the server's."""
    return "499" if status == 499 else f"{status // 100}xx"


_STATUS_CLASSES = {status: status_class(status) for status in range(100, 600)}


class Traffic:
    """Request ends per second over the last `WINDOW_S` whole seconds, the current one included: a
    ring of one counter per second. An end costs an index and an increment; the rate sums 60
    integers. `now` is a monotonic time in seconds."""

    def __init__(self) -> None:
        self._seconds = [-1] * WINDOW_S
        self._counts = [0] * WINDOW_S

    def add(self, now: float) -> None:
        second = int(now)
        slot = second % WINDOW_S
        if self._seconds[slot] != second:
            self._seconds[slot], self._counts[slot] = second, 0
        self._counts[slot] += 1

    def per_second(self, now: float) -> float:
        second = int(now)
        ended = sum(
            c for s, c in zip(self._seconds, self._counts, strict=True) if second - WINDOW_S < s <= second
        )
        return ended / WINDOW_S


class _Series:
    """The hot counters of one (route, deployment): requests by status class, and the two
    histograms as plain counts per bucket (the last one: past every bound, +Inf) with their sums."""

    __slots__ = ("duration", "duration_sum", "first_byte", "first_byte_sum", "statuses")

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.first_byte = [0] * (len(FIRST_BYTE_BUCKETS) + 1)
        self.first_byte_sum = 0.0


def _histogram(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts as the exposition's cumulative `le` buckets."""
    cumulative, total = [], 0
    for bound, n in zip((*bounds, math.inf), counts, strict=True):
        total += n
        cumulative.append((floatToGoString(bound), total))
    return cumulative


class Metrics:
    """The event counters and the traffic ring. `app.metrics`, built by the composition root.

    The gateway's hook counts in plain Python (`_Series`): prometheus_client's `Counter.inc` and
    `Histogram.observe` take a lock and walk the buckets, and seven of them per request cost more
    than the rest of the accounting together (docs/performance.md). A scrape copies the counts on
    the IOLoop (`snapshot`) and turns the copy into prometheus_client's metric families in the
    executor (`families`); prometheus_client still writes the exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.vllm_scrape_errors = Counter(
            "vllm_use_vllm_scrape_errors",
            "fetches of a vLLM instance's /metrics that failed or timed out during a scrape",
            ("deployment",),
            registry=r,
        )
        self.download_bytes = Counter(
            "vllm_use_download_bytes", "bytes the running downloads added to the models directory", registry=r
        )
        self.downloads = Counter(
            "vllm_use_downloads", "download tasks ended, by outcome", ("outcome",), registry=r
        )
        ProcessCollector(registry=r)  # CPU, memory, open files of this process (read in `render`)
        self.traffic = Traffic()
        self._series: dict[tuple[str, str], _Series] = {}  # (route, deployment or "")
        self._tokens: dict[str, list[int]] = {}  # deployment or "" → [prompt, completion]
        self._download_seen: dict[str, int] = {}  # running task id → bytes counted so far

    # --- the gateway's hook (the hot path) ------------------------------------------------------

    def request_ended(
        self,
        route: str,
        deployment: str | None,
        status: int,
        duration_s: float,
        first_byte_s: float | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """One /v1 request ended (GatewaySurface.on_finish): a dict lookup, a bisection per
        histogram and a few integer additions. `first_byte_s` is None when no upstream byte went out
        (an answer of ours); tokens are counted only when the response reported them."""
        name = deployment or ""
        series = self._series.get((route, name))
        if series is None:
            series = self._series[(route, name)] = _Series()
        statuses = series.statuses
        label = _STATUS_CLASSES.get(status) or status_class(status)
        statuses[label] = statuses.get(label, 0) + 1
        series.duration[bisect_left(DURATION_BUCKETS, duration_s)] += 1
        series.duration_sum += duration_s
        if first_byte_s is not None:
            series.first_byte[bisect_left(FIRST_BYTE_BUCKETS, first_byte_s)] += 1
            series.first_byte_sum += first_byte_s
        if prompt_tokens is not None or completion_tokens is not None:
            tokens = self._tokens.get(name)
            if tokens is None:
                tokens = self._tokens[name] = [0, 0]
            tokens[0] += prompt_tokens or 0
            tokens[1] += completion_tokens or 0
        self.traffic.add(time.monotonic())

    def snapshot(self) -> Counts:
        """A copy of the hook's counts (on the IOLoop: no count moves while it is taken; about a
        microsecond per series). `families` turns it into metric families, anywhere."""
        series = [
            (route, name, dict(s.statuses), s.duration[:], s.duration_sum, s.first_byte[:], s.first_byte_sum)
            for (route, name), s in self._series.items()
        ]
        return Counts(series, [(name, *tokens) for name, tokens in self._tokens.items()])

    # --- downloads (DownloadManager.subscribe) --------------------------------------------------

    def download_event(self, event: dict[str, Any]) -> None:
        """A download task changed: count the bytes it added since it was last seen, and its
        outcome once it ends. Runs on the IOLoop, at most about once a second per running task."""
        task = event.get("task")
        if event.get("type") != "task" or not isinstance(task, dict):
            return
        task_id, done = task["id"], task.get("bytes_done") or 0
        seen = self._download_seen.get(task_id, 0)
        if done > seen:
            self.download_bytes.inc(done - seen)
            seen = done
        if task["status"] in FINISHED:
            self._download_seen.pop(task_id, None)
            self.downloads.labels(task["status"]).inc()
        elif task["status"] == "running":
            self._download_seen[task_id] = seen

    # --- dashboard.get ---------------------------------------------------------------------------

    def traffic_now(self, app: AppContext) -> dict[str, Any]:
        """dashboard.get's `traffic`: request ends per second over the last minute, and the /v1
        requests open now (a streamed answer counts until its last event)."""
        rate = self.traffic.per_second(time.monotonic())
        return {"requests_per_s": round(rate, 3), "window_s": WINDOW_S, "active_streams": app.live.count()}

    # --- the scrape -------------------------------------------------------------------------------

    async def exposition(self, app: AppContext) -> bytes:
        """The text of `GET /metrics`: vLLM's metrics fetched from the ready instances (concurrently,
        each bounded), the state read now on the IOLoop, then everything written out in the
        executor, so the loop pays for the reads only (tools/bench_metrics.py)."""
        vllm = await scrape_instances(app, self.vllm_scrape_errors)
        counts = self.snapshot()
        state = list(StateCollector(app).collect())
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, render, self.registry, counts, state, vllm)


class Counts(NamedTuple):
    """`Metrics.snapshot`: per (route, deployment) the requests by status class and the two
    histograms' bucket counts and sums; per deployment the prompt and completion tokens."""

    series: list[tuple[str, str, dict[str, int], list[int], float, list[int], float]]
    tokens: list[tuple[str, int, int]]


def families(counts: Counts) -> list[Metric]:
    """The hook's counts as prometheus_client's metric families. Runs in the executor (`render`)."""
    requests = CounterMetricFamily(
        "vllm_use_requests",
        "/v1 requests ended, by route, deployment and status class",
        labels=("route", "deployment", "status"),
    )
    duration = HistogramMetricFamily(
        "vllm_use_request_duration_seconds",
        "/v1 request duration, from its headers to its last byte",
        labels=("route", "deployment"),
    )
    first_byte = HistogramMetricFamily(
        "vllm_use_time_to_first_byte_seconds",
        "/v1 time from the request's headers to the response's first byte from the upstream",
        labels=("route", "deployment"),
    )
    for route, name, statuses, durations, duration_sum, first_bytes, first_byte_sum in sorted(counts.series):
        for label, n in sorted(statuses.items()):
            requests.add_metric((route, name, label), n)
        duration.add_metric((route, name), _histogram(DURATION_BUCKETS, durations), duration_sum)
        first_byte.add_metric((route, name), _histogram(FIRST_BYTE_BUCKETS, first_bytes), first_byte_sum)
    prompt = CounterMetricFamily(
        "vllm_use_prompt_tokens", "prompt tokens of /v1 responses that reported usage", labels=("deployment",)
    )
    completion = CounterMetricFamily(
        "vllm_use_completion_tokens",
        "completion tokens of /v1 responses that reported usage",
        labels=("deployment",),
    )
    for name, p, c in sorted(counts.tokens):
        prompt.add_metric((name,), p)
        completion.add_metric((name,), c)
    return [requests, duration, first_byte, prompt, completion]


class _Families(Collector):
    """The registry's families, then families already built: what `generate_latest` walks."""

    def __init__(self, registry: CollectorRegistry, *built: Iterable[Metric]) -> None:
        self._registry = registry
        self._built = built

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        for families in self._built:
            yield from families


def render(registry: CollectorRegistry, counts: Counts, *built: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of the registry, the hook's counts and the built families.
    Runs in the executor."""
    return generate_latest(_Families(registry, families(counts), *built))

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
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

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


class Metrics:
    """The event counters and the traffic ring. `app.metrics`, built by the composition root."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "vllm_use_requests",
            "/v1 requests ended, by route, deployment and status class",
            ("route", "deployment", "status"),
            registry=r,
        )
        self.duration = Histogram(
            "vllm_use_request_duration_seconds",
            "/v1 request duration, from its headers to its last byte",
            ("route", "deployment"),
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.first_byte = Histogram(
            "vllm_use_time_to_first_byte_seconds",
            "/v1 time from the request's headers to the response's first byte from the upstream",
            ("route", "deployment"),
            buckets=FIRST_BYTE_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vllm_use_prompt_tokens",
            "prompt tokens of /v1 responses that reported usage",
            ("deployment",),
            registry=r,
        )
        self.completion_tokens = Counter(
            "vllm_use_completion_tokens",
            "completion tokens of /v1 responses that reported usage",
            ("deployment",),
            registry=r,
        )
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
        # (route, deployment, status class) → its labelled children: `labels()` costs a lock, a
        # tuple and a dict lookup; this is one dict lookup.
        self._children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        self._tokens: dict[str, tuple[Any, Any]] = {}
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
        """One /v1 request ended (GatewaySurface.on_finish): a few increments, no lookup by labels.
        `first_byte_s` is None when no upstream byte went out (an answer of ours); tokens are
        counted only when the response reported them."""
        name = deployment or ""
        key = (route, name, status_class(status))
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(*key),
                self.duration.labels(route, name),
                self.first_byte.labels(route, name),
            )
        children[0].inc()
        children[1].observe(duration_s)
        if first_byte_s is not None:
            children[2].observe(first_byte_s)
        if isinstance(prompt_tokens, int) or isinstance(completion_tokens, int):
            tokens = self._tokens.get(name)
            if tokens is None:
                tokens = self._tokens[name] = (
                    self.prompt_tokens.labels(name),
                    self.completion_tokens.labels(name),
                )
            if isinstance(prompt_tokens, int):
                tokens[0].inc(prompt_tokens)
            if isinstance(completion_tokens, int):
                tokens[1].inc(completion_tokens)
        self.traffic.add(time.monotonic())

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
        state = list(StateCollector(app).collect())
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, render, self.registry, state, vllm)


class _Families(Collector):
    """The registry's families, then families already built: what `generate_latest` walks."""

    def __init__(self, registry: CollectorRegistry, *built: Iterable[Metric]) -> None:
        self._registry = registry
        self._built = built

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        for families in self._built:
            yield from families


def render(registry: CollectorRegistry, *built: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of the registry and the built families. Runs in the executor."""
    return generate_latest(_Families(registry, *built))

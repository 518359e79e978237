"""What `GET /metrics` reads at scrape time from the state others keep (docs/observability.md).

Nothing here counts or stores: each family is built from what the domain already holds (open
`/v1` requests, stream sessions, the deployments' instances and their tally, failed
authentications, rate-limit refusals). `collect` runs on the IOLoop, so it reads those objects
while nothing else changes them; it does no I/O and touches no instance's idle timer (a read
of `Instances.status` is a view).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm_use.deployments.instances import InstanceState
from vllm_use.scopes import Surface

if TYPE_CHECKING:
    from vllm_use.context import AppContext

# The instance tally's events (Instances.tally) and the counter each one is exposed as.
TALLIED = {
    "load": ("vllm_use_deployment_loads", "starts of the deployment's vLLM instance"),
    "eviction": (
        "vllm_use_deployment_evictions",
        "times the instance was put to sleep or stopped to make room",
    ),
    "sleep": ("vllm_use_deployment_sleeps", "times the instance went to sleep (idle, evicted or asked)"),
    "wake": ("vllm_use_deployment_wakes", "times the instance woke from sleep"),
}
LIMITS = ("rpm", "concurrency", "tokens")  # the per-key limits that answer 429 (docs/observability.md)


class StateCollector(Collector):
    """The families read now from `app`. Runs on the IOLoop."""

    def __init__(self, app: AppContext) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        app = self.app
        yield GaugeMetricFamily(
            "vllm_use_requests_in_flight",
            "/v1 requests open now (a streamed answer counts until its last event)",
            value=app.live.count(),
        )
        live = app.streams.live_count()
        sessions = GaugeMetricFamily(
            "vllm_use_stream_sessions", "resumable stream sessions kept, by state", labels=("state",)
        )
        sessions.add_metric(("live",), live)
        sessions.add_metric(("finished",), len(app.streams) - live)
        yield sessions
        yield GaugeMetricFamily(
            "vllm_use_stream_buffer_bytes",
            "bytes the stream sessions' buffers hold",
            value=app.streams.held_bytes,
        )
        yield from self._deployments()
        failures = CounterMetricFamily(
            "vllm_use_auth_failures",
            "refused credentials (401, or 429 while verifications queue), by surface",
            labels=("surface",),
        )
        for surface in Surface:
            failures.add_metric((surface.value,), app.auth.failures.by_surface.get(surface.value, 0))
        yield failures
        yield from self._refusals()

    def _deployments(self) -> Iterator[Metric]:
        instances = self.app.instances
        names = instances.saved_names()
        state = GaugeMetricFamily(
            "vllm_use_deployment_state",
            "1 for the state the deployment's instance is in, 0 for the others",
            labels=("deployment", "state"),
        )
        in_flight = GaugeMetricFamily(
            "vllm_use_deployment_requests_in_flight",
            "/v1 requests the deployment's instance is answering",
            labels=("deployment",),
        )
        waiting = GaugeMetricFamily(
            "vllm_use_deployment_requests_waiting",
            "/v1 requests waiting for the deployment's instance to load or wake",
            labels=("deployment",),
        )
        for name in names:
            status = instances.status(name)
            for each in InstanceState:
                state.add_metric((name, each.value), 1 if status["state"] == each else 0)
            in_flight.add_metric((name,), status["in_flight"])
            waiting.add_metric((name,), status["waiting"])
        yield from (state, in_flight, waiting)
        tally = instances.tally
        known = sorted(set(names) | {name for _, name in tally})
        for event, (metric, help_text) in TALLIED.items():
            family = CounterMetricFamily(metric, help_text, labels=("deployment",))
            for name in known:
                family.add_metric((name,), tally.get((event, name), 0))
            yield family

    def _refusals(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "vllm_use_rate_limit_refusals",
            "/v1 requests refused with 429 by a key's limit",
            labels=("limit",),
        )
        refusals = self.app.limits.refusals  # counted by vllm_use/keys/limits.py
        for limit in LIMITS:
            family.add_metric((limit,), refusals.get(limit, 0))
        yield family

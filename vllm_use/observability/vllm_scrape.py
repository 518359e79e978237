"""vLLM's own `/metrics`, fetched from each instance when vllm-use is scraped (docs/observability.md).

vLLM listens on loopback only, so a Prometheus elsewhere sees its metrics through us. Which
instances: every deployment whose instance is ready and awake (`Instances.target`), and the
runtime's child when it serves a path rather than a deployment (labelled `deployment=""`). One
that is starting, asleep, stopping or gone is not asked: a scrape never wakes, loads or uses an
instance, and never moves its idle timer (it does not go through `Instances.begin`/`end`, and
vLLM's `/metrics` is no inference).

The fetches run concurrently, each bounded by `FETCH_TIMEOUT_S` and `BODY_MAX` (tornado's client:
no environment proxy, no redirects); a down or slow instance is just missing from this scrape and
counted in `vllm_use_vllm_scrape_errors_total`. vLLM's route needs no key (it guards `/v1` only),
so none is sent. The texts are parsed in the executor (a real vLLM's is tens of kilobytes); vLLM's
own families (`vllm:*`) are kept, each sample gaining a `deployment` label, and families of the
same name from several instances are merged into one, as the text format requires. The rest of
its text (its process's and HTTP server's families) is left out: those names are ours too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

from vllm_use.runtime.supervisor import RuntimeState

if TYPE_CHECKING:
    from vllm_use.context import AppContext

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 2.0
BODY_MAX = 8 * 1024 * 1024  # a real vLLM's is well under 1 MiB
LABEL = "deployment"
# vLLM's own families. Their names keep vLLM's colon, so vLLM's documentation, alerts and dashboards
# apply as they are; promtool's linter flags such names, Prometheus takes them (docs/observability.md).
PREFIX = "vllm:"


class TooLarge(Exception):
    """An instance's `/metrics` is larger than the bound."""


def origins(app: AppContext) -> dict[str, str]:
    """deployment label → the loopback origin of a vLLM to ask now: the ready, awake instances."""
    found: dict[str, str] = {}
    instances = app.instances
    for name in instances.saved_names():
        target = instances.target(name)
        if target is not None:
            found[name] = target[0]
    runtime = app.runtime
    if instances.runtime_name is None and runtime.state is RuntimeState.READY and runtime.child is not None:
        found[""] = f"http://127.0.0.1:{runtime.child.port}"  # runtime.start: a path, no deployment
    return found


async def fetch(origin: str, limit: int = BODY_MAX, timeout_s: float = FETCH_TIMEOUT_S) -> str:
    """One instance's `/metrics` in the text format: at most `limit` bytes within `timeout_s`; raises
    on anything else."""
    chunks: list[bytes] = []
    size = 0

    def take(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"more than {limit} bytes")  # aborts the fetch
        chunks.append(chunk)

    request = HTTPRequest(
        origin + "/metrics",
        headers={"Accept": "text/plain; version=0.0.4"},  # not OpenMetrics: the parser reads this one
        follow_redirects=False,
        decompress_response=False,  # nothing asks for gzip on loopback
        connect_timeout=timeout_s,
        request_timeout=timeout_s,
        streaming_callback=take,
    )
    try:
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
    except HTTPClientError:
        if size > limit:  # tornado reports the abort of `take` as a closed connection
            raise TooLarge(f"more than {limit} bytes") from None
        raise
    if response.code != 200:
        raise HTTPClientError(response.code, f"/metrics answered {response.code}")
    return b"".join(chunks).decode("utf-8", "replace")


async def scrape_instances(app: AppContext, errors: Counter) -> list[Metric]:
    """The merged, labelled vLLM families of every instance that answered; `errors` (the
    `vllm_use_vllm_scrape_errors` counter) counts the others."""
    targets = origins(app)
    if not targets:
        return []
    names = list(targets)
    results = await asyncio.gather(*(fetch(targets[name]) for name in names), return_exceptions=True)
    texts: dict[str, str] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, str):
            texts[name] = result
        elif isinstance(result, (OSError, HTTPClientError, StreamClosedError, TooLarge, TimeoutError)):
            log.debug("vLLM metrics of deployment %r not read: %s", name, result)
            errors.labels(name).inc()
        else:
            raise result
    loop = asyncio.get_running_loop()
    families, broken = await loop.run_in_executor(None, merge, texts)
    for name in broken:
        errors.labels(name).inc()
    return families


def merge(texts: dict[str, str]) -> tuple[list[Metric], list[str]]:
    """Parse each instance's text, label its samples with the deployment and merge families by
    name. Returns the families and the deployments whose text did not parse (left out whole).
    Runs in the executor."""
    merged: dict[str, Metric] = {}
    broken: list[str] = []
    for name, text in texts.items():
        try:
            parsed = list(text_string_to_metric_families(text))
        except (ValueError, IndexError, KeyError) as exc:
            log.debug("vLLM metrics of deployment %r did not parse: %s", name, exc)
            broken.append(name)
            continue
        for family in parsed:
            if not family.name.startswith(PREFIX):
                continue  # its process_*, python_*, http_*: they would clash with ours and each other's
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            elif target.type != family.type:
                continue  # two instances disagree on a family's type (another vLLM version): keep the first
            target.samples.extend(_labelled(family.samples, name))
    return list(merged.values()), broken


def _labelled(samples: Iterable[Sample], deployment: str) -> Iterable[Sample]:
    for s in samples:
        yield Sample(
            s.name, {**s.labels, LABEL: deployment}, s.value, s.timestamp, s.exemplar, s.native_histogram
        )

"""Benchmark of `GET /metrics` and of the gateway's metrics hook (docs/observability.md, "Metrics").

Not a test: it prints numbers against targets, for docs/performance.md. In-process, no server and
no vLLM: a real `AppContext` (build_context on a temporary data dir) with `--deployments` saved
deployments (8 by default), whose counters first see every route × deployment × status class, so the exposition
is as large as a busy server's. Times 1 and 2 are the CPU time of this thread (`time.thread_time`),
so other processes on a busy machine do not inflate them. It measures

1. the gateway's hook, `Metrics.request_ended`, per call (target ≤ 10 µs: a few increments);
2. one scrape's work on the IOLoop: finding the vLLM instances to ask and reading the state
   (`StateCollector`), per scrape (target ≤ 1 ms); the text itself is written in the executor,
   whose time is printed too;
3. the IOLoop's lag (a 1 ms ticker's p99 and max) while scrapes run back to back, against the lag
   with no scrape: the executor's rendering competes for the GIL.

Run: `.venv/bin/python tools/bench_metrics.py` (a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vllm_use import app as app_mod  # noqa: E402
from vllm_use import config as config_mod  # noqa: E402
from vllm_use.observability.collector import StateCollector  # noqa: E402
from vllm_use.observability.metrics import render  # noqa: E402
from vllm_use.observability.vllm_scrape import origins  # noqa: E402

DEPLOYMENTS = 8
ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/models",
)
CLASSES = (200, 404, 499, 502)
HOOK_TARGET_US = 10.0
SCRAPE_LOOP_TARGET_MS = 1.0


def _context(data_dir: Path, deployments: int) -> app_mod.AppContext:
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(data_dir)])
    config = config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": "bench-admin-token-0123456789"})
    app = app_mod.build_context(config)
    names = [{"name": f"model-{i}", "aliases": [f"alias-{i}"]} for i in range(deployments)]
    app.instances.set_names(names)
    for route in ROUTES:
        for i in range(deployments):
            for status in CLASSES:
                app.metrics.request_ended(route, f"model-{i}", status, 1.5, 0.2, 100, 20)
    return app


def _ms(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def bench_hook(app: app_mod.AppContext, n: int) -> float:
    hook = app.metrics.request_ended
    start = time.thread_time()
    for i in range(n):
        hook("/v1/chat/completions", "model-1", 200, 0.8, 0.05, 30 + i % 7, 12)
    return (time.thread_time() - start) / n * 1e6


async def bench_scrape(app: app_mod.AppContext, n: int) -> dict[str, float]:
    on_loop, rendered, sizes = [], [], []
    for _ in range(n):
        t0 = time.thread_time()
        origins(app)
        counts = app.metrics.snapshot()
        state = list(StateCollector(app).collect())
        t1 = time.thread_time()
        body = render(app.metrics.registry, counts, state, [])
        rendered.append(time.thread_time() - t1)
        on_loop.append(t1 - t0)
        sizes.append(len(body))
    return {
        "loop_p50_ms": _ms(on_loop, 0.5),
        "loop_p99_ms": _ms(on_loop, 0.99),
        "render_p50_ms": _ms(rendered, 0.5),
        "bytes": statistics.median(sizes),
    }


async def loop_lag(app: app_mod.AppContext, seconds: float, scraping: bool) -> tuple[float, float]:
    """The p99 and max lag of a 1 ms ticker, with scrapes running back to back or not."""
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    async def scrapes() -> None:
        while not done:
            await app.metrics.exposition(app)

    tasks = [asyncio.ensure_future(ticker())]
    if scraping:
        tasks.append(asyncio.ensure_future(scrapes()))
    await asyncio.sleep(seconds)
    done = True
    await asyncio.gather(*tasks)
    return _ms(lags, 0.99), max(lags) * 1000


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        app = _context(Path(tmp) / "data", args.deployments)
        try:
            hook_us = bench_hook(app, args.calls)
            scrape = await bench_scrape(app, args.scrapes)
            idle = await loop_lag(app, args.seconds, scraping=False)
            busy = await loop_lag(app, args.seconds, scraping=True)
        finally:
            app_mod.shutdown(app)
    print(f"request_ended: {hook_us:.2f} µs per call (target ≤ {HOOK_TARGET_US:g})")
    print(
        f"scrape on the loop: p50 {scrape['loop_p50_ms']:.3f} ms, p99 {scrape['loop_p99_ms']:.3f} ms "
        f"(target ≤ {SCRAPE_LOOP_TARGET_MS:g}); rendered in the executor: p50 {scrape['render_p50_ms']:.2f} ms, "
        f"{scrape['bytes'] / 1024:.0f} KiB"
    )
    print(f"loop lag (1 ms ticker): p99 {idle[0]:.2f} ms, max {idle[1]:.2f} ms without scrapes")
    print(f"loop lag (1 ms ticker): p99 {busy[0]:.2f} ms, max {busy[1]:.2f} ms with scrapes back to back")
    ok = hook_us <= HOOK_TARGET_US and scrape["loop_p99_ms"] <= SCRAPE_LOOP_TARGET_MS
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deployments", type=int, default=DEPLOYMENTS)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    sys.exit(asyncio.run(main(parser.parse_args())))

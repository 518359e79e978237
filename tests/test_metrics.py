"""`GET /metrics` (docs/observability.md, "Metrics"): who may read it, that Prometheus's own tools
accept it, that its counters move by exactly the requests made, and that reading it never loads,
wakes or uses a deployment's instance.

One vllm-use for the module: `/v1` relays to the fake upstream (`--upstream`) for model `tiny`,
three deployments run the fake vLLM (which serves vLLM's `/metrics`): `llama` and `broken` (whose
`/metrics` answers 500) loaded, `idle` never loaded, and downloads come from the fake hub. A real
Prometheus scrapes it in one test.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tornado.httpserver
import tornado.netutil
import tornado.simple_httpclient
import tornado.web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import fake_vllm_bin
from tests.fakes.hub import FakeHub
from tests.fakes.upstream import FakeUpstream, running
from tests.support import REPO
from tests.support.deployments import add_deployment, instance, load, streaming
from tests.support.prometheus import promtool_check, read_metrics, scraping, value
from tests.support.server import Server, eventually, free_port, start_app, start_server
from vllm_use.observability import vllm_scrape
from vllm_use.observability.metrics import (
    DURATION_BUCKETS,
    FIRST_BYTE_BUCKETS,
    WINDOW_S,
    Metrics,
    Traffic,
    render,
)

UPSTREAM_KEY = "upstream-key-0123456789abcdef"
CHAT = "/v1/chat/completions"
REPO_FILES = {"config.json": b'{"model_type": "llama"}\n', "model.safetensors": b"w" * 6000}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running(api_key=UPSTREAM_KEY)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("metrics")
    hub = FakeHub().start()
    hub.add_repo("org/tiny", REPO_FILES)
    # llama streams slowly, so a test can read the metrics while one of its streams is open.
    vllm = fake_vllm_bin(
        tmp / "bin",
        max_lifetime=300,
        by_name={"broken": {"metrics_fails": 1}, "llama": {"token_seconds": 0.05}},
    )
    first = free_port()
    server = start_server(
        tmp / "data",
        "--upstream",
        upstream.url,
        "--vllm-bin",
        str(vllm),
        "--runtime-ports",
        f"{first}-{first + 9}",
        "--max-loaded",
        "3",
        "--hf-bin",
        str(Path(sys.executable).with_name("hf")),
        env={"VLLM_USE_UPSTREAM_API_KEY": UPSTREAM_KEY, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf")},
    )
    try:
        add_deployment(server, "llama", idle_timeout_s=600)
        add_deployment(server, "idle")
        add_deployment(server, "broken")
        for name in ("llama", "broken"):
            assert load(server, name).status_code == 200
        yield {
            "server": server,
            "metrics": server.create_key("metrics", name="prometheus")[1],
            "inference": server.create_key("inference", name="client")[1],
        }
    finally:
        server.stop()
        hub.stop()


def chat(server: Server, key: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3, **extra}
    return server.fetch(CHAT, "POST", json=body, token=key)


# --- who may read it --------------------------------------------------------------------------------


def test_only_a_metrics_key_reads_the_metrics_and_every_refusal_is_counted(served: dict[str, Any]) -> None:
    server, key = served["server"], served["metrics"]
    before = read_metrics(server, key)
    refused = [
        server.fetch("/metrics", token=None),
        server.fetch("/metrics", token=served["inference"]),
        server.fetch("/metrics"),  # the admin token is a credential on /api only
        server.fetch("/metrics", token="vu_" + "x" * 48),
    ]
    assert [r.status_code for r in refused] == [401, 401, 401, 401]
    assert all(r.headers["WWW-Authenticate"].startswith("Bearer") for r in refused)
    assert chat(server, "not-a-key", "tiny").status_code == 401
    r = server.fetch("/metrics", token=key)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert r.headers["Cache-Control"] == "no-store"
    after = read_metrics(server, key)
    failures = "vllm_use_auth_failures_total"
    assert value(after, failures, surface="metrics") - value(before, failures, surface="metrics") == 4
    assert value(after, failures, surface="gateway") - value(before, failures, surface="gateway") == 1
    assert value(after, failures, surface="api") == value(before, failures, surface="api")


def test_metrics_public_serves_them_without_a_key_and_the_overview_shows_the_last_minute(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    env = {"VLLM_USE_UPSTREAM_API_KEY": UPSTREAM_KEY}
    app = start_app(tmp_path / "data", "--metrics-public", "--upstream", upstream.url, env=env)
    try:
        key = app.create_key("inference")[1]
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            assert app.fetch(CHAT, "POST", json=body, token=None, headers=headers).status_code == 200
        traffic = app.fetch("/api/dashboard").json()["traffic"]
        assert traffic == {"requests_per_s": 0.05, "window_s": 60, "active_streams": 0}
        r = app.fetch("/metrics", token=None)
        assert r.status_code == 200
        line = f'vllm_use_requests_total{{deployment="",route="{CHAT}",status="2xx"}} 3.0'
        assert line in r.text.splitlines()
        checked = promtool_check(r.content)  # vllm-use's own families: not one finding
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
    finally:
        app.stop()


def test_the_traffic_window_holds_the_last_sixty_whole_seconds() -> None:
    traffic = Traffic()
    for _ in range(6):
        traffic.add(100.2)
    traffic.add(130.5)
    assert traffic.per_second(100.9) == 6 / WINDOW_S
    assert traffic.per_second(159.99) == 7 / WINDOW_S  # second 100 is the oldest of the window
    assert traffic.per_second(160.0) == 1 / WINDOW_S  # and now out of it
    traffic.add(160.1)  # the slot second 100 used: counts from zero again
    assert traffic.per_second(160.5) == 2 / WINDOW_S


# --- the exposition ---------------------------------------------------------------------------------


def test_promtool_accepts_the_exposition_with_vllms_metrics_merged_in(served: dict[str, Any]) -> None:
    server, key = served["server"], served["metrics"]
    assert chat(server, served["inference"], "tiny").status_code == 200
    assert chat(server, served["inference"], "llama").status_code == 200
    r = server.fetch("/metrics", token=key)
    assert "vllm_num_requests_running{" in r.text and 'deployment="llama"' in r.text
    assert "vllm:" not in r.text  # vLLM's colon names are renamed: promtool refuses them
    checked = promtool_check(r.content)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_requests_are_counted_by_route_deployment_and_status_class(served: dict[str, Any]) -> None:
    server, key, client = served["server"], served["metrics"], served["inference"]
    before = read_metrics(server, key)
    answers = [chat(server, client, "tiny") for _ in range(3)]
    answers.append(chat(server, client, "no-such-model"))  # the upstream's 404, relayed
    answers += [server.fetch("/v1/models", token=client) for _ in range(2)]
    answers.append(chat(server, client, "llama"))
    answers.append(chat(server, "wrong", "tiny"))  # refused before the upstream: no first byte
    assert [r.status_code for r in answers] == [200, 200, 200, 404, 200, 200, 200, 401]
    after = read_metrics(server, key)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "vllm_use_requests_total"
    assert moved(requests, route=CHAT, deployment="", status="2xx") == 3
    assert moved(requests, route=CHAT, deployment="", status="4xx") == 2
    assert moved(requests, route="/v1/models", deployment="", status="2xx") == 2
    assert moved(requests, route=CHAT, deployment="llama", status="2xx") == 1
    assert moved(requests, route=CHAT, deployment="llama", status="4xx") == 0
    assert moved("vllm_use_request_duration_seconds_count", route=CHAT, deployment="") == 5
    assert moved("vllm_use_request_duration_seconds_count", route=CHAT, deployment="llama") == 1
    # the first byte is the upstream's: the 401 is ours, and so is /v1/models' listing of deployments
    assert moved("vllm_use_time_to_first_byte_seconds_count", route=CHAT, deployment="") == 4
    assert moved("vllm_use_time_to_first_byte_seconds_count", route="/v1/models", deployment="") == 0
    assert moved("vllm_use_time_to_first_byte_seconds_count", route=CHAT, deployment="llama") == 1
    total = sum(v for (name, _), v in after.items() if name == requests)
    assert total - sum(v for (name, _), v in before.items() if name == requests) == len(answers)
    # the tokens of the answers' usage, by deployment (the 404 and the listings have none)
    for deployment, answered in (("", answers[:3]), ("llama", answers[6:7])):
        for kind in ("prompt", "completion"):
            reported = sum(r.json()["usage"][f"{kind}_tokens"] for r in answered)
            assert reported > 0
            assert moved(f"vllm_use_{kind}_tokens_total", deployment=deployment) == reported, (
                deployment,
                kind,
            )


def test_an_open_stream_is_in_flight_and_a_client_that_leaves_is_counted_as_499(
    served: dict[str, Any],
) -> None:
    server, key, client = served["server"], served["metrics"], served["inference"]
    before = read_metrics(server, key)
    with streaming(server, client, "llama"):
        during = read_metrics(server, key)
        traffic = server.fetch("/api/dashboard").json()["traffic"]
    assert value(during, "vllm_use_requests_in_flight") == 1
    assert value(during, "vllm_use_deployment_requests_in_flight", deployment="llama") == 1
    assert value(during, "vllm_num_requests_running", deployment="llama", engine="0", model_name="llama") == 1
    assert traffic["active_streams"] == 1
    gone = ("vllm_use_requests_total", (("deployment", "llama"), ("route", CHAT), ("status", "499")))

    def counted() -> bool:
        return read_metrics(server, key).get(gone, 0.0) - before.get(gone, 0.0) == 1

    eventually(counted, timeout=30)  # once the gateway sees the client gone (one token later)


def test_a_resumable_stream_is_a_live_session_then_a_finished_one(
    served: dict[str, Any], upstream: FakeUpstream
) -> None:
    server, key = served["server"], served["metrics"]
    sessions = "vllm_use_stream_sessions"
    before = read_metrics(server, key)
    released = threading.Event()
    upstream.hold_after_first = released  # the upstream sends the rest once the test has read a scrape
    headers = {"Authorization": f"Bearer {served['inference']}", "X-Conversation-Id": "metrics-conv-1"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    try:
        with server.client.stream("POST", server.base_url + CHAT, json=body, headers=headers) as r:
            chunks = r.iter_raw()
            next(chunks)
            during = read_metrics(server, key)
            released.set()
            rest = b"".join(chunks)
    finally:
        upstream.reset()
    assert rest.endswith(b"data: [DONE]\n\n")
    after = read_metrics(server, key)
    assert value(during, sessions, state="live") - value(before, sessions, state="live") == 1
    assert value(during, "vllm_use_stream_buffer_bytes") > 0
    assert value(after, sessions, state="live") == value(before, sessions, state="live")
    assert value(after, sessions, state="finished") - value(before, sessions, state="finished") == 1


def test_a_download_is_counted_by_outcome_with_the_bytes_it_wrote(served: dict[str, Any]) -> None:
    server, key = served["server"], served["metrics"]
    before = read_metrics(server, key)
    r = server.fetch("/api/models/huggingface", "POST", json={"repository": "org/tiny"})
    assert r.status_code == 201, r.text
    r = server.fetch("/api/downloads", "POST", json={"model_id": r.json()["model"]["id"]})
    assert r.status_code == 201, r.text
    path = f"/api/downloads/{r.json()['task']['id']}"
    ended = ("succeeded", "failed", "canceled")  # a task is "pending" before it runs
    task = eventually(lambda: (t := server.fetch(path).json()["task"])["status"] in ended and t, timeout=60)
    size = sum(len(data) for data in REPO_FILES.values())
    assert task["status"] == "succeeded" and task["bytes_done"] == size
    after = read_metrics(server, key)
    for outcome, moved in (("succeeded", 1), ("failed", 0), ("canceled", 0)):
        downloads = "vllm_use_downloads_total"
        assert value(after, downloads, outcome=outcome) - value(before, downloads, outcome=outcome) == moved
    assert (
        value(after, "vllm_use_download_bytes_total") - value(before, "vllm_use_download_bytes_total") == size
    )


def test_a_vllm_metrics_fetch_is_bounded_in_size_and_time() -> None:
    """`vllm_scrape.fetch` against a loopback server: a text of exactly the bound is read, one byte
    more is refused, and a vLLM that never answers is given up after the timeout."""

    class Sized(tornado.web.RequestHandler):
        def get(self, size: str) -> None:
            self.write(b"#" * int(size))

    class Silent(tornado.web.RequestHandler):
        async def get(self) -> None:
            await asyncio.Event().wait()  # until the client gives up and the server closes

    async def run() -> tuple[str, BaseException | None, BaseException | None, float]:
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(
            tornado.web.Application([(r"/(\d+)/metrics", Sized), (r"/silent/metrics", Silent)])
        )
        server.add_sockets(sockets)
        origin = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        try:
            fits = await vllm_scrape.fetch(f"{origin}/70000", limit=70000)
            over = await asyncio.gather(
                vllm_scrape.fetch(f"{origin}/70001", limit=70000), return_exceptions=True
            )
            started = time.monotonic()
            silent = await asyncio.gather(
                vllm_scrape.fetch(f"{origin}/silent", timeout_s=0.5), return_exceptions=True
            )
            return fits, over[0], silent[0], time.monotonic() - started
        finally:
            server.stop()
            await server.close_all_connections()

    fits, over, silent, waited = asyncio.run(run())
    assert fits == "#" * 70000
    assert isinstance(over, vllm_scrape.TooLarge)
    assert isinstance(silent, tornado.simple_httpclient.HTTPTimeoutError) and 0.5 <= waited < 30


# --- a scrape reads, never acts ---------------------------------------------------------------------


def test_vllm_metrics_come_from_ready_instances_only_each_labelled_with_its_deployment(
    served: dict[str, Any],
) -> None:
    server, key = served["server"], served["metrics"]
    first = read_metrics(server, key)
    second = read_metrics(server, key)
    vllm = {labels for (name, labels) in second if name == "vllm_num_requests_waiting"}
    assert vllm == {(("deployment", "llama"), ("engine", "0"), ("model_name", "llama"))}
    # broken's /metrics answers 500: left out, and counted once per scrape
    errors = "vllm_use_vllm_scrape_errors_total"
    assert value(second, errors, deployment="broken") - value(first, errors, deployment="broken") == 1
    assert value(second, errors, deployment="llama") == 0
    assert value(second, "vllm_use_deployment_state", deployment="broken", state="ready") == 1


def test_a_scrape_never_loads_an_instance_nor_moves_an_idle_timer(served: dict[str, Any]) -> None:
    server, key = served["server"], served["metrics"]
    llama = instance(server, "llama")
    assert llama["state"] == "ready" and llama["idle_deadline"] is not None
    for _ in range(3):
        samples = read_metrics(server, key)
    assert instance(server, "idle")["state"] == "unloaded"
    assert value(samples, "vllm_use_deployment_state", deployment="idle", state="unloaded") == 1
    assert value(samples, "vllm_use_deployment_state", deployment="idle", state="starting") == 0
    assert value(samples, "vllm_use_deployment_loads_total", deployment="idle") == 0
    assert value(samples, "vllm_use_deployment_loads_total", deployment="llama") == 1
    after = instance(server, "llama")
    assert (after["idle_deadline"], after["last_used"]) == (llama["idle_deadline"], llama["last_used"])


# --- a real Prometheus ------------------------------------------------------------------------------


def test_a_real_prometheus_scrapes_the_request_counter_and_token_totals_with_a_metrics_key(
    served: dict[str, Any], tmp_path: Path
) -> None:
    server, key, client = served["server"], served["metrics"], served["inference"]
    with scraping(tmp_path / "prometheus", server.base_url, key) as prometheus:
        base = read_metrics(server, key)
        answers = [chat(server, client, "tiny"), chat(server, client, "tiny", stream=True)]
        answers += [chat(server, client, "tiny", max_tokens=5) for _ in range(2)]
        assert [r.status_code for r in answers] == [200] * 4
        expected = {
            f'vllm_use_requests_total{{route="{CHAT}",deployment="",status="2xx"}}': value(
                base, "vllm_use_requests_total", route=CHAT, deployment="", status="2xx"
            )
            + 4
        }
        # the streamed answer carries no usage (not asked for): its tokens are the plain one's
        usages = [answers[0].json()["usage"], answers[0].json()["usage"]] + [
            r.json()["usage"] for r in answers[2:]
        ]
        for kind in ("prompt", "completion"):
            reported = sum(u[f"{kind}_tokens"] for u in usages)
            total = value(base, f"vllm_use_{kind}_tokens_total", deployment="") + reported
            expected[f'vllm_use_{kind}_tokens_total{{deployment=""}}'] = total
        assert b'"usage"' not in answers[1].content
        for query, wanted in expected.items():
            eventually(lambda q=query, w=wanted: prometheus.value(q) == w, timeout=30, interval=0.5)
        llama = 'vllm_num_requests_running{deployment="llama"}'
        assert (
            eventually(lambda: prometheus.query(llama), timeout=30, interval=0.5)[0]["metric"]["model_name"]
            == "llama"
        )
        assert json.dumps(prometheus.target_health()).count('"health": "up"') == 1


# --- the Grafana dashboard --------------------------------------------------------------------------

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "group_left",
    "group_right",
}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are no function, keyword,
    label matcher, grouping label or range."""
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)  # label matchers and ranges
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)  # grouping labels
    found = re.findall(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()", text)
    return set(found) - PROMQL_WORDS


def test_the_grafana_dashboard_queries_only_metrics_vllm_use_exposes(served: dict[str, Any]) -> None:
    server, key = served["server"], served["metrics"]
    text = server.fetch("/metrics", token=key).text
    exposed = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    queried: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        queried |= names
    for variable in dashboard["templating"]["list"]:
        queried |= set(re.findall(r"label_values\((\w+),", variable["query"]["query"]))
    assert queried <= exposed, sorted(queried - exposed)
    assert {
        "vllm_use_requests_total",
        "vllm_use_time_to_first_byte_seconds_bucket",
        "vllm_num_requests_running",
    } <= queried


def test_the_hooks_histograms_have_the_buckets_prometheus_clients_own_would() -> None:
    """The hook counts per bucket by hand (docs/performance.md): the exposition it gives equals
    that of prometheus_client's own Histogram fed the same values, bounds themselves included (a
    value on a bound is in that bound's `le` bucket), below the first bound and past the last."""
    values = [0.0, *DURATION_BUCKETS, *FIRST_BYTE_BUCKETS, 0.0001, 0.07, 3.3, 601.0, 10_000.0]
    metrics = Metrics()
    registry = CollectorRegistry()
    labels = ("route", "deployment")
    reference = {
        "vllm_use_request_duration_seconds": Histogram(
            "vllm_use_request_duration_seconds", "", labels, buckets=DURATION_BUCKETS, registry=registry
        ),
        "vllm_use_time_to_first_byte_seconds": Histogram(
            "vllm_use_time_to_first_byte_seconds", "", labels, buckets=FIRST_BYTE_BUCKETS, registry=registry
        ),
    }
    for v in values:
        metrics.request_ended("/v1/chat/completions", "llama", 200, v, v, None, None)
        for histogram in reference.values():
            histogram.labels("/v1/chat/completions", "llama").observe(v)

    def samples(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        return {
            f.name: sorted(
                (s.name, sorted(s.labels.items()), s.value)
                for s in f.samples
                if not s.name.endswith("_created")
            )
            for f in text_string_to_metric_families(text)
            if f.name in reference
        }

    ours = samples(render(CollectorRegistry(), metrics.snapshot()).decode())
    theirs = samples(generate_latest(registry).decode())
    assert ours == theirs and len(ours) == 2

"""The gateway in front of the real CPU vLLM (tiny model): the official SDKs end to end, and the
token accounting (docs/observability.md, "Token accounting") against what vLLM itself reports.

One vLLM start for the module (~20-60 s); chat, completions, responses and Anthropic messages,
streamed and not. Embeddings are tested on the fake upstream only (a generative model has none).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.prometheus import read_metrics, scraping, value
from tests.support.real_vllm import RealVllm, serving_real_vllm, settle
from tests.support.server import Server, eventually, free_port

try:  # anthropic >= 2 is built on httpx2 and refuses httpx clients
    import httpx2 as anthropic_httpx
except ImportError:  # pragma: no cover - older anthropic SDKs
    anthropic_httpx = httpx  # type: ignore[no-redef]

OPTIONS = {
    "served_model_name": "tiny",
    "dtype": "float32",
    "max_model_len": 512,
    "start_timeout_s": 300,
    "extra_args": [{"name": "--enforce-eager"}, {"name": "--kv-cache-memory-bytes", "values": ["64M"]}],
}


@pytest.fixture(scope="module")
def runtime_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory,
    real_vllm: RealVllm,
    tiny_models: tuple[Path, Path],
    runtime_port: int,
) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("gateway-real")
    flags = ("--runtime-port", str(runtime_port), "--model-aliases", "fast=tiny")
    with serving_real_vllm(tmp, real_vllm, {"tiny": tiny_models[0]}, *flags) as server:
        model = server.fetch("/api/models/local", "POST", json={"name": "tiny", "path": "tiny"}).json()[
            "model"
        ]
        # ?wait=: answers once vLLM is healthy (20-60 s, more on a busy machine) or failed.
        body = {"model_id": model["id"], "options": OPTIONS}
        r = settle(server, "/api/runtime/switch", body, start_timeout_s=OPTIONS["start_timeout_s"])
        assert r.status_code == 200, r.text
        yield server, server.create_key("inference")[1]
        server.fetch("/api/runtime/stop", "POST")


def test_openai_sdk_chat_and_completions_through_the_gateway(gateway: tuple[Server, str]) -> None:
    server, key = gateway
    client = openai.OpenAI(
        api_key=key,
        base_url=server.base_url + "/v1",
        http_client=httpx.Client(trust_env=False),
        max_retries=0,
    )
    reply = client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert reply.model == "tiny" and reply.choices[0].message.content is not None
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True
        )
        if c.choices
    ]
    assert len(pieces) >= 2
    completion = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8)
    assert completion.choices[0].text is not None
    streamed = list(client.completions.create(model="tiny", prompt="Once", max_tokens=8, stream=True))
    assert len(streamed) >= 2
    assert {m.id for m in client.models.list()} >= {"tiny", "fast"}


def test_openai_sdk_responses_through_the_gateway(gateway: tuple[Server, str]) -> None:
    server, key = gateway
    client = openai.OpenAI(
        api_key=key,
        base_url=server.base_url + "/v1",
        http_client=httpx.Client(trust_env=False),
        max_retries=0,
    )
    response = client.responses.create(model="tiny", input="Hello", max_output_tokens=16)
    assert response.status in ("completed", "incomplete")
    events = [
        event.type
        for event in client.responses.create(model="tiny", input="Hi", max_output_tokens=16, stream=True)
    ]
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")


def test_anthropic_sdk_messages_through_the_gateway(gateway: tuple[Server, str]) -> None:
    server, key = gateway
    client = anthropic.Anthropic(
        api_key=key,
        base_url=server.base_url,
        http_client=anthropic_httpx.Client(trust_env=False),
        max_retries=0,
    )
    message = client.messages.create(
        model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message.role == "assistant"
    with client.messages.stream(
        model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        events = [event.type for event in stream]
    assert events[0] == "message_start" and "message_stop" in events
    count = client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "Hello there"}])
    assert count.input_tokens > 0


# --- token accounting: what vLLM reports, asked directly ----------------------------------------

# Greedy and seeded, and one token forced by a large logit bias: the random tiny model's top tokens
# are near ties, which a busy machine's other summation order can flip, so without the bias two
# generations of the same request may differ. With it, the gateway's and a direct answer are the
# same tokens, whatever the load.
FORCED = {"temperature": 0, "seed": 7, "max_tokens": 6, "logit_bias": {"1000": 100}}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "one two three four"}], **FORCED}
PROMPT = {"model": "tiny", "prompt": "one two three four", **FORCED}


@pytest.fixture(scope="module")
def vllm_direct(gateway: tuple[Server, str], runtime_port: int) -> tuple[str, str]:
    """(origin, key) of the runtime's vLLM itself: its key is in its environment (VLLM_API_KEY),
    which this test, as the same user, may read, and no client of vllm-use ever sees."""
    server, _ = gateway
    for entry in Path("/proc").iterdir():
        try:
            if (
                not entry.name.isdigit()
                or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != server.proc.pid
            ):
                continue
            env = dict(
                item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item
            )
        except (OSError, IndexError, ValueError):
            continue
        if b"VLLM_API_KEY" in env:
            return f"http://127.0.0.1:{runtime_port}", env[b"VLLM_API_KEY"].decode()
    raise AssertionError("no vLLM child of the server found")


def normalised(answer: bytes) -> bytes:
    """Without what differs between two generations of the same tokens: ids and times."""
    answer = re.sub(rb'"id":"[^"]*"', b'"id":"-"', answer)
    return re.sub(rb'"created":[0-9]+', b'"created":0', answer)


def usage_event(stream: bytes) -> dict[str, Any] | None:
    """The usage of a chat or completions stream's usage event (`"choices":[]`), if it has one."""
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {") and (event := json.loads(line[6:])).get("choices") == []:
            return event["usage"]
    return None


def recorded(server: Server, request_id: str) -> tuple[int | None, int | None]:
    def row() -> dict[str, Any] | None:
        records = server.fetch("/api/requests/recent?limit=50").json()["requests"]
        return next((r for r in records if r["request_id"] == request_id), None)

    found = eventually(row, timeout=10)
    return found["prompt_tokens"], found["completion_tokens"]


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", PROMPT)])
def test_recorded_tokens_are_vllms_and_a_stream_is_what_vllm_sends_without_usage(
    gateway: tuple[Server, str], vllm_direct: tuple[str, str], path: str, body: dict[str, Any]
) -> None:
    server, key = gateway
    origin, vllm_key = vllm_direct
    client = httpx.Client(trust_env=False, timeout=120)

    def ask(base: str, secret: str, sent: dict[str, Any]) -> tuple[bytes, str]:
        request_id = "rq-" + uuid.uuid4().hex
        headers = {"Authorization": f"Bearer {secret}", "X-Request-ID": request_id}
        r = client.post(
            base + path,
            content=json.dumps(sent).encode(),
            headers=headers | {"Content-Type": "application/json"},
        )
        assert r.status_code == 200, r.text
        return r.content, request_id

    streamed = {**body, "stream": True}
    reference = usage_event(ask(origin, vllm_key, {**streamed, "stream_options": {"include_usage": True}})[0])
    assert reference is not None and reference["completion_tokens"] == 6
    expected = (reference["prompt_tokens"], reference["completion_tokens"])
    plain, plain_id = ask(server.base_url, key, body)
    assert (
        json.loads(plain)["usage"]["prompt_tokens"],
        json.loads(plain)["usage"]["completion_tokens"],
    ) == expected
    assert recorded(server, plain_id) == expected
    through, stream_id = ask(server.base_url, key, streamed)
    assert usage_event(through) is None
    assert normalised(through) == normalised(ask(origin, vllm_key, streamed)[0])
    assert recorded(server, stream_id) == expected


def test_responses_and_messages_streams_record_the_counts_vllm_reports(gateway: tuple[Server, str]) -> None:
    """Nothing is taken out of these streams: the counts vLLM put in them are the ones recorded."""
    server, key = gateway
    client = httpx.Client(trust_env=False, timeout=120)
    for path, body in (
        ("/v1/responses", {"model": "tiny", "input": "one two", "max_output_tokens": 5, "temperature": 0}),
        ("/v1/messages", {"model": "tiny", "messages": CHAT["messages"], "max_tokens": 5, "temperature": 0}),
    ):
        request_id = "rq-" + uuid.uuid4().hex
        streamed = client.post(
            server.base_url + path,
            json={**body, "stream": True},
            headers={"Authorization": f"Bearer {key}", "X-Request-ID": request_id},
        )
        assert streamed.status_code == 200, streamed.text
        events = [
            json.loads(line[6:]) for line in streamed.content.split(b"\n") if line.startswith(b"data: {")
        ]
        if path == "/v1/responses":
            usage = next(e["response"]["usage"] for e in events if e["type"] == "response.completed")
            reported = (usage["input_tokens"], usage["output_tokens"])
        else:
            start = next(e["message"]["usage"] for e in events if e["type"] == "message_start")
            delta = next(e["usage"] for e in events if e["type"] == "message_delta")
            reported = (start["input_tokens"], delta["output_tokens"])
        assert reported[0] > 0 and 0 < reported[1] <= 5, reported
        assert recorded(server, request_id) == reported, path


def test_a_real_prometheus_scrapes_the_gateway_and_the_real_vllm_behind_it(
    gateway: tuple[Server, str], tmp_path: Path
) -> None:
    """docs/observability.md, "Metrics": runtime.switch made `tiny` a deployment, so its requests
    and vLLM's own metrics carry deployment="tiny"."""
    server, key = gateway
    metrics_key = server.create_key("metrics", name="prometheus")[1]
    client = openai.OpenAI(
        api_key=key,
        base_url=server.base_url + "/v1",
        http_client=httpx.Client(trust_env=False),
        max_retries=0,
    )
    labels = {"route": "/v1/chat/completions", "deployment": "tiny", "status": "2xx"}
    chats = "vllm_use_requests_total{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    with scraping(tmp_path / "prometheus", server.base_url, metrics_key) as prometheus:
        before = read_metrics(server, metrics_key)
        message = [{"role": "user", "content": "Hello"}]
        reply = client.chat.completions.create(model="tiny", messages=message, max_tokens=8)
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=message,
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usages = [reply.usage, chunks[-1].usage]
        assert all(usage is not None for usage in usages)
        expected = {chats: value(before, "vllm_use_requests_total", **labels) + 2}
        for kind in ("prompt", "completion"):
            made = sum(getattr(usage, f"{kind}_tokens") for usage in usages)
            total = value(before, f"vllm_use_{kind}_tokens_total", deployment="tiny") + made
            expected[f'vllm_use_{kind}_tokens_total{{deployment="tiny"}}'] = total
        for query, wanted in expected.items():
            eventually(lambda q=query, w=wanted: prometheus.value(q) == w, timeout=30, interval=0.5)
        running = eventually(
            lambda: prometheus.query('vllm:num_requests_running{deployment="tiny"}'), timeout=30, interval=0.5
        )
    assert [sample["metric"]["model_name"] for sample in running] == ["tiny"]
    assert running[0]["metric"]["job"] == "vllm-use"

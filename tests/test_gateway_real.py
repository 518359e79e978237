"""The gateway in front of the real CPU vLLM (tiny model): the official SDKs end to end.

One vLLM start for the module (~20-60 s); chat, completions, responses and Anthropic messages,
streamed and not. Embeddings are tested on the fake upstream only (a generative model has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
def gateway(
    tmp_path_factory: pytest.TempPathFactory, real_vllm: RealVllm, tiny_models: tuple[Path, Path]
) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("gateway-real")
    flags = ("--runtime-port", str(free_port()), "--model-aliases", "fast=tiny")
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
        before = value(read_metrics(server, metrics_key), "vllm_use_requests_total", **labels)
        message = [{"role": "user", "content": "Hello"}]
        client.chat.completions.create(model="tiny", messages=message, max_tokens=8)
        list(client.chat.completions.create(model="tiny", messages=message, max_tokens=8, stream=True))
        eventually(lambda: prometheus.value(chats) == before + 2, timeout=30, interval=0.5)
        running = eventually(
            lambda: prometheus.query('vllm:num_requests_running{deployment="tiny"}'), timeout=30, interval=0.5
        )
    assert [sample["metric"]["model_name"] for sample in running] == ["tiny"]
    assert running[0]["metric"]["job"] == "vllm-use"

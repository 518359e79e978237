"""Resumable streams over HTTP (S5.1): attach, survive a disconnect, replay, stop, look up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, eventually, free_port, start_server

FAKE_VLLM = REPO / "tools" / "fake_vllm.py"
BODY = {
    "model": "tiny",
    "stream": True,
    "max_tokens": 60,
    "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(60))}],
}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    port = free_port()
    log = open(tmp_path / "fake.log", "wb")
    env = {**os.environ, "FAKE_VLLM_LOAD_SECONDS": "0.1", "FAKE_VLLM_TOKEN_SECONDS": "0.05"}
    fake = subprocess.Popen(
        [str(FAKE_VLLM), "serve", "tiny", "--port", str(port), "--served-model-name", "tiny"],
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    server = start_server(tmp_path / "data", "--upstream", f"http://127.0.0.1:{port}")
    eventually(lambda: httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200)
    server.keys = [server.create_key("inference")[1] for _ in range(2)]  # type: ignore[attr-defined]
    server.fake_log = tmp_path / "fake.log"  # type: ignore[attr-defined]
    yield server
    server.stop()
    os.killpg(fake.pid, signal.SIGKILL)
    fake.wait()
    log.close()


def auth(key: str, conv: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if conv:
        headers["X-Conversation-Id"] = conv
    return headers


def read_some(client: httpx.Client, url: str, headers: dict[str, str], n: int) -> bytes:
    got = b""
    with client.stream("POST", url, headers=headers, json=BODY) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            got += chunk
            if len(got) >= n:
                break
    return got


def test_a_dropped_client_resumes_with_the_exact_bytes(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        first = read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-a"), 300)
        r = client.get(gateway.base_url + "/v1/stream?conv_id=conv-a&from=0", headers=auth(key))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.content.startswith(first)
    assert r.content.endswith(b"data: [DONE]\n\n")
    with httpx.Client(trust_env=False, timeout=30) as client:
        tail = client.get(
            gateway.base_url + f"/v1/stream?conv_id=conv-a&from={len(first)}", headers=auth(key)
        )
    assert first + tail.content == r.content


def test_lookup_returns_only_the_ids_asked_for_and_owned(gateway: Any) -> None:
    mine, theirs = gateway.keys
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(mine, "conv-b"), 100)
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(mine, "conv-c"), 100)
        r = client.post(
            gateway.base_url + "/v1/streams/lookup",
            headers=auth(mine),
            json={"conversation_ids": ["conv-b", "unknown"]},
        )
        assert [s["conversation_id"] for s in r.json()["sessions"]] == ["conv-b"]
        assert set(r.json()["sessions"][0]) == {
            "conversation_id",
            "is_done",
            "total_bytes",
            "dropped_bytes",
            "started_at",
            "completed_at",
        }
        other = client.post(
            gateway.base_url + "/v1/streams/lookup",
            headers=auth(theirs),
            json={"conversation_ids": ["conv-b"]},
        )
        assert other.json() == {"sessions": []}
        assert (
            client.get(gateway.base_url + "/v1/stream?conv_id=conv-b", headers=auth(theirs)).status_code
            == 404
        )


def test_delete_stops_the_generation_and_is_idempotent(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-d"), 100)
        assert (
            client.delete(gateway.base_url + "/v1/stream?conv_id=conv-d", headers=auth(key)).status_code
            == 204
        )
        assert (
            client.delete(gateway.base_url + "/v1/stream?conv_id=conv-d", headers=auth(key)).status_code
            == 204
        )

        def done() -> bool:
            r = client.post(
                gateway.base_url + "/v1/streams/lookup",
                headers=auth(key),
                json={"conversation_ids": ["conv-d"]},
            )
            return r.json()["sessions"][0]["is_done"]

        eventually(done, timeout=5)
        replay = client.get(gateway.base_url + "/v1/stream?conv_id=conv-d&from=0", headers=auth(key))
    assert b"[DONE]" not in replay.content  # stopped before the end
    eventually(lambda: b"Aborted request" in gateway.fake_log.read_bytes(), timeout=5)


def test_a_stream_stopped_by_delete_while_its_client_reads_is_audited_as_canceled(gateway: Any) -> None:
    """The owner stopped it (499), the upstream did not fail (not 502); the reader sees an
    incomplete response, never a clean end of a truncated stream."""
    key = gateway.keys[0]
    headers = {**auth(key, "conv-stop"), "X-Request-ID": "stop-while-reading"}
    with httpx.Client(trust_env=False, timeout=30) as reader, httpx.Client(trust_env=False) as other:
        with reader.stream(
            "POST", gateway.base_url + "/v1/chat/completions", headers=headers, json=BODY
        ) as r:
            chunks = r.iter_raw()
            next(chunks)
            stop = other.delete(gateway.base_url + "/v1/stream?conv_id=conv-stop", headers=auth(key))
            assert stop.status_code == 204
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in chunks:
                    pass

    def record() -> list[dict[str, Any]]:
        recent = gateway.fetch("/api/requests/recent").json()["requests"]
        return [x for x in recent if x["request_id"] == "stop-while-reading"]

    (audited,) = eventually(record, timeout=5)
    assert audited["status"] == 499


def test_bad_offsets_are_400(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-e"), 100)
        time.sleep(0.2)
        for offset in ("-1", "abc", "99999999"):
            r = client.get(gateway.base_url + f"/v1/stream?conv_id=conv-e&from={offset}", headers=auth(key))
            assert r.status_code == 400, (offset, r.text)
        assert client.get(gateway.base_url + "/v1/stream", headers=auth(key)).status_code == 400


def test_without_a_conversation_id_a_disconnect_aborts_the_upstream(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key), 100)
    eventually(lambda: b"Aborted request" in gateway.fake_log.read_bytes(), timeout=1.5)

"""The console's event streams: downloads (docs/models-and-downloads.md), the runtime (docs/runtime.md)
and deployments (docs/router.md; its own events in tests/test_deployment_events.py).

Each sends the current state first, then each change, heartbeats while nothing happens, need
admin.read, and end cleanly when the client leaves or the server shuts down.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import fake_vllm_bin
from tests.support.server import Server, eventually, free_port, start_server
from tests.support.sse import StreamReader, quick_heartbeat_app
from vllm_use import app as app_mod
from vllm_use.runtime.supervisor import REAP_CAP_S

TOKEN = "events-test-admin-token-0123"
STREAMS = ["/api/downloads/events", "/api/runtime/events", "/api/deployments/events"]
START_TIMEOUT_S = 30


class Reader(StreamReader):
    """The runtime's events, by kind."""

    def states(self) -> list[str]:
        return [data["status"]["state"] for data in self.named("state")]

    def logs(self) -> list[dict[str, Any]]:
        return self.named("log")


@pytest.mark.parametrize("path", STREAMS)
def test_open_event_stream_does_not_hold_up_shutdown(tmp_path: Path, path: str) -> None:
    server = start_server(tmp_path / "data")
    reader = Reader(server, path)
    # Connected: the headers come before anything else (no download exists yet to send).
    assert reader.connected.wait(app_mod.SHUTDOWN_GRACE_S), "the stream did not answer"
    assert reader.status == 200

    assert server.stop(signal.SIGTERM) == 0

    # The stream ended with the server, not by the shutdown's timeout on open connections.
    assert reader.ended.wait(app_mod.SHUTDOWN_GRACE_S), "the event stream did not end at shutdown"
    assert "did not close within" not in server.log()


@pytest.mark.parametrize("path", STREAMS)
def test_event_streams_need_admin_read(shared_server: Server, path: str) -> None:
    _, writer = shared_server.create_key("admin.write", name="writer")
    _, agent = shared_server.create_key("mcp.admin", name="agent")
    assert shared_server.fetch(path, token=None).status_code == 401
    assert shared_server.fetch(path, token=agent).status_code == 401  # not an MCP tool
    refused = shared_server.fetch(path, token=writer)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"


@pytest.fixture
def runtime_server(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    """A server with the fake vLLM and one ready model `alpha`; yields it and the model's id."""
    vllm = fake_vllm_bin(tmp_path / "bin", spawn_children=2, max_lifetime=120)
    server = start_server(tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-port", str(free_port()))
    model = server.data_dir / "models" / "alpha"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    r = server.fetch("/api/models/local", "POST", json={"name": "alpha", "path": "alpha"})
    assert r.status_code == 201, r.text
    yield server, r.json()["model"]["id"]
    server.fetch("/api/runtime/stop", "POST")
    server.stop()


def test_runtime_events_send_the_state_first_then_each_change_and_the_new_log_lines(
    runtime_server: tuple[Server, str],
) -> None:
    server, model_id = runtime_server
    reader = Reader(server, "/api/runtime/events")
    quiet = Reader(server, "/api/runtime/events?log=false")  # the console's top bar
    eventually(lambda: reader.states() == ["stopped"] and reader.logs())
    eventually(lambda: quiet.states() == ["stopped"])
    assert reader.logs()[0]["reset"] is True  # the log as it is now (empty: nothing ran yet)

    body = {"model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}}
    accepted = server.fetch("/api/runtime/switch", "POST", json=body)
    assert accepted.status_code == 202, accepted.text
    eventually(lambda: "ready" in reader.states() or "failed" in reader.states(), timeout=START_TIMEOUT_S)
    assert server.fetch("/api/runtime/stop", "POST").json()["state"] == "stopped"
    eventually(lambda: reader.states()[-1] == "stopped", timeout=REAP_CAP_S)

    assert reader.states() == ["stopped", "starting", "ready", "stopping", "stopped"]
    statuses = [data["status"] for name, data in reader.events if name == "state"]
    assert statuses[1]["pgid"] == accepted.json()["pgid"]
    assert statuses[1]["start_timeout_s"] == START_TIMEOUT_S
    assert statuses[2]["upstream"] == f"http://127.0.0.1:{statuses[2]['port']}"
    # The new vLLM's log starts afresh (reset) after its `starting`, then its lines follow in order.
    starting = next(
        i for i, (name, data) in enumerate(reader.events) if data.get("status", {}).get("state") == "starting"
    )
    first = next(data for name, data in reader.events[starting:] if name == "log")
    assert first["reset"] is True

    def followed() -> list[str]:
        after = [data for name, data in reader.events[starting:] if name == "log"]
        return [line for data in after for line in data["lines"]]

    whole = server.fetch("/api/runtime/logs").json()["lines"]
    eventually(lambda: followed() == whole)  # the last lines may trail the last state
    assert any("Initializing a V1 LLM engine" in line for line in whole)
    eventually(lambda: quiet.states() == reader.states())
    assert quiet.logs() == []  # the same states, and none of the log's lines


@pytest.mark.parametrize("value", ["", "yes", "False", "0"])
def test_runtime_events_take_log_true_or_false_and_nothing_else(shared_server: Server, value: str) -> None:
    refused = shared_server.fetch(f"/api/runtime/events?log={value}")
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "invalid_arguments"
    assert refused.json()["error"]["errors"][0]["loc"] == ["log"]
    # The credential is checked first: without one, the answer says nothing about the query.
    assert shared_server.fetch(f"/api/runtime/events?log={value}", token=None).status_code == 401


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yield from quick_heartbeat_app(tmp_path / "data", TOKEN, monkeypatch)


@pytest.mark.parametrize("path", STREAMS)
@pytest.mark.gen_test(timeout=10)
async def test_heartbeats_flow_and_a_disconnect_unsubscribes(app, http_server, http_port, path: str) -> None:
    context = app.context
    source = {"downloads": context.downloads, "runtime": context.runtime, "deployments": context.instances}[
        path.split("/")[2]
    ]
    before = set(source._listeners)  # the runtime's: the deployments follow it from the start
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    await writer.drain()
    received = b""
    while received.count(b": heartbeat") < 2:
        received += await asyncio.wait_for(reader.read(4096), 5)
    assert b"text/event-stream" in received
    assert len(source._listeners - before) == 1
    writer.close()  # the client goes away
    for _ in range(50):
        if source._listeners == before:
            break
        await asyncio.sleep(0.05)
    assert source._listeners == before

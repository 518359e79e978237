"""The console's event streams: downloads (docs/models-and-downloads.md) and the runtime (docs/runtime.md).

Both send the current state first, then each change, heartbeats while nothing happens, need
admin.read, and end cleanly when the client leaves or the server shuts down.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from handlers import events
from tests.fakes import fake_vllm_bin
from tests.support.server import ADMIN_TOKEN, Server, eventually, free_port, start_server
from vllm_use import app as app_mod
from vllm_use import config as config_mod
from vllm_use.runtime.supervisor import REAP_CAP_S

TOKEN = "events-test-admin-token-0123"
STREAMS = ["/api/downloads/events", "/api/runtime/events"]
START_TIMEOUT_S = 30


class Reader:
    """An SSE client in a thread: `events` collects (name, data) in order; `connected` is set once
    the answer's headers are in, `ended` once the stream is over."""

    def __init__(self, server: Server, path: str, token: str = ADMIN_TOKEN) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.status: int | None = None
        self.connected = threading.Event()
        self.ended = threading.Event()
        self._url, self._token = server.base_url + path, token
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The read timeout outlasts a heartbeat: a quiet stream is not a dead one.
        with httpx.Client(timeout=events.HEARTBEAT_S * 2, trust_env=False) as client:
            headers = {"Authorization": f"Bearer {self._token}"}
            try:
                with client.stream("GET", self._url, headers=headers) as r:
                    self.status = r.status_code
                    self.connected.set()
                    name = "message"
                    for line in r.iter_lines():
                        if line.startswith("event:"):
                            name = line[6:].strip()
                        elif line.startswith("data:"):
                            self.events.append((name, json.loads(line[5:])))
            except httpx.HTTPError:
                pass  # the server going away may also cut the stream
            finally:
                self.connected.set()
                self.ended.set()

    def states(self) -> list[str]:
        return [data["status"]["state"] for name, data in list(self.events) if name == "state"]

    def logs(self) -> list[dict[str, Any]]:
        return [data for name, data in list(self.events) if name == "log"]


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
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "data")])
    context = app_mod.build_context(config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": TOKEN}))
    application = app_mod.make_app(context)
    application.context = context
    yield application
    app_mod.shutdown(context)


@pytest.mark.parametrize("path", STREAMS)
@pytest.mark.gen_test(timeout=10)
async def test_heartbeats_flow_and_a_disconnect_unsubscribes(app, http_server, http_port, path: str) -> None:
    source = app.context.downloads if "downloads" in path else app.context.runtime
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    await writer.drain()
    received = b""
    while received.count(b": heartbeat") < 2:
        received += await asyncio.wait_for(reader.read(4096), 5)
    assert b"text/event-stream" in received
    assert len(source._listeners) == 1
    writer.close()  # the client goes away
    for _ in range(50):
        if not source._listeners:
            break
        await asyncio.sleep(0.05)
    assert not source._listeners

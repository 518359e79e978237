"""`GET /api/deployments/events` (docs/router.md, "Events"): every deployment when a client connects,
then each one whose state may have changed, as `deployments.get` shows it when the event is sent;
`deleted` once it is gone. Reading it loads nothing and is not use.

What every event stream of the console shares (admin.read, heartbeats, a disconnect unsubscribes,
shutdown ends it) is tested for this one too in tests/test_events.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import fake_vllm_bin
from tests.support.deployments import register
from tests.support.server import Server, eventually, free_port, start_server
from tests.support.sse import StreamReader, quick_heartbeat_app
from vllm_use.runtime.supervisor import REAP_CAP_S, TERM_GRACE_S

PATH = "/api/deployments/events"
START_TIMEOUT_S = 60  # the fake is healthy within a second; the bound only ends a hang
STOP_S = TERM_GRACE_S + REAP_CAP_S  # an unload: SIGTERM, the grace, then the reaper's cap
TOKEN = "deployment-events-admin-token-0123"


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Server]:
    """A server whose deployments run the fake vLLM on a few free ports."""
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300)
    first = free_port()
    srv = start_server(tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}")
    yield srv
    srv.stop()


def deploy(server: Server, name: str, model_id: str, **fields: Any) -> dict[str, Any]:
    body = {"name": name, "model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}, **fields}
    r = server.fetch("/api/deployments", "POST", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def shown(server: Server, name: str) -> dict[str, Any]:
    r = server.fetch(f"/api/deployments/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def latest(reader: StreamReader, name: str) -> dict[str, Any] | None:
    """The last event about `name`: its deployment, or {"deleted": name}."""
    found = None
    for event, data in list(reader.events):
        if event == "deployment" and data["deployment"]["name"] == name:
            found = data["deployment"]
        elif event == "deleted" and data["name"] == name:
            found = {"deleted": name}
    return found


def test_a_new_stream_sends_every_deployment_in_name_order_as_get_shows_it(router: Server) -> None:
    model_id = register(router, "alpha")
    for name in ("beta", "alpha", "org/gamma"):
        deploy(router, name, model_id, aliases=[f"{name}-alias"])
    _, reader_key = router.create_key("admin.read", name="reader")  # a key, not only the admin token

    reader = StreamReader(router, PATH, token=reader_key)
    eventually(lambda: len(reader.named("deployment")) == 3)
    assert reader.status == 200
    sent = [data["deployment"] for data in reader.named("deployment")]
    assert [d["name"] for d in sent] == ["alpha", "beta", "org/gamma"]
    assert sent == router.fetch("/api/deployments").json()["deployments"]
    assert all(data["type"] == "deployment" for data in reader.named("deployment"))


def test_each_change_sends_the_deployment_as_it_is_then(router: Server) -> None:
    model_id = register(router, "alpha")
    reader = StreamReader(router, PATH)
    assert reader.connected.wait(10) and reader.status == 200
    assert reader.events == []  # no deployment yet: nothing to send

    created = deploy(router, "llama", model_id, idle_timeout_s=600)
    eventually(lambda: latest(reader, "llama") == created)
    assert created["instance"]["state"] == "unloaded"

    r = router.fetch("/api/deployments/llama", "PATCH", json={"pinned": True, "aliases": ["ll"]})
    assert r.status_code == 200, r.text
    eventually(lambda: latest(reader, "llama") == r.json())

    r = router.fetch(
        f"/api/deployments/llama/load?wait={START_TIMEOUT_S}", "POST", timeout=START_TIMEOUT_S + 10
    )
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    eventually(lambda: (latest(reader, "llama") or {}).get("instance", {}).get("state") == "ready")
    ready = latest(reader, "llama")
    assert ready == shown(router, "llama")
    # Sent as it was when sent: the idle timer armed at `ready` is in the event.
    assert ready["instance"]["port"] == r.json()["port"] and ready["instance"]["idle_deadline"]

    r = router.fetch("/api/deployments/llama/unload", "POST", timeout=STOP_S + 10)
    assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
    eventually(lambda: (latest(reader, "llama") or {}).get("instance", {}).get("state") == "unloaded", STOP_S)
    assert latest(reader, "llama") == shown(router, "llama")
    assert latest(reader, "llama")["instance"]["idle_deadline"] is None

    assert router.fetch("/api/deployments/llama", "DELETE").status_code == 200
    eventually(lambda: latest(reader, "llama") == {"deleted": "llama"})
    assert reader.named("deleted") == [{"type": "deleted", "name": "llama"}]


def test_reading_the_stream_loads_nothing_and_is_not_use(router: Server) -> None:
    model_id = register(router, "alpha")
    deploy(router, "cold", model_id)
    deploy(router, "warm", model_id, idle_timeout_s=600)
    r = router.fetch(
        f"/api/deployments/warm/load?wait={START_TIMEOUT_S}", "POST", timeout=START_TIMEOUT_S + 10
    )
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    before = {name: shown(router, name) for name in ("cold", "warm")}
    assert before["warm"]["instance"]["idle_deadline"] and before["warm"]["instance"]["last_used"] is None

    readers = [StreamReader(router, PATH) for _ in range(3)]
    for reader in readers:
        eventually(lambda reader=reader: len(reader.named("deployment")) == 2)
        assert {d["deployment"]["name"]: d["deployment"] for d in reader.named("deployment")} == before
    # Still nothing loaded, used or re-armed, and no stream has anything more to say.
    assert {name: shown(router, name) for name in ("cold", "warm")} == before
    assert all(len(reader.events) == 2 for reader in readers)


def test_events_is_reserved_and_the_stream_wins_over_a_deployment_of_that_name(router: Server) -> None:
    model_id = register(router, "alpha")
    r = router.fetch("/api/deployments", "POST", json={"name": "events", "model_id": model_id})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["loc"] == ["name"]
    assert router.fetch("/api/deployments").json()["deployments"] == []
    for path in (PATH, PATH + "/"):
        reader = StreamReader(router, path)
        assert reader.connected.wait(10) and reader.status == 200


# --- coalescing, in this process ---------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yield from quick_heartbeat_app(tmp_path / "data", TOKEN, monkeypatch)


async def next_event(reader: asyncio.StreamReader, buffer: bytearray) -> tuple[str, Any]:
    """The next event or heartbeat of a chunked SSE answer: ("heartbeat", None) or (name, data)."""
    while True:
        end = buffer.find(b"\n\n")
        if end >= 0:
            block, buffer[:] = bytes(buffer[:end]), buffer[end + 2 :]
            text = block.decode()
            if ": heartbeat" in text:
                return "heartbeat", None
            if "data:" in text:
                name = text.split("event: ", 1)[1].split("\n", 1)[0]
                return name, json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])
            continue  # the headers, or a chunk's size line
        buffer += await asyncio.wait_for(reader.read(65536), 5)


@pytest.mark.gen_test(timeout=10)
async def test_a_burst_of_changes_is_one_event_with_the_state_when_it_is_sent(
    app, http_server, http_port
) -> None:
    instances = app.context.instances
    record = {"name": "x", "model_id": "0" * 32, "options": {}, "aliases": [], "idle_timeout_s": 0}
    instances.set_names([record])
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    await writer.drain()
    buffer = bytearray()
    name, data = await next_event(reader, buffer)
    assert name == "deployment" and data["deployment"]["instance"]["in_flight"] == 0
    assert await next_event(reader, buffer) == ("heartbeat", None)  # it waits for changes now

    for _ in range(50):  # 50 changes before the stream's turn comes: one event, as things are then
        instances.begin("x")
    received = []
    while len([e for e in received if e[0] == "heartbeat"]) < 2:  # then quiet again
        received.append(await next_event(reader, buffer))
    sent = [data for name, data in received if name == "deployment"]
    assert len(sent) == 1 and sent[0]["deployment"]["instance"]["in_flight"] == 50

    instances.set_names([])  # deleted: its name comes once more, and the stream says it is gone
    event = await next_event(reader, buffer)
    while event[0] == "heartbeat":
        event = await next_event(reader, buffer)
    assert event == ("deleted", {"type": "deleted", "name": "x"})
    writer.close()

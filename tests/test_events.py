"""The download event stream (S4.2): heartbeats, clean end on disconnect and at shutdown."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from handlers import events
from tests.conftest import ADMIN_TOKEN, start_server
from vllm_use import app as app_mod
from vllm_use import config as config_mod

TOKEN = "events-test-admin-token-0123"


def test_open_event_stream_does_not_hold_up_shutdown(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    received: list[bytes] = []
    ended = threading.Event()

    def listen() -> None:
        with httpx.Client(timeout=30, trust_env=False) as client:
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            try:
                with client.stream("GET", server.base_url + "/api/downloads/events", headers=headers) as r:
                    for chunk in r.iter_raw():
                        received.append(chunk)
            except httpx.HTTPError:
                pass  # the server going away may also cut the stream
        ended.set()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 5
    assert ended.wait(5), "the event stream did not end at shutdown"


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "data")])
    context = app_mod.build_context(config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": TOKEN}))
    application = app_mod.make_app(context)
    application.context = context
    yield application
    app_mod.shutdown(context)


@pytest.mark.gen_test(timeout=10)
async def test_heartbeats_flow_and_a_disconnect_unsubscribes(app, http_server, http_port) -> None:
    manager = app.context.downloads
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(
        f"GET /api/downloads/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    received = b""
    while received.count(b": heartbeat") < 2:
        received += await asyncio.wait_for(reader.read(4096), 5)
    assert b"text/event-stream" in received
    assert len(manager._listeners) == 1
    writer.close()  # the client goes away
    for _ in range(50):
        if not manager._listeners:
            break
        await asyncio.sleep(0.05)
    assert not manager._listeners

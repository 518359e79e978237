"""A Server-Sent Events client for the tests of the console's event streams (handlers/events.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tornado.web

from handlers import events
from tests.support.server import ADMIN_TOKEN, Client
from vllm_use import app as app_mod
from vllm_use import config as config_mod


def quick_heartbeat_app(
    data_dir: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tornado.web.Application]:
    """The application in this process, its event streams beating every 0.2 s, for a fixture to
    `yield from` (pytest-tornado's `app`); `.context` is its AppContext, shut down at the end."""
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(data_dir)])
    context = app_mod.build_context(config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": token}))
    application = app_mod.make_app(context)
    application.context = context  # type: ignore[attr-defined]
    yield application
    app_mod.shutdown(context)


class StreamReader:
    """An SSE client in a thread: `events` collects (name, data) in order; `connected` is set once
    the answer's headers are in, `ended` once the stream is over."""

    def __init__(self, server: Client, path: str, token: str = ADMIN_TOKEN) -> None:
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

    def named(self, name: str) -> list[dict[str, Any]]:
        """The data of the events called `name` so far, in order."""
        return [data for event, data in list(self.events) if event == name]

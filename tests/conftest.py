"""Fixtures that build the real thing: a `vllm-use serve` child on loopback with its own SQLite."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakehub import fake_hub  # noqa: F401 - a fixture for every test module

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
MCP_VERSION = "2026-07-28"
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eventually(condition: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll `condition()` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


@dataclass
class Server:
    """A running `vllm-use serve` child and a small client for it."""

    base_url: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    admin_token: str | None = ADMIN_TOKEN
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30, trust_env=False))

    def fetch(
        self,
        path: str,
        method: str = "GET",
        *,
        json: Any = None,
        token: str | None = "admin",
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request. `timeout` (seconds) replaces the client's default for a call whose answer
        waits on work (e.g. `?wait=` on a vLLM start): tie it to that work, never guess."""
        hdrs = dict(headers or {})
        if token == "admin":
            token = self.admin_token
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return self.client.request(
            method, self.base_url + path, json=json, headers=hdrs, content=content, **extra
        )

    def mcp(self, method: str, params: dict[str, Any] | None = None, *, token: str | None) -> httpx.Response:
        """One well-formed MCP 2026-07-28 request (headers and `_meta` as the SDK sends them)."""
        params = dict(params or {})
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "pytest", "version": "0"},
        }
        headers = {"MCP-Protocol-Version": MCP_VERSION, "Mcp-Method": method, "Accept": "application/json"}
        if method == "tools/call":
            headers["Mcp-Name"] = params["name"]
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return self.fetch("/mcp", "POST", json=body, token=token, headers=headers)

    def create_key(self, *scopes: str, name: str = "test key") -> tuple[str, str]:
        r = self.fetch("/api/keys", "POST", json={"name": name, "scopes": list(scopes)})
        assert r.status_code == 201, r.text
        body = r.json()
        return body["key"]["id"], body["secret"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.client.close()


def start_server(
    data_dir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    admin_token: str | None = ADMIN_TOKEN,
    wait: bool = True,
) -> Server:
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"server-{port}.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    child_env.update({"VLLM_USE_LOG_LEVEL": "info", "PYTHONUNBUFFERED": "1"})
    if admin_token:
        child_env["VLLM_USE_ADMIN_TOKEN"] = admin_token
    child_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "vllm_use",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *extra,
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=child_env, cwd=REPO)
    server = Server(f"http://127.0.0.1:{port}", data_dir, log_path, proc, admin_token)
    if wait:
        try:
            eventually(lambda: _healthy(server), timeout=20)
        except AssertionError:
            server.stop(signal.SIGKILL)
            raise AssertionError("server did not start:\n" + server.log()) from None
    return server


def _healthy(server: Server) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError("server exited early:\n" + server.log())
    try:
        return server.client.get(server.base_url + "/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "data")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a module's read-mostly tests."""
    srv = start_server(tmp_path_factory.mktemp("shared") / "data")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (tests/browser.py), one per test module."""
    from tests.browser import launch

    with launch() as (_, chromium):
        yield chromium

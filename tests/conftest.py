"""Fixtures that build the real thing, and the fence that keeps every test on loopback.

Fixtures: `server` (a fresh vllm-use for one test: a `vllm-use serve` child, or the same
Application in this process where the module is marked `pytestmark = pytest.mark.in_process`),
`shared_server` (one child for a module's read-mostly tests), `browser`, `fake_hub`; and, from the
plugin modules in `pytest_plugins`, `real_vllm` and `tiny_models` (tests/support/real_vllm.py). The
helpers behind them (`start_server`, `start_app`, `Server`, `eventually`, `free_port`…) live in
tests/support/server.py, the fakes in tests/fakes/.

The network fence (no test reaches beyond loopback):

- In this process, `socket.getaddrinfo` and `socket.socket.connect`/`connect_ex` refuse anything
  that is not loopback (`LookupRefused`, `ConnectRefused`: `OSError`s, as a machine without a
  network answers), and the test fails even if the code under test swallowed the error.
- Every child (servers, `hf`, vLLM, the fuzzer…) inherits an environment that sends hub and proxy
  traffic to `sentinel`, a loopback listener that answers 403 and records what it was asked:
  `HF_ENDPOINT` (when a test gives no fake hub), `HTTP(S)_PROXY`/`ALL_PROXY` (with `NO_PROXY` for
  loopback), `HF_HUB_DISABLE_XET` (the fake hub speaks plain HTTP), telemetry and update checks
  off, and `HF_HOME` in a temporary directory. A test during which the sentinel was asked
  anything fails with what was asked. Two children are fenced their own way: Chromium ignores
  the proxy and resolves no name but loopback's (tests/support/browser.py), and the MCP Inspector,
  which cannot use a proxy, runs without one (it only talks to loopback).
"""

from __future__ import annotations

import ast
import errno
import functools
import ipaddress
import os
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.hub import FakeHub
from tests.support import REPO
from tests.support.server import Client, Server, start_app, start_server

# Fixtures defined in plugin modules, for every test module (none imports a fixture by name).
pytest_plugins = ["tests.support.real_vllm"]


# --- the network fence ---------------------------------------------------------------------------------

_LOOPBACK_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_local(host: object) -> bool:
    """Loopback (127.0.0.0/8, ::1, localhost), or the unspecified address a listener binds to."""
    if host is None:
        return True  # getaddrinfo(None, port): the address to bind a listener to
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%", 1)[0].rstrip(".").lower()
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


class LookupRefused(socket.gaierror):
    """A name beyond loopback was looked up in the test process."""


class ConnectRefused(ConnectionRefusedError):
    """A connection beyond loopback was attempted in the test process."""


_FENCE = "tests/conftest.py: no test may reach beyond loopback"
refused: list[str] = []  # what this process tried, in order; each test fails on what it added
_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not is_local(host):
        refused.append(f"this process looked up {host!r}")
        raise LookupRefused(socket.EAI_NONAME, f"{_FENCE}: looking up {host!r}")
    return _real_getaddrinfo(host, *args, **kwargs)


def _beyond_loopback(sock: socket.socket, address: Any) -> str | None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address:
        if not is_local(address[0]):
            return f"{address[0]}:{address[1] if len(address) > 1 else '?'}"
    return None  # loopback, or a Unix socket


def _guarded_connect(self: socket.socket, address: Any) -> None:
    target = _beyond_loopback(self, address)
    if target:
        refused.append(f"this process connected to {target}")
        raise ConnectRefused(errno.ECONNREFUSED, f"{_FENCE}: connecting to {target}")
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    target = _beyond_loopback(self, address)
    if target:
        refused.append(f"this process connected to {target}")
        return errno.ECONNREFUSED
    return _real_connect_ex(self, address)


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]


class _SentinelHandler(socketserver.StreamRequestHandler):
    timeout = 5

    def handle(self) -> None:
        try:
            line = self.rfile.readline(8192).decode("latin-1").strip()
            host = ""
            for _ in range(200):
                header = self.rfile.readline(8192)
                if header in (b"", b"\r\n", b"\n"):
                    break
                if header[:5].lower() == b"host:":
                    host = header[5:].strip().decode("latin-1")
        except OSError:
            line, host = "", ""
        self.server.record(f"a child asked {line or '(nothing)'!r}" + (f" for {host}" if host else ""))  # type: ignore[attr-defined]
        body = f"{_FENCE}: use a fake (tests/fakes/hub.py, tests/fakes/upstream.py)\n".encode()
        try:
            self.wfile.write(
                b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                + f"X-Error-Message: {_FENCE}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        except OSError:
            pass


class Sentinel(socketserver.ThreadingTCPServer):
    """A loopback listener where children's hub and proxy traffic ends: it answers 403 and records
    the request line, so a test during which anything arrived here fails with what was asked."""

    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        self.asked: list[str] = []
        super().__init__(("127.0.0.1", 0), _SentinelHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, name="network-sentinel", daemon=True).start()

    def record(self, what: str) -> None:
        self.asked.append(what)


sentinel = Sentinel()
_HF_HOME = tempfile.mkdtemp(prefix="vllm-use-tests-hf-home-")
# Children inherit these (vllm-use passes them on through `config.child_env`'s allow-list).
FENCED_ENV = {
    "HF_ENDPOINT": sentinel.url,  # a test with a fake hub sets its own
    "HF_HOME": _HF_HOME,  # no token, cache or config from the machine's ~/.cache/huggingface
    "HF_HUB_DISABLE_XET": "1",  # the fake hub speaks plain HTTP, never the xet protocol
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    **{name: sentinel.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
    **{name.lower(): sentinel.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
    "NO_PROXY": "127.0.0.1,localhost,::1",
    "no_proxy": "127.0.0.1,localhost,::1",
}
os.environ.update(FENCED_ENV)


def _network_attempts() -> list[str]:
    return refused + sentinel.asked


_reported = 0


@pytest.fixture(autouse=True)
def _stays_on_loopback() -> Iterator[None]:
    """Fails the test (at teardown, so after its own fixtures) if it tried to reach the network."""
    global _reported
    yield
    attempts = _network_attempts()
    new, _reported = attempts[_reported:], len(attempts)
    if new:
        pytest.fail("this test tried to reach beyond loopback:\n  " + "\n  ".join(new), pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    late = _network_attempts()[_reported:]  # e.g. while a module's shared fixtures were torn down
    if late:
        print("\nbeyond loopback, outside any test:\n  " + "\n  ".join(late), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@functools.cache
def _on_the_real_vllm(path: str) -> bool:
    """A test module that starts the real vLLM asks for the `real_vllm` or `shared_vllm` fixture
    (tests/support/real_vllm.py) by a parameter of that name, in a test or a fixture."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.arg) and node.arg in ("real_vllm", "shared_vllm") for node in ast.walk(tree)
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (`make test`), with the modules on the real vLLM as one file: each module
    runs on one worker, in order (its module fixtures start once, and some tests build on the ones
    before), and the real vLLM starts on one worker at a time (two at once starve each other on
    two cores). The controller sees only node ids, so the modules are told apart by their text."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    real = "the real vLLM"

    class RealFirst(OrderedDict):
        """The work queue, handing out the real vLLM's modules first: they are the longest unit
        (minutes of vLLM starts, on one worker), so started last they would be the run's tail while
        the other worker sits idle. xdist otherwise orders the units by their number of tests."""

        def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
            if not last and real in self:
                return real, self.pop(real)
            return super().popitem(last)

    class ByFile(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.workqueue = RealFirst()

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return real if _on_the_real_vllm(path) else path

    return ByFile(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HF_HOME, ignore_errors=True)


# --- fixtures -------------------------------------------------------------------------------------------


def in_process(node: pytest.Item | pytest.Collector) -> bool:
    """A module marked `pytestmark = pytest.mark.in_process` gets in-process `server`s."""
    return node.get_closest_marker("in_process") is not None


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Client]:
    """A fresh vllm-use for one test: a child, or in-process where the module is marked so."""
    srv = (start_app if in_process(request.node) else start_server)(tmp_path / "data")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a module's read-mostly tests (a child: the module's `server`s may be in-process,
    and only one in-process app may run at a time)."""
    srv = start_server(tmp_path_factory.mktemp("shared") / "data")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (tests/support/browser.py), one per test module."""
    from tests.support.browser import launch

    with launch() as (_, chromium):
        yield chromium


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    """A started `FakeHub` (tests/fakes/hub.py), stopped after the test."""
    with FakeHub() as hub:
        yield hub

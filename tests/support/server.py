"""A vllm-use to test, and the helpers every test shares.

Two ways to run the real application:

- `start_server`: a `vllm-use serve` child on loopback with its own SQLite. For what needs a
  process: signals, exit statuses, start-up, children and their environment, the server's log as a
  file, measurements of the process.
- `start_app`: the same Application (`vllm_use.app.build_context` and `vllm_use.app.run`) in a
  thread of this process, with its own event loop, on a loopback port. Same `fetch`/`mcp`/
  `create_key`/`log`/`stop`; a start costs milliseconds instead of a Python start-up (~0.9 s on two
  cores).

The `server` and `shared_server` fixtures (tests/conftest.py) start them for a test or a module.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import REPO
from vllm_use.runtime import procfs

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
MCP_VERSION = "2026-07-28"
START_TIMEOUT_S = 120.0  # a `vllm-use serve` child answers /healthz in ~1 s; this bounds a hang


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


def serve_env(env: dict[str, str] | None, admin_token: str | None) -> dict[str, str]:
    """The environment of a server under test: ours (fenced) less any `VLLM_USE_*`, then `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    environ.update({"VLLM_USE_LOG_LEVEL": "info", "PYTHONUNBUFFERED": "1"})
    if admin_token:
        environ["VLLM_USE_ADMIN_TOKEN"] = admin_token
    environ.update(env or {})
    return environ


class Client:
    """What a test does with a running vllm-use, child or in-process: `fetch`, `mcp`, `create_key`,
    `log()`, `stop()`."""

    base_url: str
    data_dir: Path
    admin_token: str | None
    client: httpx.Client

    def log(self) -> str:
        raise NotImplementedError

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        raise NotImplementedError

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


def _new_client() -> httpx.Client:
    return httpx.Client(timeout=30, trust_env=False)


# --- vllm-use serve as a child -------------------------------------------------------------------------


@dataclass
class Server(Client):
    """A running `vllm-use serve` child and a small client for it."""

    base_url: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    admin_token: str | None = ADMIN_TOKEN
    client: httpx.Client = field(default_factory=_new_client)

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
    nofile: int | None = None,
    repo: Path = REPO,
) -> Server:
    """`vllm-use serve` as a child on a free loopback port; `nofile` caps its RLIMIT_NOFILE (soft and
    hard) for the tests of running out of descriptors; `repo` is the tree whose code runs (another
    checkout: tools/bench_gateway.py --baseline).

    Between `free_port()` and the child's bind another process (another xdist worker) may take the
    port: the child then exits saying so ("cannot listen on …: Address already in use"), and it is
    started again on another port, up to PORT_TRIES times."""
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return _start_server(data_dir, extra, env, admin_token, wait, nofile, repo)
        except PortTaken:
            if attempt == PORT_TRIES:
                raise
    raise AssertionError("unreachable")


PORT_TRIES = 3


class PortTaken(AssertionError):
    """The child could not bind its port: another process took it after `free_port()`."""


def _start_server(
    data_dir: Path,
    extra: tuple[str, ...],
    env: dict[str, str] | None,
    admin_token: str | None,
    wait: bool,
    nofile: int | None,
    repo: Path,
) -> Server:
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"server-{port}.log"
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

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=serve_env(env, admin_token),
            cwd=repo,
            preexec_fn=limit if nofile is not None else None,
        )
    server = Server(f"http://127.0.0.1:{port}", data_dir, log_path, proc, admin_token)
    if wait:
        try:
            # An exit ends the wait at once (`_healthy` raises); the deadline only bounds a hang.
            eventually(lambda: _healthy(server, port), timeout=START_TIMEOUT_S)
        except AssertionError:
            server.stop(signal.SIGKILL)
            log = server.log()
            if f"cannot listen on 127.0.0.1:{port}: Address already in use" in log:
                raise PortTaken(log) from None
            raise AssertionError("server did not start:\n" + log) from None
    return server


def _healthy(server: Server, port: int) -> bool:
    """Our child answers on `port`. A 200 alone is not enough: between `free_port()` and the
    child's bind, another process (another xdist worker's server, a second test run) may take the
    port, and its /healthz would answer for ours. So every socket listening there must be the
    child's own (the rule the supervisor applies to vLLM's port, docs/runtime.md)."""
    if server.proc.poll() is not None:
        raise AssertionError("server exited early:\n" + server.log())
    try:
        if server.client.get(server.base_url + "/healthz").status_code != 200:
            return False
    except httpx.TransportError:
        return False
    return listens_only_in(port, [server.proc.pid])


def listens_only_in(port: int, pids: list[int]) -> bool:
    """Whether someone listens on 127.0.0.1:`port` and every such socket is held by one of `pids`."""
    listening = procfs.listening_inodes(port)
    return bool(listening) and listening <= procfs.socket_inodes(pids)


# --- the same application in this process ----------------------------------------------------------------

# The loggers whose lines `vllm-use serve` writes to its log (and the asyncio loop's errors).
_SERVER_LOGGERS = ("vllm_use", "handlers", "tornado", "peewee", "asyncio")


class _SignalsAsCalls(asyncio.SelectorEventLoop):
    """An event loop for a thread other than the main one, where no signal can be received:
    `add_signal_handler` records the callback and `deliver(sig)` runs it, as the signal would."""

    def __init__(self) -> None:
        super().__init__()
        self.signal_handlers: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        self.stoppable = threading.Event()  # SIGTERM has a handler: `run` is serving

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:
        self.signal_handlers[sig] = (callback, args)
        if sig == signal.SIGTERM:
            self.stoppable.set()

    def remove_signal_handler(self, sig: int) -> bool:
        return self.signal_handlers.pop(sig, None) is not None

    def deliver(self, sig: int) -> None:
        callback, args = self.signal_handlers[sig]
        self.call_soon_threadsafe(callback, *args)


class _Reaper(threading.Thread):
    """tornado's `Subprocess` learns that a child exited from SIGCHLD, which only the main thread
    can receive; an app in another thread never would. This thread collects exits instead (the same
    `waitpid(pid, WNOHANG)` over the children tornado waits for) and hands each to its loop."""

    INTERVAL_S = 0.01
    started: _Reaper | None = None

    def __init__(self) -> None:
        super().__init__(name="subprocess-reaper", daemon=True)

    @classmethod
    def ensure(cls) -> None:
        from tornado.process import Subprocess

        Subprocess._initialized = True  # never `add_signal_handler(SIGCHLD)` from a loop: we reap
        if cls.started is None:
            cls.started = cls()
            cls.started.start()

    def run(self) -> None:
        from tornado.process import Subprocess

        while True:
            time.sleep(self.INTERVAL_S)
            for pid in list(Subprocess._waiting):
                try:
                    Subprocess._try_cleanup_process(pid)
                except (RuntimeError, KeyError):  # its loop is closed; the app has gone
                    Subprocess._waiting.pop(pid, None)


class _LogLines(logging.Handler):
    """The lines `vllm-use serve` would write to its log (its `configure_logging` format)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".", 1)[0] in _SERVER_LOGGERS

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + "\n")


@dataclass
class AppServer(Client):
    """The real Application in a thread of this process: `vllm_use.app.run` on an event loop of its
    own, on a loopback port; the same client API as `Server`. `stop()` delivers SIGTERM to it (as
    the signal handler `run` installed) and returns `run`'s exit status; `log()` is what it logged.

    One at a time: `vllm_use.storage` binds its models to one database per process.
    """

    base_url: str
    data_dir: Path
    admin_token: str | None
    thread: threading.Thread
    loop: _SignalsAsCalls
    logs: _LogLines
    status: list[int]  # run's exit status, once it returned
    client: httpx.Client = field(default_factory=_new_client)

    def log(self) -> str:
        return "".join(self.logs.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        global _running_app
        assert sig in (signal.SIGTERM, signal.SIGINT), "an in-process server can only be asked to stop"
        if self.thread.is_alive():
            self.loop.deliver(sig)
        self.thread.join(timeout)
        self.client.close()
        if self.thread.is_alive():
            raise AssertionError(f"the in-process server did not stop within {timeout} s:\n" + self.log())
        logging.getLogger().removeHandler(self.logs)
        if _running_app is self:
            _running_app = None
        return self.status[0]


_running_app: AppServer | None = None


def start_app(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None, admin_token: str | None = ADMIN_TOKEN
) -> AppServer:
    """`start_server`'s twin for an app in this process. `extra` are `vllm-use serve` flags and `env`
    may set options (`VLLM_USE_*`); what its children inherit is this process's environment, so a
    test that gives children an environment of its own needs `start_server`."""
    from vllm_use import config as config_mod

    global _running_app
    assert _running_app is None, "one in-process server at a time: stop the other one first"
    assert all(k.startswith("VLLM_USE_") for k in env or {}), (
        f"start_app runs in this process, so its children cannot get {sorted(env or {})}: use start_server"
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # free_port() may lose its port to another process before the bind
        port = free_port()
        argv = ["serve", "--port", str(port), "--data-dir", str(data_dir), *extra]
        config = config_mod.load(config_mod.build_parser().parse_args(argv), serve_env(env, admin_token))
        app = _start_app(config, data_dir, admin_token)
        if not app.status:
            _running_app = app
            return app
        if "cannot listen" not in app.log():
            break
    raise AssertionError("the in-process server did not start:\n" + app.log())


def _start_app(config: Any, data_dir: Path, admin_token: str | None) -> AppServer:
    from vllm_use import app as app_mod
    from vllm_use import config as config_mod

    _Reaper.ensure()
    logs = _LogLines()
    logging.getLogger().addHandler(logs)
    levels = {name: logging.getLogger(name).level for name in _SERVER_LOGGERS}
    for name in ("vllm_use", "handlers", "tornado"):
        logging.getLogger(name).setLevel(config.log_level.upper())
    loop = _SignalsAsCalls()
    status: list[int] = []
    log = logging.getLogger("vllm_use")

    def serve() -> None:  # what `vllm_use.cli.main` does after parsing, on this thread's loop
        asyncio.set_event_loop(loop)
        try:
            for warning in config_mod.start_warnings(config):
                log.warning("%s", warning)
            try:
                context = app_mod.build_context(config)
            except config_mod.ConfigError as exc:
                log.error("vllm-use: refusing to start: %s", exc)
                status.append(2)
                return
            try:
                status.append(loop.run_until_complete(app_mod.run(context)))
            except OSError as exc:
                log.error("vllm-use: cannot listen on %s:%d: %s", config.host, config.port, exc.strerror)
                app_mod.shutdown(context)
                status.append(1)
            except BaseException:
                log.exception("the in-process server failed")
                status.append(1)
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)

    thread = threading.Thread(target=serve, name=f"vllm-use-{config.port}", daemon=True)
    app = AppServer(f"http://127.0.0.1:{config.port}", data_dir, admin_token, thread, loop, logs, status)
    thread.start()
    while not loop.stoppable.wait(0.01) and thread.is_alive():
        pass
    if not loop.stoppable.is_set():  # it ended instead: the status and the log say why
        thread.join()
        logging.getLogger().removeHandler(logs)
    return app

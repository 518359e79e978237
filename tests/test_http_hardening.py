"""The HTTP surface under abuse: aborted uploads, early refusals, slow bodies, connection floods,
descriptor exhaustion, big bodies, and the small parsing traps (docs/security.md).

Most tests drive a real `vllm-use serve` child over raw sockets (the requests are deliberately
malformed or cut short, which HTTP clients refuse to send) and read its resources from /proc.
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tornado.netutil
import tornado.web
from tornado.httpclient import AsyncHTTPClient

from tests.fakes.upstream import FakeUpstream, running
from tests.support import REPO
from tests.support.server import ADMIN_TOKEN, Server, eventually, start_server
from vllm_use import app as app_mod
from vllm_use import config as config_mod

MIB = 1024 * 1024
ROUTES = ("/api/keys", "/mcp", "/v1/chat/completions", "/v1/streams/lookup", "/api/downloads/events")


# --- helpers ------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def bytes_read(pid: int) -> int:
    """Everything the process read through read()/recv() so far (/proc/<pid>/io rchar)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def queues(local_port: int, remote_port: int) -> tuple[int, int] | None:
    """(tx_queue, rx_queue) of the loopback TCP socket local_port → remote_port, from /proc/net/tcp."""
    want = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == want:
            tx, rx = fields[4].split(":")
            return int(tx, 16), int(rx, 16)
    return None


def host_port(server: Server) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").split(":")
    return host, int(port)


def connect(server: Server, timeout: float = 15) -> socket.socket:
    return socket.create_connection(host_port(server), timeout=timeout)


def head(method: str, path: str, headers: list[tuple[str, str]] | dict[str, str] = ()) -> bytes:
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    if not any(name.lower() == "host" for name, _ in items):
        items.insert(0, ("Host", "localhost"))
    lines = [f"{method} {path} HTTP/1.1", *(f"{name}: {value}" for name, value in items)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lowercased names, last value wins
    body: bytes
    raw_head: bytes


def read_answer(sock: socket.socket) -> Answer:
    """One HTTP/1.1 response with a Content-Length, read from `sock` (its timeout applies)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    raw_head, _, rest = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Answer(int(lines[0].split()[1]), headers, rest[:length], raw_head)


def closed_by_server(sock: socket.socket) -> bool:
    """Block (the socket's timeout) until the server ends the connection; True once it has."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def healthz(server: Server) -> int | None:
    try:
        return server.client.get(server.base_url + "/healthz", timeout=5).status_code
    except Exception:
        return None


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("hardening") / "data",
        "--upstream",
        upstream.url,
        "--model-aliases",
        "fast=tiny",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keys(gw: Server) -> dict[str, str]:
    """Secrets for each surface, each verified once (a key's first use pays for scrypt)."""
    secrets = {
        "inference": gw.create_key("inference")[1],
        "mcp": gw.create_key("mcp.read")[1],
        "admin": ADMIN_TOKEN,
    }
    for secret in secrets.values():
        gw.fetch("/api/system", token=secret)
    return secrets


def credential(route: str, keys: dict[str, str]) -> str:
    if route.startswith("/v1"):
        return keys["inference"]
    return keys["mcp"] if route == "/mcp" else keys["admin"]


# --- hanging up mid-body frees everything ------------------------------------------------------------


def live_handlers() -> int:
    """vllm-use's request handlers still alive, without collecting garbage: a handler only a
    reference cycle keeps counts (with the body it held, it would wait for the next full
    collection). The fake upstream's, in its thread, are not ours."""
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, tornado.web.RequestHandler) and type(o).__module__.startswith("handlers.")
    )


async def abort_upload(port: int, route: str, secret: str | None, sent: int, declared: int) -> None:
    """Announce a body of `declared` bytes, send `sent` of them, hang up."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    verb = "GET" if route.endswith("/events") else "POST"
    headers = {"Content-Length": str(declared), "Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    writer.write(head(verb, route, headers) + b"x" * sent)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.fixture
def context(tmp_path: Path) -> Iterator[Any]:
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "data")])
    built = app_mod.build_context(config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN}))
    yield built
    app_mod.shutdown(built)


@pytest.fixture
def relaying(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Any]:
    """A context whose gateway relays to the fake upstream, for an in-process server."""
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--upstream", upstream.url]
    args = config_mod.build_parser().parse_args(argv)
    built = app_mod.build_context(config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN}))
    yield built
    app_mod.shutdown(built)


@pytest.mark.gen_test(timeout=120)
async def test_streams_their_clients_cut_leave_no_request_handler_alive(
    relaying: Any, upstream: FakeUpstream
) -> None:
    """A stream whose client leaves ends in an `UpstreamError` (the upstream connection is cut):
    its traceback must not keep the handler alive (handlers/gateway.py, `Exchange.pipe`)."""
    server = app_mod.make_server(relaying)
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
    port = sock.getsockname()[1]
    server.add_sockets([sock])
    client = AsyncHTTPClient(force_instance=True)
    upstream.endless = True
    try:
        created = await client.fetch(
            f"http://127.0.0.1:{port}/api/keys",
            method="POST",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            body=json.dumps({"name": "streams", "scopes": ["inference"]}),
        )
        secret = json.loads(created.body)["secret"]
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        request = (
            head(
                "POST",
                "/v1/chat/completions",
                {
                    "Authorization": f"Bearer {secret}",
                    "Content-Type": "application/json",
                    "Content-Length": str(len(body)),
                },
            )
            + body.encode()
        )
        gc.collect()
        gc.disable()  # what is freed below is freed by its last reference going, not by a collection
        baseline = live_handlers()
        for _ in range(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answer = b""
            while answer.count(b"data: ") < 3:  # the head, then pieces relayed after it
                more = await reader.read(65536)
                assert more, answer
                answer += more
            writer.close()
            await writer.wait_closed()
        deadline = time.monotonic() + 30
        while live_handlers() > baseline and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert live_handlers() <= baseline
    finally:
        gc.enable()
        upstream.endless = False
        client.close()
        server.stop()
        await server.close_all_connections()


@pytest.mark.gen_test(timeout=120)
async def test_aborted_uploads_leave_no_request_handler_alive(context: Any) -> None:
    server = app_mod.make_server(context)
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
    port = sock.getsockname()[1]
    server.add_sockets([sock])
    client = AsyncHTTPClient(force_instance=True)
    try:
        base = f"http://127.0.0.1:{port}"
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        secrets = {"admin": ADMIN_TOKEN}
        for scope, name in (("inference", "inference"), ("mcp.read", "mcp")):
            created = await client.fetch(
                base + "/api/keys",
                method="POST",
                headers=admin,
                body=json.dumps({"name": name, "scopes": [scope]}),
            )
            secrets[name] = json.loads(created.body)["secret"]
        for route in ROUTES:  # every credential verified once, so later checks hit the cache
            await client.fetch(
                base + "/api/system",
                headers={"Authorization": f"Bearer {credential(route, secrets)}"},
                raise_error=False,
            )
        gc.collect()
        gc.disable()  # what is freed below is freed by its last reference going, not by a collection
        baseline = live_handlers()
        for route in ROUTES:
            for batch in range(10):  # 200 per route: 100 with a valid credential, 100 without
                await asyncio.gather(
                    *(
                        abort_upload(
                            port,
                            route,
                            credential(route, secrets) if (batch + i) % 2 else None,
                            16 * 1024,
                            256 * 1024,
                        )
                        for i in range(20)
                    )
                )
        deadline = time.monotonic() + 30
        while live_handlers() > baseline and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert live_handlers() <= baseline, [
            type(o).__name__ for o in gc.get_objects() if isinstance(o, tornado.web.RequestHandler)
        ][:10]
    finally:
        gc.enable()
        client.close()
        server.stop()
        await server.close_all_connections()


def test_aborted_uploads_give_back_memory_and_descriptors(gw: Server, keys: dict[str, str]) -> None:
    pid = gw.proc.pid
    _, port = host_port(gw)
    plans = {  # route: (uploads, bytes sent of each, declared length)
        "/v1/chat/completions": (40, 4 * MIB, 16 * MIB),
        "/v1/streams/lookup": (40, 4 * MIB, 16 * MIB),
        "/api/downloads/events": (200, 256 * 1024, 1 * MIB),
        "/api/keys": (200, 256 * 1024, 1 * MIB),
        "/mcp": (200, 256 * 1024, 1 * MIB),
    }

    async def round_of() -> int:
        sent = 0
        for route, (count, size, declared) in plans.items():
            for _ in range(count):
                await abort_upload(port, route, credential(route, keys), size, declared)
                sent += size
        return sent

    def settled_rss() -> int:
        previous = [rss_kib(pid)]

        def steady() -> bool:
            time.sleep(0.2)
            now = rss_kib(pid)
            done = now <= previous[0]
            previous[0] = now
            return done

        eventually(steady, timeout=30)
        return previous[0]

    asyncio.run(round_of())  # warm-up: the allocator's pools, the key cache, the audit queue
    fds_before = open_fds(pid)
    rss_before = settled_rss()
    sent = sum(asyncio.run(round_of()) for _ in range(3))
    rss_after = settled_rss()
    # A leak keeps every body received (~1 GiB here); freed ones are reused, after a small high-water
    # mark of the allocator's.
    assert (rss_after - rss_before) * 1024 < sent // 4, (rss_before, rss_after, sent)
    eventually(lambda: open_fds(pid) <= fds_before, timeout=15)
    assert healthz(gw) == 200


# --- refusals come at once, then the connection closes ----------------------------------------------


REFUSALS = [
    pytest.param("/v1/chat/completions", {}, 16 * MIB, 401, id="v1-no-credential"),
    pytest.param(
        "/v1/chat/completions", {"Authorization": "inference"}, 16 * MIB + 1, 413, id="v1-too-large"
    ),
    pytest.param("/v1/messages", {"X-API-Key": "vu_" + "B" * 48}, 1000, 401, id="v1-messages-bad-key"),
    pytest.param("/api/keys", {}, MIB, 401, id="api-no-credential"),
    pytest.param("/api/keys", {"Authorization": "admin"}, MIB + 1, 413, id="api-too-large"),
    pytest.param(
        "/mcp", {"Authorization": "mcp", "Origin": "http://evil.example"}, 1000, 403, id="mcp-origin"
    ),
    pytest.param("/mcp", {"Authorization": "mcp", "Host": "evil.example"}, 1000, 403, id="mcp-host"),
]


def _headers(spec: dict[str, str], keys: dict[str, str]) -> dict[str, str]:
    out = dict(spec)
    if "Authorization" in out:
        out["Authorization"] = f"Bearer {keys[out['Authorization']]}"
    return out


@pytest.mark.parametrize(("route", "spec", "declared", "status"), REFUSALS)
def test_a_refusal_is_answered_before_the_body_and_the_connection_closed(
    gw: Server, keys: dict[str, str], route: str, spec: dict[str, str], declared: int, status: int
) -> None:
    with connect(gw) as sock:
        sock.sendall(head("POST", route, {**_headers(spec, keys), "Content-Length": str(declared)}))
        answer = read_answer(sock)  # nothing of the body was sent
        assert answer.status == status, answer
        assert answer.headers["connection"] == "close"
        assert int(answer.headers["content-length"]) == len(answer.body) > 0
        assert answer.headers["cache-control"] == "no-store"
        assert closed_by_server(sock)


def test_a_refusal_sends_no_100_continue_and_an_accepted_body_gets_one(
    gw: Server, keys: dict[str, str]
) -> None:
    with connect(gw) as sock:
        sock.sendall(head("POST", "/api/keys", {"Content-Length": "1000", "Expect": "100-continue"}))
        answer = read_answer(sock)
        assert answer.status == 401 and not answer.raw_head.startswith(b"HTTP/1.1 100")
    body = json.dumps({"name": "x", "scopes": ["inference"]}).encode()
    with connect(gw) as sock:
        headers = {
            "Content-Length": str(len(body)),
            "Expect": "100-continue",
            "Authorization": f"Bearer {ADMIN_TOKEN}",
        }
        sock.sendall(head("POST", "/api/keys", headers))
        assert sock.recv(64).startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        assert read_answer(sock).status == 201


def test_a_client_that_sent_its_whole_small_body_reads_the_refusal(gw: Server) -> None:
    body = b'{"model":"tiny","messages":[{"role":"user","content":"' + b"x" * (256 * 1024) + b'"}]}'
    for _ in range(20):
        with connect(gw) as sock:
            sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": str(len(body))}) + body)
            answer = read_answer(sock)  # a reset would lose it
            assert answer.status == 401
            assert json.loads(answer.body)["error"]["code"] == "unauthenticated"


def test_a_client_still_sending_the_body_it_announced_reads_the_refusal(gw: Server) -> None:
    # Closed at once, the socket would answer the rest of the body with a reset, and the client
    # would fail on its next send without reading the 401 waiting for it (curl does).
    piece = b"x" * (16 * 1024)
    for _ in range(5):
        with connect(gw) as sock:
            sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": str(8 * len(piece))}))
            assert select.select([sock], [], [], 15)[0], "no answer before the body"
            for _ in range(8):  # the body goes on, a little at a time, after the answer came
                sock.sendall(piece)
                time.sleep(0.02)
            assert read_answer(sock).status == 401
            assert closed_by_server(sock)


def test_a_refused_body_is_not_read_to_the_end(gw: Server) -> None:
    pid = gw.proc.pid
    before = bytes_read(pid)
    with connect(gw) as sock:
        sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": str(16 * MIB)}))
        try:
            for _ in range(16):
                sock.sendall(b"x" * MIB)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed while we were sending: what this test wants
        assert closed_by_server(sock)
    # The answer needs none of it; what is read is the lingering close's bounded drain.
    assert bytes_read(pid) - before < 4 * MIB


def test_a_body_that_grows_past_the_cap_while_it_streams_in_is_refused_at_once(gw: Server) -> None:
    pid = gw.proc.pid
    before = bytes_read(pid)
    with connect(gw) as sock:
        headers = {"Transfer-Encoding": "chunked", "Authorization": f"Bearer {ADMIN_TOKEN}"}
        sock.sendall(head("POST", "/api/keys", headers))
        chunk = b"%x\r\n" % (64 * 1024) + b"x" * (64 * 1024) + b"\r\n"
        try:
            for _ in range(16 * 32):  # up to 32 MiB, never finished
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_server(sock)
    assert bytes_read(pid) - before < 8 * MIB


def test_a_refusal_without_a_body_keeps_the_connection_for_the_next_request(gw: Server) -> None:
    with connect(gw) as sock:
        sock.sendall(head("GET", "/api/system"))
        first = read_answer(sock)
        assert first.status == 401 and first.headers.get("connection") != "close"
        sock.sendall(head("GET", "/api/system", {"Authorization": f"Bearer {ADMIN_TOKEN}"}))
        assert read_answer(sock).status == 200


def test_a_body_that_stops_coming_is_cut_off_after_the_body_timeout(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--body-timeout", "1")
    try:
        with connect(server, timeout=30) as sock:
            headers = {"Content-Length": "1000", "Authorization": f"Bearer {ADMIN_TOKEN}"}
            sock.sendall(head("POST", "/api/keys", headers) + b'{"name":')
            assert closed_by_server(sock)  # within the socket's 30 s, a second after the last byte
        assert healthz(server) == 200
    finally:
        server.stop()


# --- the connection cap, and running out of descriptors -------------------------------------------------


def test_connections_over_the_cap_get_a_503_and_are_closed(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--max-connections", "4")
    held: list[socket.socket] = []
    server.client.close()  # its kept-alive connection from the start-up check would count
    server.client = httpx.Client(timeout=30, trust_env=False)

    def hold_one() -> bool:
        sock = connect(server)
        sock.sendall(head("GET", "/healthz"))
        if read_answer(sock).status != 200:  # the server has yet to see an earlier close
            sock.close()
            return False
        held.append(sock)  # served, and kept open (keep-alive)
        return True

    try:
        for _ in range(4):
            eventually(hold_one, timeout=10)
        for _ in range(30):
            with connect(server) as extra:
                extra.sendall(head("GET", "/healthz"))
                answer = read_answer(extra)
                assert answer.status == 503
                assert answer.headers["connection"] == "close" and answer.headers["retry-after"] == "1"
                assert closed_by_server(extra)
        held.pop().close()
        eventually(lambda: healthz(server) == 200, timeout=10)
        assert server.log().count("connection limit (4) reached") in (1, 2)  # once per 5 s, not per refusal
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_the_default_cap_is_what_the_open_file_limit_allows(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", nofile=256)
    try:
        assert "(at most 32 connections)" in server.log()  # (256 - 192 reserved) / 2 per connection
    finally:
        server.stop()


def test_a_slow_body_flood_under_a_low_open_file_limit_leaves_the_server_serving(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", nofile=256)
    pid = server.proc.pid
    flood: list[socket.socket] = []
    try:
        fds_before = open_fds(pid)
        log_before = server.log_path.stat().st_size
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
        for _ in range(300):  # no credential, a body announced and barely started
            try:
                sock = connect(server, timeout=5)
                sock.sendall(head("POST", "/v1/chat/completions", {"Content-Length": str(MIB)}) + b"{" * 100)
                flood.append(sock)
            except OSError:
                pass
        eventually(lambda: healthz(server) == 200, timeout=20)  # while the flood is still connected
        time.sleep(3)  # the attack goes on
        cpu, wall = cpu_seconds(pid) - cpu_before, time.monotonic() - wall_before
        assert cpu < 0.5 * wall, (cpu, wall)  # it used to spin at 100 %
        assert healthz(server) == 200
        assert server.log_path.stat().st_size - log_before < 256 * 1024  # it used to write MBs a second
        assert "Traceback" not in server.log()
    finally:
        for sock in flood:
            sock.close()
    try:
        eventually(lambda: open_fds(pid) <= fds_before, timeout=15)
    finally:
        server.stop()


ACCEPT_SERVER = """
import asyncio, logging, tornado.netutil, tornado.web
from handlers.server import GuardedHTTPServer

class Health(tornado.web.RequestHandler):
    def get(self):
        self.write("ok")

async def main():
    server = GuardedHTTPServer(tornado.web.Application([(r"/healthz", Health)]), max_connections=10000)
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets([sock])
    print(sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()

logging.basicConfig(level=logging.INFO)
asyncio.run(main())
"""


def test_accept_steps_back_instead_of_spinning_when_descriptors_run_out(tmp_path: Path) -> None:
    # The server is told it may hold 10000 connections, and the kernel allows it 64 descriptors:
    # accept() fails with EMFILE, the case the start-up cap normally keeps away.
    log_path = tmp_path / "accept.log"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", ACCEPT_SERVER],
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=REPO,
            preexec_fn=limit,
        )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(100):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        eventually(lambda: "descriptors exhausted" in log_path.read_text(), timeout=10)
        cpu_before, wall_before = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(3)  # connections keep waiting in the backlog meanwhile
        cpu, wall = cpu_seconds(proc.pid) - cpu_before, time.monotonic() - wall_before
        assert cpu < 0.5 * wall, (cpu, wall)
        log = log_path.read_text()
        assert log.count("descriptors exhausted") <= 2 and "Traceback" not in log, log[-2000:]
        for sock in held:
            sock.close()
        held.clear()

        def healthy() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(head("GET", "/healthz"))
                    return read_answer(sock).status == 200
            except OSError:
                return False

        eventually(healthy, timeout=15)
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        proc.wait()


# --- a big body is scanned off the IOLoop ----------------------------------------------------------


class HeldUpstream:
    """A raw upstream that answers a first request, then holds back from reading the next one until
    `release()`, so a test can see whether the gateway has sent it anything yet."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self.bodies: list[bytes] = []
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _read_request(self, conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        raw_head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in raw_head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += conn.recv(MIB)
        return body

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.conn = conn
        for turn in range(2):
            if turn:
                self._go.wait(60)
                readable, _, _ = select.select([conn, self.listener], [], [], 60)
                if self.listener in readable and conn not in readable:  # the kept-alive one expired
                    conn, _ = self.listener.accept()
            self.bodies.append(self._read_request(conn))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    def untouched(self) -> bool:
        """Nothing new reached the upstream: no byte on the kept-alive connection, no new connection."""
        assert self.conn is not None
        readable, _, _ = select.select([self.conn, self.listener], [], [], 0)
        return not readable

    def release(self) -> None:
        self._go.set()
        self._thread.join(60)

    def close(self) -> None:
        self._go.set()
        self.listener.close()
        if self.conn is not None:
            self.conn.close()


def test_healthz_answers_while_a_16_mib_body_is_scanned(tmp_path: Path) -> None:
    upstream = HeldUpstream()
    server = start_server(
        tmp_path / "data", "--upstream", f"http://127.0.0.1:{upstream.port}", "--model-aliases", "fast=tiny"
    )
    try:
        _, secret = server.create_key("inference")
        auth = {"Authorization": f"Bearer {secret}"}
        assert (
            server.fetch("/v1/chat/completions", "POST", token=secret, json={"model": "fast"}).status_code
            == 200
        )
        # Many small messages: the kind of body whose parse on the IOLoop stalled it for a second.
        item = b'{"role":"user","content":"hi"},'
        head_bytes = b'{"model":"fast","messages":['
        body = head_bytes + item * ((16 * MIB - 64) // len(item)) + b'{"role":"user","content":"end"}]}'
        with connect(server, timeout=60) as big, connect(server, timeout=60) as probe:
            big.sendall(
                head("POST", "/v1/chat/completions", {**auth, "Content-Length": str(len(body))}) + body
            )
            client_port, server_port = big.getsockname()[1], host_port(server)[1]
            # The server has read the whole body once neither side of the connection holds any of it.
            eventually(
                lambda: (
                    queues(client_port, server_port) == (0, 0) and queues(server_port, client_port) == (0, 0)
                ),
                timeout=30,
                interval=0.002,
            )
            for _ in range(3):  # while the body is scanned, the loop answers, again and again
                probe.sendall(head("GET", "/healthz"))
                assert read_answer(probe).status == 200
                assert upstream.untouched(), "the body reached the upstream before /healthz was answered"
            upstream.release()
            assert read_answer(big).status == 200
        assert upstream.bodies[1] == body.replace(b'{"model":"fast"', b'{"model":"tiny"', 1)
    finally:
        upstream.close()
        server.stop()


# --- small traps ---------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/api/keys", "/mcp", "/v1/chat/completions", "/v1/streams/lookup"])
def test_a_content_length_that_is_not_ascii_digits_is_400(
    gw: Server, keys: dict[str, str], route: str
) -> None:
    for value in (b"\xb2", b"\xb9\xb2", b"1e3", b"-1", b" 12x"):  # "²" and "¹²" pass str.isdigit()
        with connect(gw) as sock:
            line = f"POST {route} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {credential(route, keys)}\r\n"
            sock.sendall(line.encode() + b"Content-Length: " + value + b"\r\n\r\n")
            answer = read_answer(sock)
            assert answer.status == 400, (value, answer)
    assert "Traceback" not in gw.log()


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("verb", "route", "body"),
    [
        ("POST", "/api/keys", '{"name":' + _deep(100_000) + ',"scopes":["inference"]}'),
        ("POST", "/api/keys", '{"name":' + _deep(900) + ',"scopes":["inference"]}'),
        ("PUT", "/api/settings", _deep(100_000)),
        ("POST", "/api/test", '{"a":' + _deep(100_000) + "}"),
        ("POST", "/mcp", _deep(100_000)),
        ("POST", "/v1/chat/completions", '{"model":"tiny","messages":' + _deep(100_000) + "}"),
        ("POST", "/v1/chat/completions", _deep(100_000)),
        ("POST", "/v1/messages", '{"model":"tiny","messages":' + _deep(100_000) + "}"),
        ("POST", "/v1/streams/lookup", '{"conversation_ids":' + _deep(100_000) + "}"),
    ],
    ids=lambda v: v if len(v) < 30 else f"{len(v)} bytes",
)
def test_json_nested_100k_deep_is_400_on_every_route(
    gw: Server, keys: dict[str, str], upstream: FakeUpstream, verb: str, route: str, body: str
) -> None:
    upstream.reset()
    headers = {"Content-Type": "application/json"}
    if route == "/mcp":
        headers |= {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
    r = gw.fetch(route, verb, token=credential(route, keys), content=body.encode(), headers=headers)
    assert r.status_code == 400, r.text[:300]
    assert upstream.requests == []
    assert "Traceback" not in gw.log()


@pytest.mark.parametrize(
    "path",
    [
        "//etc/passwd",
        "//etc/nope",
        "/js/../package.json",
        "/js/%2e%2e/package.json",
        "/js/..%2fpackage.json",
        "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/js%5c..%5cpackage.json",
        "/js\\..\\package.json",
        "/index.html%00.js",
        "/./index.html",
        "/js//api.js",
        "/models/../../etc/passwd",
    ],
)
def test_static_paths_that_could_leave_the_console_are_404(gw: Server, path: str) -> None:
    conn = http.client.HTTPConnection(*host_port(gw), timeout=30)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 404, (path, body[:200])
    assert b"root:" not in body and b'"name"' not in body


def test_client_routes_and_console_files_are_still_served(gw: Server) -> None:
    for path, kind in (("/", "text/html"), ("/models/abc", "text/html"), ("/js/api.js", "javascript")):
        r = gw.client.get(gw.base_url + path)
        assert r.status_code == 200 and kind in r.headers["content-type"], path
    assert gw.client.get(gw.base_url + "/js/nope.js").status_code == 404

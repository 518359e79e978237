"""Benchmark of the inference gateway `/v1/*` (docs/gateway.md) against a fast fake upstream (issue 5,
Performance).

Not a test: it prints numbers, compared against targets, for docs/performance.md. One run starts

- a fake upstream: a small Tornado app in a child process on loopback. `POST /v1/chat/completions`
  answers a small JSON, or with `"stream": true` 64 SSE chunks written and flushed as fast as it
  can, then vLLM's end: the terminal chunk, the usage event when `stream_options.include_usage`
  asks for it (the gateway asks, and takes it out: docs/observability.md), `data: [DONE]`;
- a real `vllm-use serve` child (tests.conftest.start_server) with `--upstream` pointing at it,
  `--model-aliases fast=tiny` and one `inference` key (verified once before timing);

- the references of issue 18, on a fake upstream of their own: Debian's nginx (`proxy_buffering off`,
  keep-alive upstream, an access log, one worker) when installed (`make bench` installs it), a
  bare Tornado relay (Tornado's simple client, a chunk written and flushed as it comes, nothing else),
  and the protocol relay (an asyncio protocol on uvloop with vllm-use's upstream pool and nothing
  else: the floor of a relay off Tornado's HTTP server);

and measures, at concurrency 1 and 32, streaming and not, against the upstream called directly, the
gateway (alias + key), the gateway with `X-Conversation-Id` (the resumable stream buffer) and the
references (`--no-references` leaves them out):
requests/s, chunks/s, TTFB and total latency p50/p99, CPU time per request of the gateway and of
the upstream (utime+stime from /proc/<pid>/stat), and the sockets in TIME-WAIT to or from the
upstream's port (/proc/net/tcp{,6}). Then the p99 of `GET /healthz` (a separate process, one
keep-alive connection) alone and while 32 streams run through the gateway. Finally issue 18's
targets, each a ratio to a row of the same run: CPU per stream against nginx's, streaming throughput
against the direct one, the added TTFB, CPU per small request against the bare relay's.

Clients are asyncio streams on keep-alive connections, one per concurrent slot: lighter than an
HTTP library, but on 2 cores the client still competes with the gateway and the upstream for CPU.
With `--baseline REV` (by default the commit before issue 16, `BASELINE`) the gateway of that revision
runs beside ours on the same upstream (a temporary git worktree): its rows in the table, then both
measured again in alternating rounds of streams at c=32 (`--rounds`, `--round-streams`), the two
gateways on the first CPU and the client and upstream on the others, CPU per streamed request (per small request with `--small`) of
each, the ratio, and PASS/MISS against "within 5 %". `--baseline ''` skips it. A run's ratio moves
by a few per cent from one start of the servers to the next: `--compare-only --runs N` starts them
N times (rounds only, no table) and judges the mean (docs/performance.md). `--small` makes the rounds
send small non-streamed requests. `--versus nginx` (or `bare`) runs the same rounds with a reference
in place of the other revision: the steady form of issue 18's two CPU ratios.

`--pace MS` makes every fake upstream pause after each chunk, so that the relays read a stream chunk
by chunk as from a generating vLLM (without it, a stream's 64 chunks reach the gateway in one or two
reads). The c=1 rows run with a SCHED_IDLE busy loop on every CPU (`--no-awake`: not), so that their
TTFB is the relays' and not the wake-up of an idle virtual CPU.

Run: `.venv/bin/python tools/bench_gateway.py` (a minute or two on 2 cores; 45 s with `--baseline ''`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.server import Server, free_port, start_server  # noqa: E402

CHUNKS = 64
KEYS = 8
STREAM_CPU_TARGET_MS = 1.0
SMALL_CPU_TARGET_MS = 0.6
ADDED_TTFB_TARGET_MS = 1.0
HEALTHZ_P99_TARGET_MS = 5.0
TIME_WAIT_TARGET = 100
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
# --baseline's default: the commit before issue 16's work (metrics, token accounting, key limits,
# probes, JSON logs), whose CPU per streamed request the gateway must stay within 5 % of.
BASELINE = "fb3aa77"
BEFORE_AFTER_WITHIN = 0.05
VERSUS = {"nginx": "nginx", "bare": "bare tornado relay", "protocol": "protocol relay"}  # --versus
PACE_ENV = "BENCH_PACE_MS"  # --pace, passed to every fake upstream (the deployments' too)


PROFILER = """
import atexit, cProfile
_profile = cProfile.Profile()
_profile.enable()
atexit.register(lambda: (_profile.disable(), _profile.dump_stats({out!r})))
"""


# --- the fake upstream (runs in its own process) -----------------------------------------------


def serve_upstream(port: int) -> None:
    """A bare Tornado app: the floor any relay in front of it is measured against."""
    import tornado.httpserver
    import tornado.ioloop
    import tornado.web

    # --pace: a pause after each chunk, so that the relays read the chunks one by one, as they
    # come from vLLM generating (a fast upstream's 64 chunks arrive in one or two reads).
    pace = float(os.environ.get(PACE_ENV, "0")) / 1000
    small = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
            "usage": {"prompt_tokens": 8, "total_tokens": 9, "completion_tokens": 1},
        }
    ).encode()
    delta = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "tiny"}

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    chunk = event({**delta, "choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": None}]})
    # The end as vLLM sends it: the terminal chunk, with the fingerprint unless a usage event follows.
    terminal = {**delta, "choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}]}
    usage = {"prompt_tokens": 8, "total_tokens": 8 + CHUNKS, "completion_tokens": CHUNKS}
    end_plain = event({**terminal, "system_fingerprint": "vllm-bench"}) + b"data: [DONE]\n\n"
    end_usage = (
        event(terminal)
        + event({**delta, "choices": [], "usage": usage, "system_fingerprint": "vllm-bench"})
        + b"data: [DONE]\n\n"
    )

    class Completions(tornado.web.RequestHandler):
        async def post(self) -> None:
            body = json.loads(self.request.body)
            if not body.get("stream"):
                self.set_header("Content-Type", "application/json")
                self.finish(small)
                return
            self.set_header("Content-Type", "text/event-stream")
            for _ in range(CHUNKS):
                self.write(chunk)
                await self.flush()
                if pace:
                    await asyncio.sleep(pace)
            self.finish(end_usage if (body.get("stream_options") or {}).get("include_usage") else end_plain)

    accepted = [0]

    class Accepted(tornado.web.RequestHandler):
        def get(self) -> None:
            self.finish(str(accepted[0]))

    class Health(tornado.web.RequestHandler):  # what vllm-use polls when this stands in for vLLM
        def get(self) -> None:
            self.finish(b"")

    routes = [(r"/v1/chat/completions", Completions), (r"/_accepted", Accepted), (r"/health", Health)]
    app = tornado.web.Application(routes)
    server = tornado.httpserver.HTTPServer(app)
    handle_stream = server.handle_stream

    def counted(stream: object, address: object) -> object:
        accepted[0] += 1
        return handle_stream(stream, address)

    server.handle_stream = counted  # type: ignore[method-assign]
    server.listen(port, "127.0.0.1")
    tornado.ioloop.IOLoop.current().start()


def start_upstream() -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port)])
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the fake upstream did not start") from None
            time.sleep(0.05)


# --- the references (issue 18): nginx and a bare Tornado relay, each on its own fake upstream ------

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream fast {{
        server 127.0.0.1:{upstream};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://fast;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def serve_bare_relay(port: int, upstream_port: int) -> None:
    """The bare Tornado relay issue 18 calibrated against: POST /v1/* relayed with Tornado's simple
    client (a connection per request), each chunk written and flushed as it comes; no key, no
    audit, no accounting. What a relay costs in Python with nothing of ours in it."""
    import tornado.httpclient
    import tornado.httpserver
    import tornado.ioloop
    import tornado.web

    client = tornado.httpclient.AsyncHTTPClient(max_clients=64)
    origin = f"http://127.0.0.1:{upstream_port}"

    class Relay(tornado.web.RequestHandler):
        async def post(self) -> None:
            def header(line: str) -> None:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-type":
                    self.set_header("Content-Type", value.strip())

            def chunk(data: bytes) -> None:
                self.write(data)
                self.flush()

            await client.fetch(
                origin + self.request.path,
                method="POST",
                body=self.request.body,
                headers={"Content-Type": "application/json"},
                header_callback=header,
                streaming_callback=chunk,
                request_timeout=60,
            )

    tornado.httpserver.HTTPServer(tornado.web.Application([(r"/v1/.*", Relay)])).listen(port, "127.0.0.1")
    tornado.ioloop.IOLoop.current().start()


def serve_protocol_relay(port: int, upstream_port: int) -> None:
    """A relay without Tornado: an asyncio protocol on uvloop with a naive HTTP/1.1 parser
    (keep-alive, Content-Length bodies) and vllm-use's own upstream pool, each piece written
    chunked as it comes; no key, no audit, no limits, no timeouts. What a `/v1` path off Tornado's
    HTTP server could cost at best (docs/performance.md, issue 18), not a design to ship."""
    import uvloop

    from vllm_use.gateway.upstream import UpstreamPool

    pool = UpstreamPool()
    origin = f"http://127.0.0.1:{upstream_port}"
    tasks: set[asyncio.Task[None]] = set()

    class Relay(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""
            self.busy = False

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            if not self.busy:
                self.next_request()

        def next_request(self) -> None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            target = lines[0].split(" ")[1]
            length = next(
                (
                    int(v)
                    for n, _, v in (line.partition(":") for line in lines[1:])
                    if n.lower() == "content-length"
                ),
                0,
            )
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            self.busy = True
            task = asyncio.ensure_future(self.relay(target, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def relay(self, target: str, body: bytes) -> None:
            write = self.transport.write  # type: ignore[attr-defined]
            headers = [("Content-Type", "application/json")]
            async with pool.stream("POST", origin + target, headers, body) as upstream:
                kind = next((v for n, v in upstream.headers if n.lower() == "content-type"), "text/plain")
                write(
                    f"HTTP/1.1 {upstream.status} OK\r\nContent-Type: {kind}\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n".encode()
                )
                async for piece in upstream:
                    write(b"%x\r\n%s\r\n" % (len(piece), piece))
                write(b"0\r\n\r\n")
            self.busy = False
            self.next_request()

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(loop.create_server(Relay, "127.0.0.1", port))
    loop.run_forever()


def wait_port(proc: subprocess.Popen[bytes], port: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.05)


def start_references(tmp: Path) -> tuple[list[Target], list[subprocess.Popen[bytes]]]:
    """A fake upstream of their own (their connections stay out of the gateway's TIME-WAIT count),
    nginx in front of it when Debian's nginx is installed, and the bare relay."""
    procs: list[subprocess.Popen[bytes]] = []
    upstream, upstream_port = start_upstream()
    procs.append(upstream)
    targets: list[Target] = []
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        print("nginx is not installed (Debian's nginx-light: `make bench` installs it): no nginx row")
    else:
        where = tmp / "nginx"
        where.mkdir()
        port = free_port()
        (where / "nginx.conf").write_text(NGINX_CONF.format(dir=where, upstream=upstream_port, port=port))
        proc = subprocess.Popen(
            [nginx, "-p", str(where), "-c", str(where / "nginx.conf"), "-e", str(where / "error.log")]
        )
        procs.append(proc)
        wait_port(proc, port, "nginx")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        targets.append(Target("nginx", port, "tiny", pid=proc.pid, extra_pids=tuple(map(int, children))))
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-bare-relay", f"{port}:{upstream_port}"])
    procs.append(proc)
    wait_port(proc, port, "the bare relay")
    targets.append(Target("bare tornado relay", port, "tiny", pid=proc.pid))
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-protocol-relay", f"{port}:{upstream_port}"])
    procs.append(proc)
    wait_port(proc, port, "the protocol relay")
    targets.append(Target("protocol relay", port, "tiny", pid=proc.pid))
    return targets, procs


# --- /proc readers -----------------------------------------------------------------------------


def cpu_ms(pid: int) -> float:
    """utime + stime of `pid` in ms (clock-tick resolution, 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS


def cpu_of(pids: tuple[int, ...]) -> float:
    return sum(cpu_ms(pid) for pid in pids)


# The local ports of the benchmark's own connections to the upstream (the "upstream direct" rows),
# so that their TIME-WAIT sockets are not counted against the gateway.
BENCH_PORTS: set[int] = set()


def accepted(port: int) -> int:
    """Connections the fake upstream has accepted so far (its `/_accepted` counter, itself included)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        BENCH_PORTS.add(sock.getsockname()[1])
        sock.sendall(b"GET /_accepted HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return int(data.split(b"\r\n\r\n", 1)[1])


def time_wait(port: int) -> tuple[int, int]:
    """Sockets in TIME-WAIT with `port` as (remote port: the gateway's side, local port: the upstream's),
    leaving out the benchmark's own direct connections."""
    remote = local = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "06":
                continue
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            remote += remote_port == port and local_port not in BENCH_PORTS
            local += local_port == port and remote_port not in BENCH_PORTS
    return remote, local


# --- the client ----------------------------------------------------------------------------------


@dataclass
class Sample:
    ttfb: float  # ms until the response headers arrived (the first chunk travels with them)
    total: float  # ms until the last byte
    chunks: int  # SSE `data:` events, [DONE] included


@dataclass
class Target:
    name: str
    port: int
    model: str
    tokens: tuple[str, ...] = ()  # connection i sends tokens[i % len]: a key has at most 8 live streams
    conversation: bool = False
    pid: int = 0  # the gateway's process (0: the upstream, called directly)
    extra_pids: tuple[int, ...] = ()  # more processes whose CPU counts with pid's (nginx's worker)
    seq: list[int] = field(default_factory=lambda: [0])

    def request(self, stream: bool, slot: int = 0) -> bytes:
        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        ).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        )
        if self.tokens:
            head += f"Authorization: Bearer {self.tokens[slot % len(self.tokens)]}\r\n"
        if self.conversation:
            self.seq[0] += 1
            head += f"X-Conversation-Id: bench-{self.seq[0]}\r\n"
        return head.encode() + b"\r\n" + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> Sample:
    started = time.perf_counter()
    writer.write(payload)
    header = await reader.readuntil(b"\r\n\r\n")
    ttfb = time.perf_counter() - started
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    if "content-length" in fields:
        body = await reader.readexactly(int(fields["content-length"]))
    else:
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    if status != 200:
        raise SystemExit(f"answered {status}: {body[:300]!r}")
    return Sample(ttfb * 1000, (time.perf_counter() - started) * 1000, body.count(b"data: "))


async def load(target: Target, stream: bool, concurrency: int, requests: int) -> tuple[list[Sample], float]:
    """`requests` requests over `concurrency` keep-alive connections; the samples and the wall time (s)."""
    conns = [await asyncio.open_connection("127.0.0.1", target.port) for _ in range(concurrency)]
    if not target.tokens:  # direct to the upstream
        BENCH_PORTS.update(w.get_extra_info("sockname")[1] for _, w in conns)
    left = [requests]
    samples: list[Sample] = []

    async def worker(slot: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while left[0] > 0:
            left[0] -= 1
            samples.append(await exchange(reader, writer, target.request(stream, slot)))

    started = time.perf_counter()
    await asyncio.gather(*(worker(slot, r, w) for slot, (r, w) in enumerate(conns)))
    wall = time.perf_counter() - started
    for _, writer in conns:
        writer.close()
    return samples, wall


# --- healthz probe (its own process, so the load's client does not delay it) -------------------


def healthz_probe(
    port: int, stop: multiprocessing.synchronize.Event, out: multiprocessing.Queue, cpus: set[int] | None
) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
    latencies: list[float] = []
    buf = b""
    while not stop.is_set():
        started = time.perf_counter()
        sock.sendall(request)
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        header, buf = buf.split(b"\r\n\r\n", 1)
        length = int(header.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(buf) < length:
            buf += sock.recv(65536)
        buf = buf[length:]
        latencies.append((time.perf_counter() - started) * 1000)
    sock.close()
    out.put(latencies[20:])  # the first few warm the connection


async def healthz_while(
    port: int, work: asyncio.Future[object] | None, seconds: float = 2.0, cpus: set[int] | None = None
) -> list[float]:
    ctx = multiprocessing.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=healthz_probe, args=(port, stop, out, cpus))
    proc.start()
    if work is None:
        await asyncio.sleep(seconds)
    else:
        await work
    stop.set()
    latencies = out.get(timeout=30)
    proc.join()
    return latencies


def _spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        pass


def awake() -> list[multiprocessing.Process]:
    """A busy loop on every CPU at SCHED_IDLE priority: it runs only while nothing else wants the
    CPU, and keeps the CPU from going idle. Without it, at c=1 each hop between processes waits for an
    idle virtual CPU to wake up (here 0.3–1 ms a hop), which made nginx's added TTFB 2.2 ms one run and
    0.06 ms the next (docs/performance.md). Stop them with kill()."""
    ctx = multiprocessing.get_context("fork")
    spinners = [
        ctx.Process(target=_spin, args=(cpu,), daemon=True) for cpu in sorted(os.sched_getaffinity(0))
    ]
    for spinner in spinners:
        spinner.start()
    return spinners


def pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of `pid`."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:  # a thread that just ended
            pass


# --- before / after (--baseline) --------------------------------------------------------------------


async def before_after(
    opts: argparse.Namespace, ours: Target, theirs: Target, *upstream_pids: int
) -> tuple[float, float]:
    """CPU per streamed request (c=32) of the gateway and of the baseline's, measured in alternating
    rounds (AB, BA, AB …) so that a drift of the machine's load falls on both alike; in ms. Both
    gateways run on the first CPU, the client and the upstream on the others: left to the
    scheduler, where each process landed moved a run's ratio by ±4 % (docs/performance.md)."""
    everything = os.sched_getaffinity(0)
    if len(everything) < 2:
        return await _rounds(opts, ours, theirs)
    first, rest = {min(everything)}, everything - {min(everything)}
    relays = (ours.pid, *ours.extra_pids, theirs.pid, *theirs.extra_pids)
    for pid in (*upstream_pids, os.getpid()):
        pin(pid, rest)
    for pid in relays:
        pin(pid, first)
    try:
        return await _rounds(opts, ours, theirs)
    finally:
        for pid in (*upstream_pids, os.getpid(), *relays):
            pin(pid, everything)


async def _rounds(opts: argparse.Namespace, ours: Target, theirs: Target) -> tuple[float, float]:
    cpu = {ours.name: 0.0, theirs.name: 0.0}
    for round_ in range(opts.rounds):
        spent = {}
        for target in (ours, theirs) if round_ % 2 == 0 else (theirs, ours):
            await load(target, not opts.small, 32, 32)  # the round's connections, not counted
            pids = (target.pid, *target.extra_pids)
            before = cpu_of(pids)
            await load(target, not opts.small, 32, opts.round_streams)
            spent[target.name] = cpu_of(pids) - before
            cpu[target.name] += spent[target.name]
        now, then = (spent[t.name] / opts.round_streams for t in (ours, theirs))
        print(
            f"   round {round_ + 1}: {theirs.name} {then:.3f} ms, {ours.name} {now:.3f} ms per {unit(opts)}",
            flush=True,
        )
    streams = opts.rounds * opts.round_streams
    return cpu[ours.name] / streams, cpu[theirs.name] / streams


def unit(opts: argparse.Namespace) -> str:
    """What the alternating rounds measure: streams, or small requests with --small."""
    return "small request" if opts.small else "stream"


def report_before_after(opts: argparse.Namespace, ours_ms: float, theirs_ms: float) -> None:
    ratio = ours_ms / theirs_ms
    verdict = "PASS" if ratio <= 1 + BEFORE_AFTER_WITHIN else "MISS"
    streams = opts.rounds * opts.round_streams
    what = "small non-streamed request" if opts.small else "64-chunk stream"
    print(
        f"Before/after: CPU per {what}, c=32, {opts.rounds} alternating rounds of "
        f"{opts.round_streams} ({streams} {unit(opts)}s each):"
    )
    print(f"   {'gateway @' + opts.baseline + ' (before)':<34} {theirs_ms:6.3f} ms")
    print(f"   {'gateway (now)':<34} {ours_ms:6.3f} ms")
    print(
        f"   {'now / before':<34} {ratio:6.3f}×  ({(ours_ms - theirs_ms) * 1000:+.0f} µs per {unit(opts)})  "
        f"{verdict} (within {BEFORE_AFTER_WITHIN:.0%})"
    )


def report_versus(opts: argparse.Namespace, reference: Target, ours_ms: float, theirs_ms: float) -> None:
    """--versus: the gateway's CPU against a reference's, measured the same way as --baseline's."""
    print(
        f"Gateway versus {reference.name}: CPU per {unit(opts)}, c=32, {opts.rounds} alternating rounds "
        f"of {opts.round_streams}, both on the first CPU:"
    )
    print(f"   {reference.name:<34} {theirs_ms:6.3f} ms")
    print(f"   {'gateway':<34} {ours_ms:6.3f} ms")
    print(f"   {'gateway / ' + reference.name:<34} {ours_ms / theirs_ms:6.2f}×")


def report_runs(opts: argparse.Namespace, compared: list[tuple[float, float]]) -> None:
    """--runs: each run's ratio, their mean and spread, and the verdict on the mean. A run's ratio
    moves by a few per cent with where its processes landed in memory and on the CPUs, more
    than a run's rounds move it: only the mean of several runs says whether it is within the target."""
    ratios = [ours / theirs for ours, theirs in compared]
    mean = statistics.fmean(ratios)
    spread = statistics.stdev(ratios)
    added = statistics.fmean(ours - theirs for ours, theirs in compared) * 1000
    if opts.versus:
        # Issue 18's two CPU targets: a stream at most 1.5× nginx's, a small request at most half the
        # bare relay's; the other pairs are reported without a verdict.
        goal = {("nginx", False): 1.5, ("bare", True): 0.5}.get((opts.versus, opts.small))
        verdict = "" if goal is None else f"{'PASS' if mean <= goal else 'MISS'} (≤ {goal}×)"
        print()
        print(f"Gateway / {opts.versus} over {len(ratios)} runs: " + ", ".join(f"{r:.2f}" for r in ratios))
        print(
            f"   {'mean ± sd':<34} {mean:6.2f}× ± {spread:.2f}  ({added:+.0f} µs per {unit(opts)})  {verdict}"
        )
        return
    verdict = "PASS" if mean <= 1 + BEFORE_AFTER_WITHIN else "MISS"
    print()
    print(
        f"Before/after over {len(ratios)} runs (fresh servers each): " + ", ".join(f"{r:.3f}" for r in ratios)
    )
    print(
        f"   {'now / before, mean ± sd':<34} {mean:6.3f}× ± {spread:.3f}  ({added:+.0f} µs per {unit(opts)})  "
        f"{verdict} (within {BEFORE_AFTER_WITHIN:.0%})"
    )


# --- report ----------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def mark(value: float, target: float) -> str:
    return f"{'OK' if value <= target else 'MISS'} (≤ {target:g})"


async def run(
    opts: argparse.Namespace,
    server_pid: int,
    upstream_pid: int,
    upstream_port: int,
    gw_port: int,
    secrets: tuple[str, ...],
    others: list[Target],
    references: list[Target],
) -> tuple[float, float] | None:
    targets = [
        Target("upstream direct", upstream_port, "tiny"),
        Target("gateway", gw_port, "fast", secrets, pid=server_pid),
        Target("gateway + conv-id", gw_port, "fast", secrets, conversation=True, pid=server_pid),
    ]
    targets += others
    targets += references
    baseline = next((other for other in others if other.name.startswith("gateway @")), None)
    if opts.versus:
        reference = next((r for r in references if r.name == VERSUS[opts.versus]), None)
        if reference is None:
            raise SystemExit(f"no reference {opts.versus!r} in this run")
        compared = await before_after(opts, targets[1], reference, upstream_pid, *opts.reference_upstreams)
        report_versus(opts, reference, *compared)
        return compared
    if opts.compare_only and baseline is not None:
        compared = await before_after(opts, targets[1], baseline, upstream_pid)
        report_before_after(opts, *compared)
        return compared
    rows: dict[tuple[str, bool, int], dict[str, float]] = {}
    gw_requests = gw_opened = 0
    print(
        f"{'target':<18} {'stream':>6} {'c':>3} {'n':>5} {'req/s':>7} {'chunk/s':>8} {'ttfb p50':>8} "
        f"{'p99':>6} {'total p50':>9} {'p99':>6} {'gw cpu':>7} {'up cpu':>7} {'TW gw/up':>9} {'conns':>5}"
    )
    for stream in (False, True):
        for concurrency, requests in ((1, opts.c1), (32, opts.c32)):
            # c=1: every CPU kept awake (awake()), so each hop's latency is the relay's, not the time
            # an idle virtual CPU takes to wake up.
            spinners = awake() if concurrency == 1 and opts.awake else []
            for target in targets:
                warmup = max(concurrency, 50)
                opened0 = accepted(upstream_port)
                await load(target, stream, concurrency, warmup)  # not counted
                gw_requests += (warmup + requests) * (target.port == gw_port)
                gw_pids = (target.pid or server_pid, *target.extra_pids)
                gw0, up0 = cpu_of(gw_pids), cpu_ms(upstream_pid)
                samples, wall = await load(target, stream, concurrency, requests)
                gw_cpu = (cpu_of(gw_pids) - gw0) / requests
                up_cpu = (cpu_ms(upstream_pid) - up0) / requests
                tw = time_wait(upstream_port)
                opened = accepted(upstream_port) - opened0 - 1  # less the counter's own request
                gw_opened += opened * (target.port == gw_port)
                want = CHUNKS + 2 if stream else 0  # the pieces, the terminal chunk, [DONE]
                if any(s.chunks != want for s in samples):
                    raise SystemExit(f"{target.name}: expected {want} chunks per response")
                row = {
                    "rps": requests / wall,
                    "cps": sum(s.chunks for s in samples) / wall,
                    "ttfb50": statistics.median(s.ttfb for s in samples),
                    "ttfb99": pct([s.ttfb for s in samples], 99),
                    "tot50": statistics.median(s.total for s in samples),
                    "tot99": pct([s.total for s in samples], 99),
                    "gw_cpu": gw_cpu,
                }
                rows[(target.name, stream, concurrency)] = row
                gw = "—" if target.port == upstream_port else f"{gw_cpu:.2f}"
                print(
                    f"{target.name:<18} {'yes' if stream else 'no':>6} {concurrency:>3} {requests:>5} "
                    f"{row['rps']:7.0f} {row['cps']:8.0f} {row['ttfb50']:8.2f} {row['ttfb99']:6.2f} "
                    f"{row['tot50']:9.2f} {row['tot99']:6.2f} {gw:>7} {up_cpu:7.2f} {tw[0]:>4}/{tw[1]:<4} {opened:>5}",
                    flush=True,
                )
            for spinner in spinners:
                spinner.kill()
                spinner.join()
    print("   (ms; cpu = utime+stime per request, 10 ms ticks; TW = TIME-WAIT sockets with the upstream's")
    print("    port as remote port (gateway side) / local port (upstream side), read after each row, the")
    print("    benchmark's own direct connections left out; conns = connections the upstream accepted")
    print("    during the row and its warm-up)")
    print()

    idle = await healthz_while(gw_port, None)
    streams = asyncio.ensure_future(load(targets[1], True, 32, opts.healthz_streams))
    loaded = await healthz_while(gw_port, streams)
    gw_requests += opts.healthz_streams
    # Again with the gateway (all its threads) and the probe on CPU 0, the load's client and the
    # upstream on the others: the gateway's own loop stalls, without 4 processes sharing 2 cores.
    everything = os.sched_getaffinity(0)
    pinned: list[float] = []
    if len(everything) >= 2:
        first, rest = {min(everything)}, everything - {min(everything)}
        for pid in (upstream_pid, os.getpid()):
            pin(pid, rest)
        pin(server_pid, first)
        try:
            streams = asyncio.ensure_future(load(targets[1], True, 32, opts.healthz_streams))
            pinned = await healthz_while(gw_port, streams, cpus=first)
            gw_requests += opts.healthz_streams
        finally:
            for pid in (upstream_pid, os.getpid(), server_pid):
                pin(pid, everything)
    remote, local = time_wait(upstream_port)
    compared = await before_after(opts, targets[1], baseline, upstream_pid) if baseline is not None else None

    print("Targets (gateway CPU per request from the c=32 rows; TTFB from the c=1 rows):")
    for stream, target_ms, label in (
        (True, STREAM_CPU_TARGET_MS, "CPU per 64-chunk stream"),
        (False, SMALL_CPU_TARGET_MS, "CPU per small request"),
    ):
        for name in ("gateway", "gateway + conv-id"):
            value = rows[(name, stream, 32)]["gw_cpu"]
            print(f"   {label:<34} {name:<18} {value:6.2f} ms  {mark(value, target_ms)}")
    for other in others:  # --baseline: before / after; --deployments: routing to an instance
        for stream in (True, False):
            for concurrency in (1, 32):
                theirs = rows[(other.name, stream, concurrency)]["gw_cpu"]
                ours = rows[("gateway", stream, concurrency)]["gw_cpu"]
                label = f"CPU {other.name} / gateway, c={concurrency}, {'stream' if stream else 'small'}"
                print(f"   {label:<53} {theirs / ours:6.2f}×  ({(theirs - ours) * 1000:+.0f} µs per request)")
    for stream in (False, True):
        for name in ("gateway", "gateway + conv-id"):
            added = rows[(name, stream, 1)]["ttfb50"] - rows[("upstream direct", stream, 1)]["ttfb50"]
            label = f"added TTFB p50, c=1, {'stream' if stream else 'small'}"
            print(f"   {label:<34} {name:<18} {added:6.2f} ms  {mark(added, ADDED_TTFB_TARGET_MS)}")
    print(
        f"   {'healthz p99 alone / 32 streams':<34} {'':<18} {pct(idle, 99):6.2f} / {pct(loaded, 99):.2f} ms"
        f"  {mark(pct(loaded, 99), HEALTHZ_P99_TARGET_MS)}  (n={len(idle)}/{len(loaded)},"
        f" max {max(loaded, default=math.nan):.1f} ms)"
    )
    if pinned:
        print(
            f"   {'healthz p99, 32 streams, pinned':<34} {'gateway on CPU 0':<18} {pct(pinned, 99):6.2f} ms"
            f"  {mark(pct(pinned, 99), HEALTHZ_P99_TARGET_MS)}  (n={len(pinned)}, max {max(pinned, default=math.nan):.1f} ms;"
            " client and upstream on the other CPUs)"
        )
    print(
        f"   {'TIME-WAIT to upstream, end of run':<34} {'':<18} {remote:6d} (upstream side {local})"
        f"  after {gw_requests} gateway requests in this run; target < {TIME_WAIT_TARGET}"
        f" after 10,000: {'OK' if remote + local < TIME_WAIT_TARGET else 'MISS'}"
        f"\n   {'upstream connections opened by the gateway':<53} {gw_opened:6d}"
        f"  in the measured gateway rows ({gw_requests - opts.healthz_streams} requests with their warm-ups)"
    )
    if references:
        report_references(rows, [ref.name for ref in references], pinned)
    if compared is not None:
        print()
        report_before_after(opts, *compared)
    return compared


def report_references(
    rows: dict[tuple[str, bool, int], dict[str, float]], names: list[str], pinned: list[float]
) -> None:
    """Issue 18's targets, each a ratio to a reference measured in this run (docs/performance.md)."""
    gw = "gateway"
    print()
    print("Issue 18's targets (ratios to the references of this run):")

    def line(label: str, value: float, verdict: bool, target: str) -> None:
        print(f"   {label:<50} {value:7.2f}  {'PASS' if verdict else 'MISS'} ({target})")

    if "nginx" in names:
        ratio = rows[(gw, True, 32)]["gw_cpu"] / rows[("nginx", True, 32)]["gw_cpu"]
        line("CPU per 64-chunk stream, c=32: gateway / nginx", ratio, ratio <= 1.5, "≤ 1.5×")
    ratio = rows[(gw, True, 32)]["cps"] / rows[("upstream direct", True, 32)]["cps"]
    line("streaming throughput, c=32: gateway / direct", ratio, ratio >= 0.7, "≥ 0.7×")
    if "nginx" in names:
        ratio = rows[("nginx", True, 32)]["cps"] / rows[("upstream direct", True, 32)]["cps"]
        print(f"   {'   (nginx / direct)':<50} {ratio:7.2f}")
    added = rows[(gw, True, 1)]["ttfb50"] - rows[("upstream direct", True, 1)]["ttfb50"]
    line("added TTFB p50, c=1, stream (ms)", added, added <= 0.5, "≤ 0.5 ms")
    if "nginx" in names:
        added = rows[("nginx", True, 1)]["ttfb50"] - rows[("upstream direct", True, 1)]["ttfb50"]
        print(f"   {'   (nginx, ms)':<50} {added:7.2f}")
    ratio = rows[(gw, False, 32)]["gw_cpu"] / rows[("bare tornado relay", False, 32)]["gw_cpu"]
    line("CPU per small request, c=32: gateway / bare relay", ratio, ratio <= 0.5, "≤ 0.5×")
    ratio = rows[(gw, True, 32)]["gw_cpu"] / rows[("bare tornado relay", True, 32)]["gw_cpu"]
    print(f"   {'   (per stream: gateway / bare relay)':<50} {ratio:7.2f}")
    if "nginx" in names:  # the floor of a relay off Tornado's HTTP server, against the same goal
        ratio = rows[("protocol relay", True, 32)]["gw_cpu"] / rows[("nginx", True, 32)]["gw_cpu"]
        print(f"   {'   (per stream: protocol relay / nginx)':<50} {ratio:7.2f}")
    if pinned:
        p99 = pct(pinned, 99)
        line("healthz p99 (ms), 32 streams, gateway pinned", p99, p99 <= HEALTHZ_P99_TARGET_MS, "≤ 5 ms")


# `--deployments N`: the gateway's --vllm-bin is this launcher, which serves the same fast upstream
# on the port vllm-use gives each deployment's instance (`vllm serve MODEL --port=P ...`).
AS_VLLM = "--as-vllm"
LAUNCHER = """#!/bin/sh
exec {python} {bench} {flag} "$@"
"""


def serve_as_vllm(argv: list[str]) -> None:
    """`vllm serve MODEL --port=P …` as vllm-use spawns a deployment's instance: the fast upstream on P."""
    for i, arg in enumerate(argv):
        if arg.startswith("--port="):
            serve_upstream(int(arg.split("=", 1)[1]))
            return
        if arg == "--port":
            serve_upstream(int(argv[i + 1]))
            return
    raise SystemExit("no --port")


def add_deployments(server: Server, count: int) -> str:
    """`count` deployments over as many model directories, the first loaded; its name."""
    for i in range(count):
        directory = server.data_dir / "models" / f"m{i}"
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        r = server.fetch("/api/models/local", "POST", json={"name": f"m{i}", "path": f"m{i}"})
        body = {"name": f"dep-{i}", "model_id": r.json()["model"]["id"], "aliases": [f"dep-{i}-alias"]}
        assert server.fetch("/api/deployments", "POST", json=body).status_code == 201
    # The bound only ends a hang: the fast upstream starts in well under a second.
    wait = 120
    r = server.fetch(f"/api/deployments/dep-0/load?wait={wait}", "POST", timeout=wait + 30)
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    return "dep-0"


def one_run(
    opts: argparse.Namespace, upstream: subprocess.Popen[bytes], upstream_port: int
) -> tuple[float, float] | None:
    """Start the gateway (and --baseline's), measure, stop them: CPU per stream of both (ms) with
    --baseline, else None."""
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        env = {}
        if opts.profile:  # sitecustomize runs first in the child: profile its main thread to exit
            Path(tmp, "sitecustomize.py").write_text(PROFILER.format(out=str(Path(opts.profile).resolve())))
            env["PYTHONPATH"] = os.pathsep.join([tmp, str(REPO)])
        router: tuple[str, ...] = ()
        if opts.deployments:
            launcher = Path(tmp, "vllm")
            launcher.write_text(
                LAUNCHER.format(python=sys.executable, bench=Path(__file__).resolve(), flag=AS_VLLM)
            )
            launcher.chmod(0o755)
            first = free_port()
            router = ("--vllm-bin", str(launcher), "--runtime-ports", f"{first}-{first + 9}")
        server = start_server(
            Path(tmp) / "data",
            "--upstream",
            f"http://127.0.0.1:{upstream_port}",
            "--model-aliases",
            "fast=tiny",
            *router,
            env=env,
        )
        extra: list[Server] = []
        extra_procs: list[subprocess.Popen[bytes]] = []
        try:
            # 8 keys over the 32 connections: 4 live resumable streams per key, within its 8.
            secrets = tuple(server.create_key("inference", name=f"bench-{i}")[1] for i in range(KEYS))
            gw_port = int(server.base_url.rsplit(":", 1)[1])
            print(f"gateway {server.base_url} (pid {server.proc.pid}), upstream port {upstream_port}")
            others: list[Target] = []
            if opts.deployments:
                name = add_deployments(server, opts.deployments)
                others.append(Target("gw → deployment", gw_port, name, secrets, pid=server.proc.pid))
                print(
                    f"{opts.deployments} deployments saved, {name} loaded (its instance is the fast upstream)"
                )
            wanted: list[tuple[str, dict[str, str], Path]] = []  # name, environment, code
            if opts.baseline:
                tree = Path(tmp, "baseline")
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), opts.baseline],
                    check=True,
                    capture_output=True,
                )
                wanted.append((f"gateway @{opts.baseline}"[:18], {}, tree))
            for i, (name, env_extra, repo) in enumerate(wanted):
                other = start_server(
                    Path(tmp) / f"data-{i}",
                    "--upstream",
                    f"http://127.0.0.1:{upstream_port}",
                    "--model-aliases",
                    "fast=tiny",
                    env=env_extra,
                    repo=repo,
                )
                extra.append(other)
                keys = tuple(other.create_key("inference", name=f"bench-{k}")[1] for k in range(KEYS))
                port = int(other.base_url.rsplit(":", 1)[1])
                others.append(Target(name, port, "fast", keys, pid=other.proc.pid))
                print(f"{name} {other.base_url} (pid {other.proc.pid})")
            references: list[Target] = []
            if opts.versus or (opts.references and not opts.compare_only):
                references, started = start_references(Path(tmp))
                extra_procs.extend(started)
                opts.reference_upstreams = (started[0].pid,)  # their own fake upstream
            print()
            return asyncio.run(
                run(opts, server.proc.pid, upstream.pid, upstream_port, gw_port, secrets, others, references)
            )
        finally:
            server.stop()
            for other in extra:
                other.stop()
            for proc in extra_procs:
                proc.terminate()
                proc.wait(10)
            if opts.baseline:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(tmp, "baseline"))],
                    check=False,
                    capture_output=True,
                )
    return None


def main() -> None:
    if sys.argv[1:2] == [AS_VLLM]:
        serve_as_vllm(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare-relay", help=argparse.SUPPRESS)
    parser.add_argument("--serve-protocol-relay", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-references",
        dest="references",
        action="store_false",
        help="leave out the reference rows (nginx, the bare Tornado relay) and issue 18's targets",
    )
    parser.add_argument("--c1", type=int, default=300, help="requests per row at concurrency 1")
    parser.add_argument("--c32", type=int, default=2000, help="requests per row at concurrency 32")
    parser.add_argument("--healthz-streams", type=int, default=1500, help="streams while healthz is probed")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="run the gateway under cProfile; write the stats to FILE, print the top",
    )
    parser.add_argument(
        "--deployments",
        type=int,
        default=0,
        metavar="N",
        help="also save N deployments and relay to the first one's instance (the same fast upstream, "
        "started by vllm-use as it starts vLLM): routing's cost, side by side with the plain gateway",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        default=BASELINE,
        help="also run the gateway of git revision REV (a temporary worktree), side by side: its rows, "
        f"then CPU per streamed request of both in alternating rounds, PASS within "
        f"{BEFORE_AFTER_WITHIN * 100:.0f} %% (default {BASELINE}, before issue 16; '' for none)",
    )
    parser.add_argument(
        "--compare-only",
        action="store_true",
        help="with --baseline: only the alternating rounds (no table, no healthz probes)",
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="--compare-only: times to start fresh servers and compare"
    )
    parser.add_argument("--rounds", type=int, default=6, help="--baseline: alternating rounds")
    parser.add_argument("--round-streams", type=int, default=1000, help="--baseline: streams per round")
    parser.add_argument(
        "--versus",
        choices=tuple(VERSUS),
        help="only alternating rounds of the gateway against a reference (nginx, the bare Tornado "
        "relay, or the protocol relay), both pinned to the first CPU, as --baseline's: the steady form "
        "of issue 18's CPU ratios (with --runs: over fresh starts; --small: small requests)",
    )
    parser.add_argument(
        "--no-awake",
        dest="awake",
        action="store_false",
        help="let the CPUs idle during the c=1 rows (by default a SCHED_IDLE busy loop per CPU keeps "
        "them awake, so that TTFB is the relays', not the wake-up of an idle virtual CPU)",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0,
        metavar="MS",
        help="the fake upstreams pause MS ms after each chunk: the relays read chunk by chunk, as from "
        "a generating vLLM (default 0: a stream's chunks arrive in one or two reads)",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="--baseline: the rounds send small non-streamed requests instead of streams",
    )
    opts = parser.parse_args()
    if opts.serve_upstream:
        serve_upstream(opts.serve_upstream)
        return
    if opts.serve_bare_relay:
        port, upstream_port = map(int, opts.serve_bare_relay.split(":"))
        serve_bare_relay(port, upstream_port)
        return
    if opts.serve_protocol_relay:
        port, upstream_port = map(int, opts.serve_protocol_relay.split(":"))
        serve_protocol_relay(port, upstream_port)
        return

    if opts.versus:
        opts.baseline = ""  # the gateway against a reference, no other revision
    os.environ[PACE_ENV] = str(opts.pace)  # the fake upstreams read it
    paced = f", the upstream pausing {opts.pace:g} ms after each chunk" if opts.pace else ""
    print(
        f"bench_gateway: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {CHUNKS}-chunk streams{paced}"
    )
    upstream, upstream_port = start_upstream()
    compared: list[tuple[float, float]] = []
    try:
        for _ in range(opts.runs if opts.compare_only or opts.versus else 1):
            result = one_run(opts, upstream, upstream_port)
            if result is not None:
                compared.append(result)
    finally:
        upstream.terminate()
        upstream.wait(10)
    if len(compared) > 1:
        report_runs(opts, compared)
    if opts.profile:
        print()
        stats = pstats.Stats(opts.profile)
        stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()

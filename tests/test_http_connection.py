"""The HTTP/1 connection layer (handlers/connection.py) against raw sockets, on both event loops.

A `GuardedHTTPServer` runs a small Tornado application in a thread with its own loop (uvloop,
the default, and asyncio's); the tests speak HTTP/1.x by hand, since the cases are the ones HTTP
clients do not send: pipelined requests, chunked bodies good and bad, HTTP/1.0, framing traps,
heads too large, timeouts, a client that stops reading. What the rest of the suite checks through
`vllm-use serve` (refusals, lingering, the cap, aborted uploads) is in test_http_hardening.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tornado.httputil
import tornado.netutil
import tornado.web
import uvloop
from tornado.iostream import StreamClosedError

from handlers.connection import _PLAIN_HEADERS, parse_headers
from handlers.server import GuardedHTTPServer

LOOPS = ("uvloop", "asyncio")


@tornado.web.stream_request_body
class Echo(tornado.web.RequestHandler):
    """POST: answers the body it read, and how many pieces it came in (X-Pieces)."""

    def prepare(self) -> None:
        super().prepare()
        self.pieces: list[bytes] = []

    def data_received(self, chunk: bytes) -> None:
        self.pieces.append(chunk)

    def post(self) -> None:
        self.set_header("X-Pieces", str(len(self.pieces)))
        self.write(b"".join(self.pieces))

    def get(self) -> None:
        self.write(b"hello")


class Raises(tornado.web.RequestHandler):
    def get(self) -> None:
        raise RuntimeError("the handler broke")


class Injects(tornado.web.RequestHandler):
    """A header name with a line break in it (Tornado checks values and reason phrases, not names)."""

    def get(self) -> None:
        self.set_header(self.get_query_argument("name"), "1")
        self.write(b"hello")


class Stream(tornado.web.RequestHandler):
    """GET: writes `n` pieces of 64 KiB, awaiting each flush; counts what it wrote, and whether a
    flush failed because the client left."""

    written = 0
    closed_seen = False

    async def get(self) -> None:
        n = int(self.get_argument("n"))
        piece = b"x" * 65536
        for _ in range(n):
            self.write(piece)
            try:
                await self.flush()
            except StreamClosedError:
                type(self).closed_seen = True
                return
            type(self).written += len(piece)


class Running:
    """A GuardedHTTPServer serving `app` on 127.0.0.1 from a thread with its own loop."""

    def __init__(self, loop_kind: str, **options: Any) -> None:
        self.loop_kind = loop_kind
        self.options = options
        self.port = 0
        self.server: GuardedHTTPServer | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._ready.wait(30)

    def _main(self) -> None:
        loop = uvloop.new_event_loop() if self.loop_kind == "uvloop" else asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._serve())
        loop.close()

    async def _serve(self) -> None:
        app = tornado.web.Application(
            [(r"/echo", Echo), (r"/raises", Raises), (r"/stream", Stream), (r"/injects", Injects)]
        )
        self.server = GuardedHTTPServer(app, **self.options)
        [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sock.getsockname()[1]
        self.server.add_sockets([sock])
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        self.server.stop()
        await self.server.close_all_connections()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's loop and return its result."""
        assert self._loop is not None
        done: asyncio.Future[Any] = asyncio.run_coroutine_threadsafe(_call(fn), self._loop)  # type: ignore[arg-type]
        return done.result(10)

    def close(self) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def connect(self, timeout: float = 10) -> Client:
        return Client(socket.create_connection(("127.0.0.1", self.port), timeout=timeout))


async def _call(fn: Callable[[], Any]) -> Any:
    return fn()


@pytest.fixture(params=LOOPS)
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(**options: Any) -> Running:
        running = Running(request.param, **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.close()


class Client:
    """A raw connection with a read buffer: pipelined answers arrive in one read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return chunk

    def until_closed(self) -> bytes:
        """Everything until the server closes (a reset too)."""
        try:
            while self._more():
                pass
        except ConnectionResetError:
            pass
        data, self.buf = self.buf, b""
        return data

    def answer(self) -> tuple[bytes, dict[str, str], bytes]:
        """One answer: status line, headers (lowercased names), body (Content-Length or chunked)."""
        while b"\r\n\r\n" not in self.buf:
            assert self._more(), f"closed before an answer: {self.buf!r}"
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        if "content-length" in headers:
            length = int(headers["content-length"])
            while len(self.buf) < length:
                assert self._more(), "closed inside the body"
            body, self.buf = self.buf[:length], self.buf[length:]
            return status.encode(), headers, body
        assert headers.get("transfer-encoding") == "chunked", headers
        body = b""
        while True:
            while b"\r\n" not in self.buf:
                assert self._more(), "closed inside the body"
            size_line, _, self.buf = self.buf.partition(b"\r\n")
            size = int(size_line, 16)
            while len(self.buf) < size + 2:
                assert self._more(), "closed inside the body"
            body += self.buf[:size]
            self.buf = self.buf[size + 2 :]
            if size == 0:
                return status.encode(), headers, body


def post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(path: str, encoded: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: t", "Transfer-Encoding: chunked", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + encoded


def eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.02)


# --- requests, one after another ------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order_on_one_connection(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(
            post("/echo", b"first") + b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n" + post("/echo", b"third")
        )
        assert sock.answer()[2] == b"first"
        assert sock.answer()[2] == b"hello"
        _, headers, body = sock.answer()
        assert body == b"third" and headers.get("connection") != "close"
        sock.sendall(post("/echo", b"again"))  # still open
        assert sock.answer()[2] == b"again"


def test_connection_close_ends_the_connection_after_the_answer(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(post("/echo", b"bye", "Connection: close"))
        _, headers, body = sock.answer()
        assert body == b"bye" and headers["connection"] == "close"
        assert sock.until_closed() == b""
    eventually(lambda: running.call(lambda: running.server.open_connections) == 0)


def test_http_1_0_keeps_the_connection_only_when_asked(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(b"GET /echo HTTP/1.0\r\n\r\n")
        answer = sock.until_closed()  # no chunked coding for 1.0: the close ends the body
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nhello"), answer
    with running.connect() as sock:
        sock.sendall(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        _, headers, body = sock.answer()
        assert body == b"hello" and headers["connection"] == "Keep-Alive"
        sock.sendall(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert sock.answer()[2] == b"hello"


# --- bodies ---------------------------------------------------------------------------------------


def test_a_chunked_body_arrives_whole_with_small_chunks_coalesced(serve: Callable[..., Running]) -> None:
    running = serve()
    body = bytes(range(256)) * 1024  # 256 KiB
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, 4096, 7))
    encoded += b"%x\r\n%s\r\n" % (len(body) - 4102, body[4102:]) + b"0\r\n\r\n"
    with running.connect() as sock:
        sock.sendall(chunked("/echo", encoded))
        status, headers, echoed = sock.answer()
        assert status.startswith(b"HTTP/1.1 200") and echoed == body[:4102] + body[4102:]
        # 586 chunks of 7 bytes and one of 252 KiB, handed over in pieces of at most 64 KiB
        assert int(headers["x-pieces"]) <= 12, headers["x-pieces"]
        sock.sendall(chunked("/echo", b"3\r\nabc\r\n0\r\n\r\n"))  # the connection goes on
        assert sock.answer()[2] == b"abc"


def test_a_chunked_body_dripped_a_byte_at_a_time_arrives_whole(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        request = chunked("/echo", b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        for i in range(len(request)):
            sock.sendall(request[i : i + 1])
        assert sock.answer()[2] == b"hello world"


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(chunked("/echo", b"zz\r\nabc\r\n0\r\n\r\n"), id="chunk-size-not-hex"),
        pytest.param(chunked("/echo", b"3;ext=1\r\nabc\r\n0\r\n\r\n"), id="chunk-extension"),
        pytest.param(chunked("/echo", b"3\r\nabcX\r\n0\r\n\r\n"), id="chunk-not-ended-by-crlf"),
        pytest.param(chunked("/echo", b"3\r\nabc\r\n0\r\nTrailer: x\r\n\r\n"), id="trailer"),
        pytest.param(post("/echo", b"abc", "Transfer-Encoding: chunked"), id="length-and-chunked"),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", id="unknown-coding"
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 4\r\n\r\nabcd", id="unequal-lengths"
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: -3\r\n\r\nabc", id="negative-length"
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nabc", id="over-the-body-limit"
        ),
        pytest.param(b"GET /echo HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n", id="header-without-colon"),
        pytest.param(b"GET /echo\r\n\r\n", id="no-version"),
        pytest.param(b"GET /echo HTTP/1.1\r\n\r\n", id="no-host"),
        pytest.param(b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", id="two-hosts"),
        pytest.param(b"\r\n\r\n", id="empty-head"),
    ],
)
def test_bad_framing_is_a_400_and_a_close(serve: Callable[..., Running], request_bytes: bytes) -> None:
    running = serve(max_body_size=10)
    with running.connect() as sock:
        sock.sendall(request_bytes)
        assert sock.until_closed() == b"HTTP/1.1 400 Bad Request\r\n\r\n"
    eventually(lambda: running.call(lambda: running.server.open_connections) == 0)


def test_equal_copies_of_a_content_length_are_one(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 3\r\n\r\nabc")
        assert sock.answer()[2] == b"abc"


def test_a_chunk_size_line_too_long_closes_without_an_answer(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(chunked("/echo", b"0" * 70 + b"3\r\nabc\r\n0\r\n\r\n"))
        assert sock.until_closed() == b""


def test_a_chunked_body_over_the_limit_is_refused_as_it_grows(serve: Callable[..., Running]) -> None:
    running = serve(max_body_size=100)
    with running.connect() as sock:
        sock.sendall(chunked("/echo", b"40\r\n" + b"x" * 64 + b"\r\n" + b"40\r\n" + b"y" * 64 + b"\r\n"))
        assert sock.until_closed().startswith(b"HTTP/1.1 400 Bad Request\r\n")


# --- limits: head size, time ---------------------------------------------------------------------


def test_a_head_over_64_kib_closes_the_connection(serve: Callable[..., Running]) -> None:
    running = serve()
    with running.connect() as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        assert sock.until_closed() == b""
    with running.connect() as sock:  # just under the limit is served
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 65_000 + b"\r\n\r\n")
        assert sock.answer()[2] == b"hello"


def test_an_idle_connection_and_a_slow_head_are_closed_after_the_header_timeout(
    serve: Callable[..., Running],
) -> None:
    running = serve(idle_connection_timeout=0.5)
    with running.connect() as idle, running.connect() as slow, running.connect() as served:
        slow.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n")  # and no more
        served.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        assert served.answer()[2] == b"hello"
        started = time.monotonic()
        assert idle.until_closed() == b"" and slow.until_closed() == b""
        assert served.until_closed() == b""  # idle after its answer: the same timeout
        assert time.monotonic() - started < 5


def test_a_body_that_stops_coming_is_cut_after_the_body_timeout(serve: Callable[..., Running]) -> None:
    running = serve(body_timeout=0.5)
    with running.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nonly this")
        assert sock.until_closed() == b""
    eventually(lambda: running.call(lambda: running.server.open_connections) == 0)


# --- writing ---------------------------------------------------------------------------------------


def test_a_client_that_stops_reading_holds_the_writer_back(serve: Callable[..., Running]) -> None:
    running = serve()
    Stream.written, Stream.closed_seen = 0, False
    total = 512 * 65536  # 32 MiB: far more than the socket buffers hold
    with running.connect(timeout=30) as sock:
        sock.sendall(b"GET /stream?n=512 HTTP/1.1\r\nHost: t\r\n\r\n")
        last = -1
        while Stream.written != last:  # until the writer stands still
            last = Stream.written
            time.sleep(0.3)
        assert Stream.written < total // 2, Stream.written
        body = sock.answer()[2]  # now read it all
        assert len(body) == total and Stream.written == total


def test_a_flush_fails_once_the_client_is_gone(serve: Callable[..., Running]) -> None:
    running = serve()
    Stream.written, Stream.closed_seen = 0, False
    with running.connect() as sock:
        sock.sendall(b"GET /stream?n=100000 HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.sock.recv(65536)
    eventually(lambda: Stream.closed_seen)
    eventually(lambda: running.call(lambda: running.server.open_connections) == 0)


def test_a_handler_that_raises_is_answered_500_and_logged(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    running = serve()
    with caplog.at_level(logging.ERROR, "tornado.application"), running.connect() as sock:
        sock.sendall(b"GET /raises HTTP/1.1\r\nHost: t\r\n\r\n")
        assert sock.answer()[0].startswith(b"HTTP/1.1 500")
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")  # the connection goes on
        assert sock.answer()[2] == b"hello"
    assert "the handler broke" in caplog.text


# --- the header parser ------------------------------------------------------------------------------


def _tornado_parse(block: str) -> list[tuple[str, str]] | str:
    try:
        return list(tornado.httputil.HTTPHeaders.parse(block).get_all())
    except tornado.httputil.HTTPInputError as exc:
        return f"HTTPInputError: {exc}"


def _our_parse(block: str) -> list[tuple[str, str]] | str:
    try:
        return list(parse_headers(block).get_all())
    except tornado.httputil.HTTPInputError as exc:
        return f"HTTPInputError: {exc}"


HEADER_LINES = [
    "Host: t",
    "host:t",
    "Content-Length: 3",
    "X-Many: a",
    "x-many:  b\t",
    "Authorization: Bearer vu_0123456789abcdef",
    "Empty:",
    "Spaces:   ",
    "Tabs:\tin\tthe\tmiddle\t",
    "Obs-Text: caf\xe9",
    "Odd-Name!#$%&'*+.^_`|~: v",
    "Colons: a:b:c",
    "Name With Space: v",
    "Name : v",
    " Folded: v",
    "\tfolded continuation",
    "No colon here",
    ": no name",
    "Ctl: a\x01b",
    "Del: a\x7fb",
    "Nul: \x00",
    "Unicode: \u20ac",
    "Bad\x80Name: v",
    "Bare-CR: a\rb",
]


def test_the_header_parser_agrees_with_tornados_on_every_block() -> None:
    """`parse_headers` has Tornado's result for a block it parses itself and hands every other block
    to Tornado: the same headers in the same order, or the same refusal. Blocks are built from lines
    good and bad, with CRLF or bare LF endings, as the connection hands them over (from the end of
    the start line up to the blank line)."""
    rng = random.Random(18)
    blocks = ["\n\r\n", "\n\n", "\r\n\r\n"]
    for _ in range(3000):
        lines = rng.choices(HEADER_LINES, k=rng.randint(0, 6))
        ending = rng.choice(["\r\n", "\r\n", "\r\n", "\n"])
        blocks.append("\n" + "".join(line + ending for line in lines) + ending)
    plain = 0
    for block in blocks:
        ours, theirs = _our_parse(block), _tornado_parse(block)
        assert ours == theirs, repr(block)
        plain += _PLAIN_HEADERS.fullmatch(block) is not None
    assert 300 < plain < len(blocks) - 300  # both paths were taken, many times each


def test_repeated_headers_keep_every_value_in_order() -> None:
    headers = parse_headers("\nX-A: 1\r\nx-a: 2\r\nX-B: 3\r\nX-A: 4\r\n\r\n")
    assert headers.get_list("X-A") == ["1", "2", "4"]
    assert headers["X-A"] == "1,2,4"
    assert list(headers.get_all()) == [("X-A", "1"), ("X-A", "2"), ("X-A", "4"), ("X-B", "3")]


@pytest.mark.parametrize("name", ["X-A%0D%0AX-Injected", "X-A%0AX-Injected", "X-A%0DX-Injected"])
def test_a_line_break_in_the_head_is_never_written(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """The connection is closed with nothing of that answer written, and the handler's error is
    logged: a line break would end the header early and let the rest pass for headers of its own."""
    running = serve()
    with caplog.at_level(logging.ERROR), running.connect() as sock:
        sock.sendall(f"GET /injects?name={name} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        answer = sock.until_closed()
    assert answer == b""
    assert "Illegal characters (CR or LF) in header" in caplog.text

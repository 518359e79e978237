"""The gateway's HTTP/1.1 client to the upstream: keep-alive pooled, abortable, streaming with
backpressure, no proxies, no redirects (docs/gateway.md, "The upstream connection").

    exchange = pool.stream("POST", url, headers, body)  # nothing sent yet; abort() works from here
    async with exchange:                                # connected, request sent, head read
        exchange.status, exchange.reason, exchange.headers
        async for payload in exchange:                  # the body, de-chunked, one piece per arrival
            ...
        await exchange.pipe(sink)                       # or the rest of it, pushed to sink(payload)
    # leaving the block: the connection goes back to the pool, or is closed

Each connection is an asyncio protocol (`_Connection`) with its own buffer, on the loop Tornado runs
on: every byte the upstream sends passes through our hands, so we always know whether a connection
is clean to reuse, without peeking into a library's private state.

- **Reuse.** A connection goes back to the pool only when the block is left normally after the
  whole body was read, the body was well framed (Content-Length or chunked), the answer was HTTP/1.1
  without `Connection: close`, nothing arrived after the body, and nobody aborted it. Idle
  connections live at most `idle_timeout` seconds (below uvicorn's 5 s keep-alive, so vLLM rarely
  closes one under us). An idle connection that the upstream closes, or that receives a byte, is
  dropped at once (its protocol sees it: no probing before reuse). If a reused connection is still
  reset before a single response byte arrives, the request is sent once more on a new connection:
  the upstream had closed it while idle and dropped our request unread. A clean close after the
  request is never retried (the upstream may have started the generation); the caller gets an
  `UpstreamError`.
- **Backpressure.** The body is read only as the caller iterates: while it is busy (flushing to a
  slow client), at most `HIGH_WATER` bytes wait in our buffer, then the socket is not read, and
  TCP pushes back to the upstream. `pipe` hands each piece to its sink as it arrives, and leaves
  the socket unread while a future the sink returned (its client's write) is pending.
- **Abort.** `exchange.abort()` closes the connection at once, so vLLM aborts the generation and
  frees the slot; a pending `async with` or `async for` raises `UpstreamError`; that connection is
  never reused.
- **Errors.** Everything that goes wrong talking to the upstream (connect, reset, close, broken
  framing, abort) is an `UpstreamError` (`UpstreamProtocolError` for broken framing): the caller
  needs only to know whether anything was relayed yet. A header value with a line break is a
  `ValueError` from `stream()`, before anything is sent.
- No environment proxy, no redirect following, no decompression: the gateway relays what it gets.
  Only `connect_timeout` applies; a generation may legitimately take hours.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import re
import ssl
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

from vllm_use.errors import UpstreamError, UpstreamProtocolError

MAX_HEAD = 64 * 1024  # status line + headers of one response
MAX_CHUNK_LINE = 1024
HIGH_WATER = 256 * 1024  # bytes read ahead of the caller before the socket is left unread
# A request body up to this size leaves in the same send as the head (a copy is cheaper than a
# second segment); a larger one is written after it as it is.
ONE_WRITE_BODY = 64 * 1024
IDLE_TIMEOUT_S = 4.0  # below uvicorn's 5 s keep-alive (vLLM's), so the upstream rarely closes one first
_NO_BODY = frozenset({204, 304})
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?\r\n")
_HEX_DIGITS = b"0123456789abcdefABCDEF"

Key = tuple[str, str, int]  # scheme, host, port
# What `Exchange.pipe` hands each piece of a body to: None to go on, or a future that holds reading
# until it is done.
Sink = Callable[[bytes], "asyncio.Future[None] | None"]


class _Dechunker:
    """Incremental `Transfer-Encoding: chunked` decoder: feed bytes, get payload, until `done`.

    An SSE stream is many small chunks per socket read: the whole chunks at the start of what
    was read take a fast path (`_whole_chunks`); the rest (a chunk split across reads, an
    extension, the last chunk and trailers) goes through the general loop, one regex match per
    size line.
    """

    __slots__ = ("_buffer", "_left", "_trailers", "done")

    def __init__(self) -> None:
        self._buffer = b""
        self._left = -1  # -1: a size line is next; n ≥ 0: n payload bytes, then CRLF, are next
        self._trailers = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buffer = self._buffer + data if self._buffer else data
        out: list[bytes] = []
        end = len(buffer)
        pos = _whole_chunks(buffer, out) if self._left < 0 and not self._trailers else 0
        match = _CHUNK_LINE.match
        while pos < end and not self.done:
            if self._trailers:  # trailer fields, ignored, up to the empty line
                newline = buffer.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
                if newline < 0:
                    if end - pos >= MAX_CHUNK_LINE:
                        raise UpstreamProtocolError("trailer line too long")
                    break
                self.done = newline == pos
                pos = newline + 2
                continue
            if self._left >= 0:  # inside a chunk's payload (or its CRLF)
                take = min(self._left, end - pos)
                if take:
                    out.append(buffer[pos : pos + take])
                    pos += take
                    self._left -= take
                if self._left or end - pos < 2:
                    break
                if buffer[pos : pos + 2] != b"\r\n":
                    raise UpstreamProtocolError("chunk not followed by CRLF")
                pos += 2
                self._left = -1
                continue
            found = match(buffer, pos)
            if found is None:
                if buffer.find(b"\r\n", pos, pos + MAX_CHUNK_LINE) >= 0:
                    raise UpstreamProtocolError(f"bad chunk size line {buffer[pos : pos + 20]!r}")
                if end - pos >= MAX_CHUNK_LINE:
                    raise UpstreamProtocolError("chunk size line too long")
                break
            size = int(found.group(1), 16)
            pos = found.end()
            if not size:
                self._trailers = True
            elif pos + size + 2 <= end and buffer[pos + size : pos + size + 2] == b"\r\n":
                out.append(buffer[pos : pos + size])  # the whole chunk is here: the fast path
                pos += size + 2
            else:
                self._left = size
        self._buffer = buffer[pos:]
        if self.done and self._buffer:
            raise UpstreamProtocolError("bytes after the end of a chunked body")
        return b"".join(out) if len(out) != 1 else out[0]


def _whole_chunks(buffer: bytes, out: list[bytes]) -> int:
    """The fast path of `_Dechunker.feed`: append the payload of each whole chunk at the start of
    `buffer` (a size line of hex digits, CRLF, the payload, CRLF) to `out`; return where the first
    other thing starts (a chunk not all here, a payload holding a CRLF, a size line with an
    extension or not well-formed, the last chunk), which the general loop then reads.

    `buffer` is cut at every CRLF once: an SSE event holds none (its lines end in LF, and JSON
    escapes a CR), so the pieces alternate size line and payload, and each chunk costs a
    `translate`, an `int` and a comparison, about 0.55 µs (a regex match per size line: 1.25)."""
    pieces = buffer.split(b"\r\n")
    append = out.append
    pos = 0
    for i in range(0, len(pieces) - 2, 2):  # a payload piece with a CRLF after it
        line, payload = pieces[i], pieces[i + 1]
        if not line or len(line) > 16 or line.translate(None, _HEX_DIGITS):
            return pos  # not ours to judge: the general loop reads it, or refuses it
        size = int(line, 16)
        if size != len(payload) or not size:
            return pos  # the last chunk, or a payload not all here or holding a CRLF
        append(payload)
        pos += len(line) + size + 4
    return pos


def _parse_head(data: bytes) -> tuple[str, int, str, list[tuple[str, str]]]:
    """(version, code, reason, headers) of a response head (the bytes before the blank line)."""
    lines = data.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise UpstreamProtocolError(f"malformed status line {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and headers:  # obsolete line folding
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise UpstreamProtocolError(f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip()))
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def _request_head(
    method: str, netloc: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {netloc}"]
    for name, value in headers:
        lower = name.lower()
        if lower in ("host", "content-length", "connection", "transfer-encoding"):
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@functools.lru_cache(maxsize=256)
def _split(url: str) -> tuple[Key, str, str]:
    """(pool key, Host, request target) of an upstream URL; ValueError unless http(s) with a host.
    Kept for the (short) URLs seen last: a gateway asks for the same few over and over."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"unsupported upstream URL {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.scheme, parts.hostname, port), parts.netloc, target


class _Connection(asyncio.Protocol):
    """One upstream connection: what arrives waits in `_chunks` until `read()` takes it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.eof = False  # the upstream closed its side
        self.lost = False  # the connection is gone
        self.error: Exception | None = None  # why, if not an orderly close
        self.idle_since = -1.0  # ≥ 0 while it waits in the pool
        # Set while `Exchange.pipe` runs: what arrives goes to it at once (b"" and the error, if any,
        # once the connection ended), not to `_chunks`.
        self.pipe: Callable[[bytes, Exception | None], None] | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport: asyncio's is an asyncio.Transport, uvloop's has the same methods
        # without being a subclass (--loop, docs/performance.md).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.idle_since >= 0:  # nobody asked: a broken upstream; never hand this one out
            self.close()
            return
        if self.pipe is not None:
            self.pipe(data, None)
            return
        self._chunks.append(data)
        self._size += len(data)
        if self._size >= HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self.pipe is not None:
            self.pipe(b"", None)
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.error = exc
        if self.pipe is not None:
            self.pipe(b"", exc)
        self._wake()

    # --- ours ---

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def clean(self) -> bool:
        """Open, and nothing unread: fit to carry the next request."""
        return not (self.lost or self.eof or self._chunks)

    async def read(self) -> bytes:
        """What arrived since the last read, waiting for something; b"" once the upstream closed.
        Raises the OSError that ended the connection, if it ended in one."""
        while not self._chunks:
            if self.eof or self.lost:
                if self.error is not None:
                    raise self.error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        """Drop the connection now (unsent data too): the upstream sees it closed at once."""
        if self.transport is not None and not self.lost:
            self.transport.abort()


class Exchange:
    """One request and its response over a pooled connection; see the module docstring."""

    __slots__ = (
        "_aborted",
        "_body",
        "_conn",
        "_connect_timeout",
        "_decoder",
        "_done",
        "_head",
        "_key",
        "_left",
        "_mode",
        "_pool",
        "_rest",
        "_reusable",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self,
        pool: UpstreamPool,
        method: str,
        url: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        connect_timeout: float,
    ) -> None:
        # Long URLs (a client's query string) are split each time: the cache holds only short ones.
        self._key, netloc, target = _split(url) if len(url) <= 512 else _split.__wrapped__(url)
        self._head = _request_head(method, netloc, target, headers, body)
        self._body = body
        self._pool = pool
        self._connect_timeout = connect_timeout
        self._conn: _Connection | None = None
        self._aborted = False
        self._done = False
        self._reusable = False
        self._mode = ""  # how the body ends: "chunked", "length", "close" (the end of the connection)
        self._left = 0
        self._decoder: _Dechunker | None = None
        self._rest = b""  # body bytes that came with the head
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []

    def abort(self) -> None:
        """Close the connection now (at any point; a no-op once the exchange is over)."""
        self._aborted = True
        if self._conn is not None:
            self._conn.close()

    async def __aenter__(self) -> Exchange:
        for _attempt in range(2):
            conn, reused = await self._pool._checkout(self._key, self._connect_timeout)
            self._conn = conn
            if self._aborted:
                conn.close()
                raise UpstreamError("aborted")
            body = self._body
            if body and len(body) <= ONE_WRITE_BODY:
                conn.write(self._head + body)  # one segment, one send
            else:
                conn.write(self._head)
                if body:
                    conn.write(body)
            try:
                if await self._read_head(conn, reused):
                    return self
            except BaseException:
                conn.close()
                self._conn = None
                raise
        raise UpstreamError("the upstream reset a new connection")  # pragma: no cover - never stale twice

    async def _read_head(self, conn: _Connection, reused: bool) -> bool:
        """Read the head (after any 1xx); False if a reused connection turned out stale (resend)."""
        data = b""
        method = self._head[: self._head.index(b" ")]
        while True:
            end = data.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                version, code, reason, headers = _parse_head(data[:end])
                data = data[end + 4 :]
                if 100 <= code < 200:  # interim responses (100 Continue, 103 Early Hints): skip
                    continue
                break
            if len(data) > MAX_HEAD:
                raise UpstreamProtocolError("response head too large")
            try:
                more = await conn.read()
            except OSError as exc:
                # A reset on a reused connection with nothing received: the upstream had closed it
                # while idle and discarded our request unread (a server that reads a request and then
                # closes sends FIN, not RST). Anything else may have been processed: never sent twice.
                if (
                    reused
                    and not data
                    and not self._aborted
                    and isinstance(exc, (ConnectionResetError, BrokenPipeError))
                ):
                    conn.close()
                    return False
                raise UpstreamError(f"connection lost: {exc!r}") from exc
            if not more:
                raise UpstreamError(
                    "aborted" if self._aborted else "the upstream closed the connection before answering"
                )
            data += more
        self.status, self.reason, self.headers = code, reason, headers
        framing = {
            name.lower(): value
            for name, value in headers
            if name.lower() in ("connection", "transfer-encoding", "content-length")
        }
        self._reusable = version == "HTTP/1.1" and "close" not in framing.get("connection", "").lower()
        if method == b"HEAD" or code in _NO_BODY:
            self._done = True
        elif "chunked" in framing.get("transfer-encoding", "").lower():
            self._mode, self._decoder = "chunked", _Dechunker()
        elif "content-length" in framing:
            text = framing["content-length"]
            if not text.isdigit() or len(text) > 18:
                raise UpstreamProtocolError(f"bad Content-Length {text[:20]!r}")
            self._mode, self._left = "length", int(text)
            self._done = not self._left
        else:
            self._mode, self._reusable = "close", False
        self._rest = data
        if self._done and data:
            self._reusable = False  # bytes after a body that has none
        return True

    @property
    def complete(self) -> bool:
        """The whole body has been read (the last piece was handed out, or there was none)."""
        return self._done and not self._rest

    def __aiter__(self) -> Exchange:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        while not self._done and conn is not None:
            if self._rest:
                data, self._rest = self._rest, b""
            else:
                try:
                    data = await conn.read()
                except OSError as exc:
                    raise UpstreamError(f"connection lost mid-body: {exc!r}") from exc
            payload = self._take(data)
            if payload:
                return payload
        raise StopAsyncIteration

    def _take(self, data: bytes) -> bytes:
        """The payload in `data`, the next bytes of the body (b"": the connection ended)."""
        if not data:
            if self._mode == "close" and not self._aborted:
                self._done = True
                return b""
            raise UpstreamError("aborted" if self._aborted else "the upstream closed the connection mid-body")
        if self._mode == "chunked":
            assert self._decoder is not None
            payload = self._decoder.feed(data)
            self._done = self._decoder.done
            return payload
        if self._mode == "length":
            payload = data[: self._left]
            self._left -= len(payload)
            if len(payload) < len(data):
                self._reusable = False  # bytes after the body: not what the upstream should send
            self._done = not self._left
            return payload
        return data

    async def pipe(self, sink: Sink) -> None:
        """The rest of the body, each piece handed to `sink` from the connection's callback as it
        arrives: no task wakes per piece, which is most of what a piece costs in a stream paced by
        the generation (docs/performance.md). A future that `sink` returns holds reading until it is
        done (backpressure, as iterating has it); whether it failed is the sink's business.

        Returns once the body is read; raises what iterating would (`UpstreamError`), or what `sink`
        raised. Either way the connection is left as iterating leaves it, and `__aexit__` decides
        whether it is reused."""
        conn = self._conn
        if conn is None or self.complete:
            return
        # What arrived before: the bytes after the head, then what waits in the connection's buffer.
        pending = self._rest + b"".join(conn._chunks)
        self._rest = b""
        conn._chunks.clear()
        conn._size = 0
        if conn._paused:
            conn._paused = False
            if conn.transport is not None:
                conn.transport.resume_reading()
        piped = _Pipe(self, conn, sink)
        ended = piped.ended
        assert ended is not None
        conn.pipe = piped.feed
        if pending:
            piped.feed(pending, None)
        if conn.eof or conn.lost:
            piped.feed(b"", conn.error)
        try:
            await ended
        finally:
            piped.end()
            # An error raised here has this frame in its traceback: without its future, the frame
            # holds nothing that holds the error (a cycle would keep the caller, a handler, alive
            # until the next full garbage collection).
            del ended, piped

    async def read_all(self) -> bytes:
        """The whole body."""
        return b"".join([piece async for piece in self])

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if kind is None and self._done and self._reusable and not self._aborted and conn.clean:
            self._pool._release(self._key, conn)
        else:
            conn.close()


class _Pipe:
    """`Exchange.pipe` while it runs. A plain object, not closures: nothing refers back to it once it
    ended, so the sink (a handler, and what it holds) is freed when the request is, not at the
    next garbage collection."""

    __slots__ = ("_conn", "_exchange", "_held", "_sink", "ended")

    def __init__(self, exchange: Exchange, conn: _Connection, sink: Sink) -> None:
        self._exchange: Exchange | None = exchange
        self._conn = conn
        self._sink: Sink | None = sink
        self._held = False  # reading is held for a future of the sink
        # Resolved by `end`, then let go: an error it holds has `feed`'s frame, and so this object,
        # in its traceback.
        self.ended: asyncio.Future[None] | None = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes, error: Exception | None) -> None:
        """What the connection received (b"" and the error, if any, once it ended)."""
        exchange, sink = self._exchange, self._sink
        if exchange is None or sink is None:
            return
        try:
            if error is not None:
                raise UpstreamError(f"connection lost mid-body: {error!r}") from error
            payload = exchange._take(data)
            if payload:
                waiting = sink(payload)
                if waiting is not None and not waiting.done() and not self._held:
                    self._held = True
                    if self._conn.transport is not None:
                        self._conn.transport.pause_reading()
                    waiting.add_done_callback(self._resume)
        except BaseException as exc:  # the sink's own error ends the pipe as well
            self.end(exc)
            return
        if exchange._done:
            self.end()

    def _resume(self, waited: asyncio.Future[None]) -> None:
        if not waited.cancelled():
            waited.exception()  # retrieved: the sink learns of it on its own
        if self._sink is not None:
            self._release()

    def _release(self) -> None:
        conn = self._conn
        if self._held and not conn.lost and conn.transport is not None:
            conn.transport.resume_reading()
        self._held = False

    def end(self, error: BaseException | None = None) -> None:
        if self._sink is None:
            return
        self._conn.pipe = None
        self._release()
        self._exchange = self._sink = None
        ended, self.ended = self.ended, None
        if ended is None or ended.done():  # cancelled with the task that awaited it
            return
        if error is None:
            ended.set_result(None)
        else:
            ended.set_exception(error)


class UpstreamPool:
    """Keep-alive connections to the upstream, `max_idle` idle ones per origin at most."""

    def __init__(self, max_idle: int = 64, idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self._idle: dict[Key, collections.deque[_Connection]] = {}
        self._sweeping = False
        self._closed = False
        self.opened = 0  # connections opened since start (for tests and the benchmark)

    def stream(
        self,
        method: str,
        url: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
        connect_timeout: float = 10,
    ) -> Exchange:
        """An exchange, not started: `async with` it (see the module docstring)."""
        return Exchange(self, method, url, headers, body, connect_timeout)

    def idle_count(self) -> int:
        return sum(len(pool) for pool in self._idle.values())

    def close(self) -> None:
        self._closed = True
        for pool in self._idle.values():
            for conn in pool:
                conn.close()
        self._idle.clear()

    async def _checkout(self, key: Key, connect_timeout: float) -> tuple[_Connection, bool]:
        pool = self._idle.get(key)
        now = time.monotonic()
        while pool:
            conn = pool.pop()  # the most recently used: the least likely to have been closed
            fresh = now - conn.idle_since < self.idle_timeout
            conn.idle_since = -1.0
            if fresh and conn.clean:
                return conn, True
            conn.close()
        scheme, host, port = key
        context = ssl.create_default_context() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, host, port, ssl=context), connect_timeout
            )
        except (TimeoutError, OSError) as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc!r}") from exc
        self.opened += 1
        return conn, False

    def _release(self, key: Key, conn: _Connection) -> None:
        pool = self._idle.setdefault(key, collections.deque())
        if len(pool) >= self.max_idle or self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        pool.append(conn)
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(self.idle_timeout, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle past `idle_timeout` (oldest first), so none lingers in CLOSE_WAIT,
        and those the upstream closed meanwhile."""
        deadline = time.monotonic() - self.idle_timeout
        for key, pool in list(self._idle.items()):
            for conn in [c for c in pool if c.idle_since <= deadline or not c.clean]:
                pool.remove(conn)
                conn.close()
            if not pool:
                del self._idle[key]
        self._sweeping = bool(self._idle) and not self._closed
        if self._sweeping:
            asyncio.get_running_loop().call_later(self.idle_timeout / 2, self._sweep)

"""The gateway's HTTP client to the upstream: keep-alive pooled, cancellable, no proxies, no redirects
(docs/gateway.md, "The upstream connection").

`PooledClient` is an `AsyncHTTPClient` (so `fetch(HTTPRequest)` works as anywhere in Tornado) that
speaks HTTP/1.1 itself over `IOStream`s kept in a small pool per upstream origin:

- **Reuse.** A connection goes back to the pool only after a complete, well-framed response
  (Content-Length or chunked) with no `Connection: close`, on HTTP/1.1, when nothing went wrong
  and nobody cancelled it. Idle connections live at most `idle_timeout` seconds (below uvicorn's
  5 s keep-alive, so vLLM rarely closes one under us) and are checked with a non-blocking
  `MSG_PEEK` before reuse. If a reused connection is still reset before a single response byte
  arrives, the request is sent once more on a new connection: the upstream had closed it while
  idle and dropped our request unread. A clean close after the request is never retried (the
  upstream may have started the generation); the client gets a 502.
- **Streaming with backpressure.** `streaming_callback` gets the body as it arrives, de-chunked,
  once per socket read (the chunks that arrived together are passed together, so the gateway
  flushes once for them). If it returns an awaitable, the next read waits for it.
  An exception raised in it (the client went away) closes the connection and ends the fetch.
- **Cancellation.** `cancel(request)` closes the request's upstream socket at once, so vLLM
  aborts the generation and frees the slot; that connection is never reused.
- No environment proxy, no redirect following, no decompression: the gateway relays what it gets.
  Only `connect_timeout` applies; a generation may legitimately take hours.
"""

from __future__ import annotations

import collections
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from io import BytesIO
from typing import Any
from urllib.parse import urlsplit

from tornado import gen
from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse
from tornado.httputil import HTTPHeaders
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient

MAX_HEAD = 64 * 1024  # status line + headers of one response
MAX_CHUNK_LINE = 1024
READ_SIZE = 64 * 1024
_NO_BODY = frozenset({204, 304})


class UpstreamProtocolError(StreamClosedError):
    """The upstream broke HTTP/1.1 framing; the connection is dropped (never reused)."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


class _Stale(Exception):
    """A reused connection was closed by the upstream before any response byte: safe to resend."""


_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?\r\n")


class _Dechunker:
    """Incremental `Transfer-Encoding: chunked` decoder: feed bytes, get payload, until `done`.

    An SSE stream is many small chunks per socket read; each whole chunk costs one regex match
    and one slice here (the fast path), and only chunks split across reads go through the state.
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
        pos = 0
        end = len(buffer)
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


class _Idle:
    __slots__ = ("since", "stream")

    def __init__(self, stream: IOStream, since: float) -> None:
        self.stream = stream
        self.since = since


class PooledClient(AsyncHTTPClient):
    """See the module docstring. `max_idle` idle connections are kept per origin."""

    def initialize(  # type: ignore[override]
        self, max_idle: int = 64, idle_timeout: float = 4.0, defaults: dict[str, Any] | None = None
    ) -> None:
        super().initialize(defaults=defaults)
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self._idle: dict[tuple[str, str, int], collections.deque[_Idle]] = {}
        self._tcp = TCPClient()
        self._sweeping = False
        self.opened = 0  # connections opened since start (for tests and the benchmark)

    def close(self) -> None:
        for pool in self._idle.values():
            for idle in pool:
                idle.stream.close()
        self._idle.clear()
        self._tcp.close()
        super().close()

    @staticmethod
    def cancel(request: HTTPRequest) -> None:
        """Close the upstream connection of `request` now (no-op if it has none yet or is done)."""
        stream = getattr(request, "_vu_stream", None)
        request._vu_cancelled = True  # type: ignore[attr-defined]
        if stream is not None and not stream.closed():
            stream.close()

    def idle_count(self) -> int:
        return sum(len(pool) for pool in self._idle.values())

    # --- fetch ---------------------------------------------------------------------------------

    def fetch_impl(self, request: HTTPRequest, callback: Callable[[HTTPResponse], None]) -> None:
        IOLoop.current().add_future(
            gen.convert_yielded(self._fetch(request, callback)), lambda future: future.result()
        )

    async def _fetch(self, request: HTTPRequest, callback: Callable[[HTTPResponse], None]) -> None:
        original = getattr(request, "request", request)  # fetch() hands us a _RequestProxy
        started = time.monotonic()
        try:
            parts = urlsplit(request.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"unsupported upstream URL {request.url!r}")
            key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            head = self._request_head(request, parts.netloc, target)
            for _attempt in range(2):
                stream, reused = await self._connection(key, request)
                if getattr(original, "_vu_cancelled", False):
                    stream.close()
                    raise StreamClosedError()
                original._vu_stream = stream
                try:
                    code, reason, headers, body = await self._exchange(stream, key, request, head, reused)
                    break
                except _Stale:
                    continue
            else:  # pragma: no cover - the second attempt is on a new connection, never _Stale
                raise StreamClosedError()
        except Exception as exc:
            callback(HTTPResponse(request, 599, error=exc, request_time=time.monotonic() - started))
            return
        response = HTTPResponse(
            request,
            code,
            headers=headers,
            buffer=BytesIO(body) if body is not None else None,
            reason=reason,
            request_time=time.monotonic() - started,
            start_time=started,
        )
        callback(response)

    @staticmethod
    def _request_head(request: HTTPRequest, netloc: str, target: str) -> bytes:
        lines = [f"{request.method} {target} HTTP/1.1", f"Host: {netloc}"]
        body = request.body
        for name, value in request.headers.get_all():
            lower = name.lower()
            if lower in ("host", "content-length", "connection", "transfer-encoding"):
                continue
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} contains a line break")
            lines.append(f"{name}: {value}")
        if body is not None or request.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _exchange(
        self, stream: IOStream, key: tuple[str, str, int], request: HTTPRequest, head: bytes, reused: bool
    ) -> tuple[int, str, HTTPHeaders, bytes | None]:
        body = request.body
        try:
            stream.write(head)
            if body:
                stream.write(body)
            data = await stream.read_until(b"\r\n\r\n", max_bytes=MAX_HEAD)
        except StreamClosedError:
            original = getattr(request, "request", request)
            cancelled = getattr(original, "_vu_cancelled", False)
            # A reset on a reused connection with nothing received: the upstream had closed it while
            # idle and discarded our request unread (a server that reads a request and then closes
            # sends FIN, not RST). Anything else may have been processed: never sent twice.
            reset = isinstance(stream.error, (ConnectionResetError, BrokenPipeError))
            if reused and reset and not cancelled and stream._read_buffer_size == 0:
                raise _Stale() from None
            raise
        except BaseException:
            stream.close()
            raise
        try:
            version, code, reason, header_list = _parse_head(data[:-4])
            while 100 <= code < 200:  # interim responses (100 Continue, 103 Early Hints): skip
                data = await stream.read_until(b"\r\n\r\n", max_bytes=MAX_HEAD)
                version, code, reason, header_list = _parse_head(data[:-4])
            headers = HTTPHeaders()
            for name, value in header_list:
                headers.add(name, value)
            header_callback = request.header_callback
            if header_callback is not None:
                header_callback(f"{version} {code} {reason}\r\n")
                for name, value in header_list:
                    header_callback(f"{name}: {value}\r\n")
                header_callback("\r\n")
            reusable = version == "HTTP/1.1" and "close" not in headers.get("Connection", "").lower()
            sink = request.streaming_callback
            chunks: list[bytes] | None = None if sink is not None else []
            if request.method == "HEAD" or code in _NO_BODY:
                pass
            elif "chunked" in headers.get("Transfer-Encoding", "").lower():
                decoder = _Dechunker()
                while not decoder.done:
                    payload = decoder.feed(await stream.read_bytes(READ_SIZE, partial=True))
                    if payload:
                        await self._deliver(payload, sink, chunks)
            elif "Content-Length" in headers:
                text = headers["Content-Length"]
                if not text.isdigit() or len(text) > 18:
                    raise UpstreamProtocolError(f"bad Content-Length {text[:20]!r}")
                left = int(text)
                while left:
                    payload = await stream.read_bytes(min(left, READ_SIZE), partial=True)
                    left -= len(payload)
                    await self._deliver(payload, sink, chunks)
            else:  # delimited by the end of the connection
                reusable = False
                try:
                    while True:
                        await self._deliver(await stream.read_bytes(READ_SIZE, partial=True), sink, chunks)
                except StreamClosedError:
                    if stream.error:
                        raise
        except BaseException:
            stream.close()
            raise
        original = getattr(request, "request", request)
        original._vu_stream = None
        if reusable and not getattr(original, "_vu_cancelled", False) and stream._read_buffer_size == 0:
            self._release(key, stream)
        else:
            stream.close()
        return code, reason, headers, b"".join(chunks) if chunks is not None else None

    @staticmethod
    async def _deliver(
        payload: bytes, sink: Callable[[bytes], Awaitable[None] | None] | None, chunks: list[bytes] | None
    ) -> None:
        if sink is None:
            assert chunks is not None
            chunks.append(payload)
            return
        pending = sink(payload)
        if pending is not None:
            await pending

    # --- the pool ------------------------------------------------------------------------------

    async def _connection(self, key: tuple[str, str, int], request: HTTPRequest) -> tuple[IOStream, bool]:
        pool = self._idle.get(key)
        now = time.monotonic()
        while pool:
            idle = pool.pop()  # the most recently used: the least likely to have been closed
            if now - idle.since < self.idle_timeout and _still_open(idle.stream):
                return idle.stream, True
            idle.stream.close()
        scheme, host, port = key
        ssl_options = None
        if scheme == "https":
            ssl_options = ssl.create_default_context()
            if not request.validate_cert:
                ssl_options.check_hostname = False
                ssl_options.verify_mode = ssl.CERT_NONE
        stream = await self._tcp.connect(
            host, port, ssl_options=ssl_options, timeout=request.connect_timeout or 10
        )
        stream.set_nodelay(True)
        self.opened += 1
        return stream, False

    def _release(self, key: tuple[str, str, int], stream: IOStream) -> None:
        pool = self._idle.setdefault(key, collections.deque())
        if len(pool) >= self.max_idle or self._closed:
            stream.close()
            return
        pool.append(_Idle(stream, time.monotonic()))
        if not self._sweeping:
            self._sweeping = True
            IOLoop.current().call_later(self.idle_timeout, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle past `idle_timeout` (oldest first), so none lingers in CLOSE_WAIT."""
        deadline = time.monotonic() - self.idle_timeout
        for key, pool in list(self._idle.items()):
            while pool and pool[0].since <= deadline:
                pool.popleft().stream.close()
            if not pool:
                del self._idle[key]
        self._sweeping = bool(self._idle) and not self._closed
        if self._sweeping:
            IOLoop.current().call_later(self.idle_timeout / 2, self._sweep)


def _still_open(stream: IOStream) -> bool:
    """An idle keep-alive connection is usable if it is open and nothing unread is waiting on it."""
    if stream.closed() or stream._read_buffer_size:
        return False
    if isinstance(stream.socket, ssl.SSLSocket):
        return True  # no MSG_PEEK on TLS; a stale one is caught by the resend rule
    try:
        stream.socket.recv(1, socket.MSG_PEEK)  # b"" is an orderly close, bytes are unexpected
        return False
    except BlockingIOError:
        return True  # open, nothing to read: what a healthy idle connection looks like
    except (OSError, ssl.SSLError):
        return False

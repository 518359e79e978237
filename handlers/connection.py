"""A client connection: HTTP/1.x read and written here, each request run by Tornado's application.

Tornado's `HTTPServer` reads a connection through an `IOStream` and a coroutine per request
(`HTTP1Connection`); together they cost 60-80 µs of CPU per request more than a bare asyncio
protocol, a fifth of a small gateway request (docs/performance.md, "Issue 18: the connection
layer"). This module puts a protocol in their place: one object per connection, driven by the
loop's callbacks, no task per request. What
runs a request is unchanged: Tornado's `Application` routes it and a `RequestHandler` answers it,
through `RequestConnection`, which is the `tornado.httputil.HTTPConnection` of one request.

The rules are Tornado's, kept one by one (docs/security.md, "Connections and bodies"):

- The request head is parsed by `tornado.httputil` (start line and header checks), except a header
  block whose every line is plain (`parse_headers`: the same headers, in a third of the time; any
  other block goes to Tornado's parser); a head larger than `MAX_HEADER_BYTES` closes the
  connection, a malformed one is answered 400 and closed.
- An answer's head with a line break inside a line (a header name: Tornado checks values and
  reason phrases, not names) is not written: the connection is closed and the handler's write fails.
- The head must be complete within the header timeout, counted from the connection's start or the
  end of the previous answer (the idle keep-alive time too); the body within the body timeout
  (a handler may change it per request), counted once from when reading it starts. Past either,
  the connection is closed.
- Framing: `Content-Length` as ASCII digits (equal copies joined by commas are one), or
  `Transfer-Encoding: chunked` alone; both, another coding, or a body over the size limit (a handler
  may lower it) is a 400 and a close: a request smuggled past a proxy starts there.
- `Expect: 100-continue` is answered only after the handler's `prepare` ran and only if it did not
  answer already: a refused request never has its body sent.
- Keep-alive as HTTP/1.1 has it: `Connection: close` ends it; HTTP/1.0 keeps the connection only
  with `Connection: keep-alive` (and a body length, or GET/HEAD).
- An answer finished before its request's body was read closes the connection: lingering
  (`linger_after_close`, handlers/server.py) when the handler asks for it, plainly otherwise.
- Requests sent ahead (pipelined) wait in the buffer until the answer before them is finished; at
  most `READ_AHEAD_BYTES` are buffered beyond what a request is reading, then reading pauses.
- A write's future resolves once the transport holds less than `WRITE_HIGH_WATER` bytes (at once
  when it took the data whole: awaiting it then does not turn the loop): a handler awaiting
  `flush()` waits for a slow client (backpressure), and on a closed connection, or one whose peer
  is gone, it fails with `StreamClosedError`, as an `IOStream`'s does.
- A handler that raises is logged and its connection closed; its delegate hears of the close. An
  `HTTPInputError` raised while a request is set up (Tornado's request refuses a bad `Host`) is
  bad input, not a fault: 400 and a close, as bad framing.

Runs on the loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tornado import httputil
from tornado.iostream import StreamClosedError

if TYPE_CHECKING:
    from handlers.server import GuardedHTTPServer

app_log = logging.getLogger("tornado.application")
gen_log = logging.getLogger("tornado.general")

MAX_HEADER_BYTES = 64 * 1024  # the request line and headers together (Tornado's default)
CHUNK_BYTES = 64 * 1024  # the most one `data_received` call is given (Tornado's chunk_size)
CHUNK_LINE_BYTES = 64  # a chunk-size line of a chunked body, CRLF included (Tornado's)
READ_AHEAD_BYTES = 256 * 1024  # buffered beyond the request being read before reading pauses
WRITE_HIGH_WATER = 64 * 1024
CONTINUE = b"HTTP/1.1 100 (Continue)\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\n\r\n"

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_DIGITS = re.compile(r"[0-9]+")
_HEX_DIGITS = re.compile(r"[0-9a-fA-F]+")
_CONTENT_LENGTHS = re.compile(r",[ \t]*")
# A header block every line of which Tornado's `HTTPHeaders.parse` takes as it is: a token, a colon,
# a value of visible characters, obs-text, spaces and tabs, CRLF. Anything else (LF endings, folding,
# a control character …) goes to Tornado's parser, which takes it or says why not.
_PLAIN_HEADERS = re.compile(r"\n(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t \x21-\x7e\x80-\xff]*\r\n)*\r\n")

# What the connection is reading.
_HEAD, _BODY, _CHUNKED, _DONE, _LINGER = range(5)
# Where a chunked body is: a size line, the data of a chunk, the CRLF after it, the CRLF at the end.
_SIZE, _DATA, _DATA_END, _LAST = range(4)


def parse_headers(block: str) -> httputil.HTTPHeaders:
    """The headers of a request head (from the end of its start line to the blank line), exactly as
    `HTTPHeaders.parse` has them, in a third of its time when every line is plain (it checks each
    line with two patterns, the value's one character by character)."""
    if not _PLAIN_HEADERS.fullmatch(block):
        return httputil.HTTPHeaders.parse(block)
    headers = httputil.HTTPHeaders()
    for line in block[1:-4].split("\r\n") if len(block) > 3 else ():
        name, _, value = line.partition(":")
        if name in headers:
            headers.add(name, value.strip(" \t"))
        else:
            headers[name] = value.strip(" \t")
    return headers


def _parse_int(text: str) -> int:
    if _DIGITS.fullmatch(text) is None:
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def _closed_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_exception(StreamClosedError())
    future.exception()  # retrieved: a caller that never awaits it logs nothing
    return future


class _Context:
    """What `HTTPServerRequest` reads of a connection (`remote_ip`, `protocol`), as Tornado's."""

    def __init__(self, address: Any, family: int) -> None:
        self.address = address
        self.address_family = family
        inet = family in (socket.AF_INET, socket.AF_INET6) and address
        self.remote_ip = address[0] if inet else "0.0.0.0"  # noqa: S104 (Tornado's word for "not IP")
        self.protocol = "http"
        self.trusted_downstream: set[str] = set()

    def __str__(self) -> str:
        return self.remote_ip


class _Quiet(Exception):
    """A handler raised; it was logged and the connection closed."""


class RequestConnection(httputil.HTTPConnection):
    """One request and its answer on a `Connection`: the `HTTPConnection` Tornado's handlers write to."""

    def __init__(
        self, connection: Connection, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders
    ) -> None:
        self.connection = connection
        self.context = connection.context
        self.start_line = start_line
        self.request_headers = headers
        self.delegate: httputil.HTTPMessageDelegate | None = None
        self.max_body_size = connection.server.max_body_size
        self.body_timeout = connection.server.body_timeout
        self.disconnect_on_finish = not _can_keep_alive(start_line, headers)
        self.delegate_open = False  # told of a close while reading: from the head to delegate.finish()
        self.read_finished = False
        self.write_finished = False
        self.headers_written = False
        self.ended = False
        self.linger = False
        self._chunking = False
        self._remaining: int | None = None  # bytes the answer's Content-Length still expects
        self._close_callback: Callable[[], None] | None = None

    # --- tornado.httputil.HTTPConnection ---------------------------------------------------------

    def write_headers(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
        chunk: bytes | None = None,
    ) -> asyncio.Future[None]:
        assert isinstance(start_line, httputil.ResponseStartLine)
        request = self.start_line
        code = start_line.code
        self._chunking = (
            request.version == "HTTP/1.1"
            and request.method != "HEAD"
            and code not in (204, 304)
            and not 100 <= code < 200
            and "Content-Length" not in headers
        )
        if request.version == "HTTP/1.1" and self.disconnect_on_finish:
            headers["Connection"] = "close"
        if (
            request.version == "HTTP/1.0"
            and self.request_headers.get("Connection", "").lower() == "keep-alive"
        ):
            headers["Connection"] = "Keep-Alive"
        if self._chunking:
            headers["Transfer-Encoding"] = "chunked"
        if request.method == "HEAD" or code == 304:
            self._remaining = 0
        elif "Content-Length" in headers:
            self._remaining = _parse_int(headers["Content-Length"])
        else:
            self._remaining = None
        lines = [f"HTTP/1.1 {code} {start_line.reason}"]
        lines += [f"{name}: {value}" for name, value in headers.get_all()]
        head = "\r\n".join(lines)
        # The joins put len(lines) - 1 of each there: one more is a CR or LF inside a line.
        if head.count("\r") >= len(lines) or head.count("\n") >= len(lines):
            bad = next(line for line in lines if "\r" in line or "\n" in line)
            self.connection.abort()  # nothing of this answer goes out, not even what follows
            raise ValueError(f"Illegal characters (CR or LF) in header: {bad!r}")
        self.headers_written = True
        data = (head + "\r\n\r\n").encode("latin-1")
        if chunk:
            data += self._frame(chunk)
        return self.connection.send(data)

    def write(self, chunk: bytes) -> asyncio.Future[None]:
        return self.connection.send(self._frame(chunk))

    def finish(self) -> None:
        if self._remaining and not self.connection.closed:
            self.connection.abort()
            raise httputil.HTTPOutputError(f"Tried to write {self._remaining} bytes less than Content-Length")
        if self._chunking:
            self.connection.send(b"0\r\n\r\n")
        self.write_finished = True
        if not self.read_finished:
            # The body is still coming: closing is the only way not to read it (lingering if asked).
            self.disconnect_on_finish = True
        self._close_callback = None
        self.connection.answered(self)

    def set_close_callback(self, callback: Callable[[], None] | None) -> None:
        self._close_callback = callback

    # --- what HTTP1Connection offers besides, and handlers/ use ----------------------------------

    def set_body_timeout(self, timeout: float) -> None:
        self.body_timeout = timeout

    def set_max_body_size(self, max_body_size: int) -> None:
        self.max_body_size = max_body_size

    def detach(self) -> Any:
        raise NotImplementedError("vllm-use serves no protocol upgrades")

    def close(self) -> None:
        """Close the connection now (what was not sent yet is dropped), as `IOStream.close`."""
        if not self.ended:
            self.connection.abort()

    def closed(self) -> bool:
        return self.connection.closed or self.ended

    def linger_after_close(self) -> None:
        """Make the close that follows an early answer linger (handlers/server.py)."""
        self.linger = True

    # --- for Connection ---------------------------------------------------------------------------

    def lost(self) -> None:
        """The connection closed under this exchange: tell whoever listens, once."""
        if self.ended:
            return
        self.ended = True
        delegate, callback = self.delegate, self._close_callback
        # What may still hold this object (app.live's entry) must not hold the handler too.
        self.delegate = self._close_callback = None
        if self.delegate_open and delegate is not None:
            self.delegate_open = False
            try:
                delegate.on_connection_close()
            except Exception:
                app_log.error("Uncaught exception", exc_info=True)
        elif callback is not None:
            try:
                callback()
            except Exception:
                app_log.error("Uncaught exception", exc_info=True)

    def _frame(self, chunk: bytes) -> bytes:
        if self._remaining is not None:
            self._remaining -= len(chunk)
            if self._remaining < 0:
                self.connection.abort()  # stops further framing errors
                raise httputil.HTTPOutputError("Tried to write more data than Content-Length")
        if self._chunking and chunk:  # an empty chunk would end the body
            return b"%x\r\n%s\r\n" % (len(chunk), chunk)
        return chunk


def _can_keep_alive(start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> bool:
    connection = headers.get("Connection")
    connection = connection.lower() if connection is not None else None
    if start_line.version == "HTTP/1.1":
        return connection != "close"
    if "Content-Length" in headers or "Transfer-Encoding" in headers or start_line.method in ("HEAD", "GET"):
        return connection == "keep-alive"
    return False


class Connection(asyncio.Protocol):
    """One client connection (module docstring). Made by `GuardedHTTPServer.admit`."""

    def __init__(self, server: GuardedHTTPServer, address: Any, refusal: bytes | None = None) -> None:
        """`refusal`: a whole answer to send before closing lingering, nothing read (the cap)."""
        self.server = server
        self._refusal = refusal
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.context = _Context(address, socket.AF_INET)
        self.closed = False  # no more HTTP on it: closed, closing or lingering
        self._ending = False  # the transport was told to close
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._scanned = 0  # how far the search for the head's end got
        self._state = _HEAD
        self._exchange: RequestConnection | None = None
        self._blocked = False  # waiting for a handler's future
        self._reading_paused = False
        self._writing_paused = False
        self._drained: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._body_left = 0  # fixed body: bytes still to read; chunked: of the current chunk
        self._chunk_phase = _SIZE
        self._chunked_total = 0
        self._counted = refusal is None  # holds a place under the server's connection cap

    # --- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.track(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.context = _Context(self.address, sock.family)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self._refusal is not None:
            self.transport.write(self._refusal)
            self._linger()
            return
        self._arm(self.server.idle_connection_timeout, self._head_timeout)

    def data_received(self, data: bytes) -> None:
        if self._state == _LINGER:
            self._drop(len(data))
            return
        self._buf += data
        if not self._blocked and self._state != _DONE:
            self._advance()
        else:
            self._pace()

    def eof_received(self) -> bool | None:
        return None  # the client is done: close (an answer still due cannot be read by it anyway)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        self._uncount()
        if self._state == _LINGER:
            self.server.lingering_ended()
        self._buf = bytearray()
        for future in self._drained:
            if not future.done():
                future.set_exception(StreamClosedError())
                future.exception()
        self._drained.clear()
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.lost()
        self.server.forget(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        drained, self._drained = self._drained, []
        for future in drained:
            if not future.done():
                future.set_result(None)

    # --- writing ----------------------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future[None]:
        if self.closed or self.transport.is_closing():  # type: ignore[union-attr]
            # A transport that lost its peer is closing before connection_lost runs: a write
            # there would be dropped without a word, and the writer would never learn.
            return _closed_future()
        self.transport.write(data)  # type: ignore[union-attr]
        future: asyncio.Future[None] = self._loop.create_future()
        if self._writing_paused:
            self._drained.append(future)
        else:
            future.set_result(None)
        return future

    def abort(self) -> None:
        """Close now, dropping what was not sent (a cut, or a handler's `close`)."""
        self.closed = True
        self._uncount()
        if not self._ending:
            self._ending = True
            self.transport.abort()  # type: ignore[union-attr]

    def shut(self) -> None:
        """Close once what was written is sent (the end of an answer, or of the server)."""
        self.closed = True
        self._uncount()
        if not self._ending:
            self._ending = True
            self.transport.close()  # type: ignore[union-attr]

    def never_started(self) -> None:
        """The socket could not be set up (GuardedHTTPServer.admit): free its place."""
        self.closed = True
        self._uncount()

    def answered(self, exchange: RequestConnection) -> None:
        """`exchange` finished its answer: the connection closes, or goes on with the next request."""
        if exchange is not self._exchange:
            return
        exchange.ended = True
        exchange.delegate = None
        self._exchange = None
        self._disarm()
        if exchange.disconnect_on_finish:
            if exchange.linger:
                self._linger()
            else:
                self.shut()
            return
        self._state = _HEAD
        self._scanned = 0
        # After the handler's own end (Tornado's finish runs on_finish after this): not inside it.
        self._loop.call_soon(self._next)

    # --- reading ----------------------------------------------------------------------------------

    def _next(self) -> None:
        if self.closed or self._state != _HEAD or self._exchange is not None:
            return
        self._arm(self.server.idle_connection_timeout, self._head_timeout)
        if self._buf:
            self._advance()
        else:
            self._pace()

    def _advance(self) -> None:
        self._run(self._read)

    def _pace(self) -> None:
        """Pause reading while more than READ_AHEAD_BYTES wait in the buffer; resume below."""
        if self.closed:
            return
        if len(self._buf) > READ_AHEAD_BYTES:
            if not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
        elif self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _run(self, step: Callable[[], None]) -> None:
        """Run a reading step; a malformed request is answered 400 and closed (Tornado's words)."""
        try:
            step()
            self._pace()
        except httputil.HTTPInputError as exc:
            gen_log.info("Malformed HTTP message from %s: %s", self.context, exc)
            exchange = self._exchange
            if exchange is None or not exchange.headers_written:
                self.transport.write(BAD_REQUEST)  # type: ignore[union-attr]
            self.shut()
            if exchange is not None:
                exchange.lost()
        except _Quiet:
            pass

    def _read(self) -> None:
        """Read what the buffer holds, as far as it goes and no handler is awaited."""
        while not self._blocked and not self.closed:
            if self._state == _HEAD:
                if not self._read_head():
                    return
            elif self._state == _BODY:
                if not self._read_fixed():
                    return
            elif self._state == _CHUNKED:
                if not self._read_chunked():
                    return
            else:
                return

    def _read_head(self) -> bool:
        found = _HEAD_END.search(self._buf, max(0, self._scanned - 3))
        if found is None or found.end() > MAX_HEADER_BYTES:
            if found is not None or len(self._buf) > MAX_HEADER_BYTES:
                self.abort()  # a head this large is not read (Tornado closes too)
                return False
            self._scanned = len(self._buf)
            return False
        end = found.end()
        text = self._buf[:end].decode("latin-1").lstrip("\r\n")
        del self._buf[:end]
        self._scanned = 0
        self._disarm()
        eol = text.find("\n")
        start_line = httputil.parse_request_start_line(text[:eol].rstrip("\r"))
        headers = parse_headers(text[eol:])
        exchange = self._exchange = RequestConnection(self, start_line, headers)
        delegate = exchange.delegate = self.server.application.start_request(self, exchange)
        exchange.delegate_open = True
        self._state = _DONE  # until the head's handler is done with it
        waiting = self._call(delegate.headers_received, start_line, headers)
        if waiting is not None:
            return self._wait(waiting, self._after_head)
        self._after_head()
        return True

    def _after_head(self) -> None:
        exchange = self._exchange
        if exchange is None or self.closed:
            return
        headers = exchange.request_headers
        if headers.get("Expect") == "100-continue" and not exchange.write_finished:
            self.transport.write(CONTINUE)  # type: ignore[union-attr]
        length: int | None = None
        if "Content-Length" in headers:
            raw = headers["Content-Length"]
            if "," in raw:  # equal copies from a proxy are one; unequal ones a framing attack
                pieces = _CONTENT_LENGTHS.split(raw)
                if any(piece != pieces[0] for piece in pieces):
                    raise httputil.HTTPInputError(f"Multiple unequal Content-Lengths: {raw!r}")
                headers["Content-Length"] = raw = pieces[0]
            try:
                length = _parse_int(raw)
            except ValueError:
                raise httputil.HTTPInputError(f"Only integer Content-Length is allowed: {raw}") from None
            if length > exchange.max_body_size:
                raise httputil.HTTPInputError("Content-Length too long")
        if "Transfer-Encoding" in headers:
            if length is not None:
                raise httputil.HTTPInputError("Message with both Transfer-Encoding and Content-Length")
            if headers["Transfer-Encoding"].lower() != "chunked":
                raise httputil.HTTPInputError(f"Unsupported Transfer-Encoding {headers['Transfer-Encoding']}")
            self._state = _CHUNKED
            self._chunk_phase = _SIZE
            self._chunked_total = 0
        elif length:
            self._state = _BODY
            self._body_left = length
        else:
            self._body_read()
            return
        if exchange.body_timeout is not None:
            self._arm(exchange.body_timeout, self._body_timeout)

    def _read_fixed(self) -> bool:
        size = min(len(self._buf), self._body_left)
        if not size:
            return False
        self._body_left -= size
        if size == len(self._buf):
            piece, self._buf = bytes(self._buf), bytearray()
        else:
            piece = bytes(self._buf[:size])
            del self._buf[:size]
        if not self._body_left:
            self._state = _DONE
        if not self._deliver(piece, self._after_piece):
            return False
        self._after_piece()
        return True

    def _read_chunked(self) -> bool:
        pending, more = self._decode_chunks()
        if pending and not self._deliver(pending, self._after_piece):
            return False
        self._after_piece()
        return more

    def _decode_chunks(self) -> tuple[bytes, bool]:
        """Decode what the buffer holds of a chunked body: the data (at most CHUNK_BYTES, small
        chunks coalesced), and whether more may be decoded at once."""
        exchange = self._exchange
        assert exchange is not None
        pending = bytearray()
        buf = self._buf
        while True:
            if self._chunk_phase == _SIZE:
                eol = buf.find(b"\r\n", 0, CHUNK_LINE_BYTES)
                if eol < 0:
                    if len(buf) >= CHUNK_LINE_BYTES:
                        self._fail()  # a size line this long is not read (Tornado closes too)
                        raise _Quiet
                    return bytes(pending), False
                text = buf[:eol].decode("latin-1")
                if _HEX_DIGITS.fullmatch(text) is None:
                    raise httputil.HTTPInputError("invalid chunk size")
                size = int(text, 16)
                del buf[: eol + 2]
                if size == 0:
                    self._chunk_phase = _LAST
                    continue
                self._chunked_total += size
                if self._chunked_total > exchange.max_body_size:
                    raise httputil.HTTPInputError("chunked body too large")
                self._body_left = size
                self._chunk_phase = _DATA
            elif self._chunk_phase == _DATA:
                take = min(len(buf), self._body_left, CHUNK_BYTES - len(pending))
                if not take:
                    return bytes(pending), len(pending) >= CHUNK_BYTES
                pending += buf[:take]
                del buf[:take]
                self._body_left -= take
                if not self._body_left:
                    self._chunk_phase = _DATA_END
            else:  # _DATA_END or _LAST: a CRLF
                if len(buf) < 2:
                    return bytes(pending), False
                if buf[:2] != b"\r\n":
                    last = self._chunk_phase == _LAST
                    raise httputil.HTTPInputError(
                        "improperly terminated chunked request" if last else "improperly terminated chunk"
                    )
                del buf[:2]
                if self._chunk_phase == _LAST:
                    self._state = _DONE
                    return bytes(pending), False
                self._chunk_phase = _SIZE

    def _after_piece(self) -> None:
        """After a piece of the body went to the handler: the body's end, if that was the last."""
        if self._state == _DONE and self._exchange is not None and not self._exchange.read_finished:
            self._body_read()

    def _deliver(self, piece: bytes, then: Callable[[], None]) -> bool:
        """Hand a piece of the body to the handler. False: it is awaited; `then` runs after."""
        exchange = self._exchange
        assert exchange is not None and exchange.delegate is not None
        if exchange.write_finished:
            return True  # answered already: what still comes is dropped
        waiting = self._call(exchange.delegate.data_received, piece)
        if waiting is None:
            return True
        return self._wait(waiting, then)

    def _body_read(self) -> None:
        exchange = self._exchange
        assert exchange is not None and exchange.delegate is not None
        self._disarm()
        self._state = _DONE
        exchange.read_finished = True
        if not exchange.write_finished:
            self._call(exchange.delegate.finish)
            exchange.delegate_open = False

    # --- the handler's futures, and its exceptions ------------------------------------------------

    def _call(self, method: Callable[..., Any], *args: Any) -> Awaitable[None] | None:
        try:
            result = method(*args)
        except httputil.HTTPInputError:
            raise  # a request Tornado's request object refuses (a bad Host): 400, as any bad framing
        except Exception:
            app_log.error("Uncaught exception", exc_info=True)
            self._fail()
            raise _Quiet from None
        if result is None:
            return None
        future = asyncio.ensure_future(result)
        if future.done():
            self._check(future)
            return None
        return future

    def _wait(self, future: Awaitable[None], then: Callable[[], None]) -> bool:
        """Stop reading until the handler's `future` is done, then run `then` and read on."""
        self._blocked = True

        def resumed(done: asyncio.Future[None]) -> None:
            self._blocked = False
            if self.closed:
                return

            def step() -> None:
                self._check(done)
                then()
                self._read()

            self._run(step)

        asyncio.ensure_future(future).add_done_callback(resumed)
        return False

    def _check(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            self._fail()
            raise _Quiet
        exc = future.exception()
        if isinstance(exc, httputil.HTTPInputError):
            raise exc
        if exc is not None:
            app_log.error("Uncaught exception", exc_info=(type(exc), exc, exc.__traceback__))
            self._fail()
            raise _Quiet

    def _fail(self) -> None:
        exchange = self._exchange
        self.abort()
        if exchange is not None:
            exchange.lost()

    # --- timeouts and lingering -------------------------------------------------------------------

    def _arm(self, seconds: float | None, then: Callable[[], None]) -> None:
        self._disarm()
        if seconds is not None:
            self._timer = self._loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        self.abort()

    def _body_timeout(self) -> None:
        self._timer = None
        gen_log.info("Timeout reading body from %s", self.context)
        exchange = self._exchange
        self.abort()
        if exchange is not None:
            exchange.lost()

    def _linger(self) -> None:
        """Shut our sending side once the answer is out, then read and drop what comes, bounded
        (handlers/server.py); at the server's lingering cap, a plain close."""
        if self.closed or not self.server.lingering_starts():
            self.shut()
            return
        self.closed = True
        self._uncount()
        self._state = _LINGER
        self._buf = bytearray()
        self._body_left = self.server.linger_bytes
        self._blocked = True
        self._arm(self.server.linger_seconds, self.shut)
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        try:
            self.transport.write_eof()  # type: ignore[union-attr]
        except OSError:  # the client is gone already
            self.abort()

    def _drop(self, size: int) -> None:
        self._body_left -= size
        if self._body_left <= 0:
            self.shut()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.server.open_connections -= 1

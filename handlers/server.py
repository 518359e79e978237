"""The HTTP server: a connection cap, accept back-off when descriptors run out, lingering close.

Limits (docs/security.md):

- **Descriptor budget.** `connection_limit` runs at start, before anything listens: it raises
  RLIMIT_NOFILE's soft limit to the hard limit, then derives the connection cap from it. Each
  gateway request can hold two descriptors (the client's and the upstream's), and
  `RESERVED_FDS` stay for SQLite, logs, children's pipes, the upstream pool's idle connections
  and lingering closes; by default the cap is what is left, halved, at most `DEFAULT_MAX`. An
  explicit `--max-connections` that does not fit is a start-up error (exit 2).
- **Connection cap.** At most `max_connections` client connections are served at once. One more
  is accepted, answered `503` with `Connection: close` at once and closed (lingering, below);
  refusals are counted and logged at most once per `LOG_EVERY_S`.
- **Accept back-off.** When `accept` fails for want of descriptors or memory (EMFILE, ENFILE,
  ENOBUFS, ENOMEM), the listening socket is taken off the loop for a delay that doubles from
  `BACKOFF_MIN_S` to `BACKOFF_MAX_S` (back to the minimum after the next accept), with one
  warning per `LOG_EVERY_S`. Tornado's own accept handler raises there, and the socket, still
  readable, then spins the loop at 100 % CPU with a traceback in the log per turn.
- **Lingering close.** A connection refused before its body was read (400, 401, 403, 413, 503) is
  not closed at once: with bytes unread, the kernel would answer them with a reset, and the
  client could lose the answer it has not read yet. Once the answer is written, the sending side
  is shut down and what arrives is read and dropped, up to `LINGER_BYTES` for `LINGER_S`, then
  the socket is closed (nginx's lingering close). At most `LINGER_MAX` sockets linger at once;
  beyond that they are closed at once.

Runs on the IOLoop. No TLS: the server listens on plain HTTP (docs/security.md).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections.abc import Iterable
from typing import Any

import tornado.httpserver
from tornado import gen
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError

from vllm_use.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MAX = 1024
FDS_PER_CONNECTION = 2  # the client's socket and, on /v1, the upstream's
# SQLite (database, -wal, -shm), the log, children's pipes, the listening sockets, the upstream
# pool's idle connections (at most 64) and lingering closes (at most LINGER_MAX).
RESERVED_FDS = 192
LINGER_BYTES = 1024 * 1024
LINGER_S = 2.0
LINGER_MAX = 64
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
LOG_EVERY_S = 5.0
ACCEPT_BATCH = 128  # accepts per readiness event, as tornado does: other work gets its turn
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_BUSY_BODY = b'{"error":{"code":"server_busy","message":"too many open connections; retry shortly"}}'
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json; charset=utf-8\r\n"
    b"Cache-Control: no-store\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


def connection_limit(configured: int | None) -> int:
    """The connection cap for this process: `configured`, or derived from the descriptor limit.

    Raises RLIMIT_NOFILE's soft limit to its hard limit first (a process may). Raises ConfigError
    naming --max-connections when the cap cannot fit the limit. Runs at start-up, before listening.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # an infinite hard limit beyond the kernel's nr_open
            pass
    room = (soft - RESERVED_FDS) // FDS_PER_CONNECTION if soft != resource.RLIM_INFINITY else DEFAULT_MAX
    if configured is None:
        if room < 1:
            raise ConfigError(
                "--max-connections",
                f"the open-file limit (RLIMIT_NOFILE {soft}) leaves no room for connections; "
                f"raise it (ulimit -n) above {RESERVED_FDS + 16}",
            )
        return min(room, DEFAULT_MAX)
    if configured > room:
        raise ConfigError(
            "--max-connections",
            f"{configured} connections need up to {configured * FDS_PER_CONNECTION + RESERVED_FDS} "
            f"open files, more than the limit (RLIMIT_NOFILE {soft}); lower it or raise the limit",
        )
    return configured


class _Throttled:
    """Counts an event and logs it at most once per LOG_EVERY_S, with the count since the last line."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.total = 0
        self._unreported = 0
        self._last: float | None = None

    def note(self, *args: Any) -> None:
        self.total += 1
        self._unreported += 1
        now = time.monotonic()
        if self._last is None or now - self._last >= LOG_EVERY_S:
            log.warning(self.message + " (%d since the last report)", *args, self._unreported)
            self._unreported = 0
            self._last = now


class ServerStream(IOStream):
    """A client connection; closing it frees its place under the cap."""

    def __init__(self, sock: socket.socket, server: GuardedHTTPServer, **kwargs: Any) -> None:
        super().__init__(sock, **kwargs)
        self.server = server
        self._lingerer: socket.socket | None = None

    def linger_after_close(self) -> None:
        """Make the coming close linger (module docstring). Call before an early answer: Tornado
        closes the stream once the answer is written (at once when it fits the socket's buffer),
        and a duplicate of the socket, kept open meanwhile, then lingers on."""
        if self._lingerer is not None or self.closed() or self.socket is None:
            return
        try:
            self._lingerer = self.socket.dup()
        except OSError:
            pass  # a plain close, then

    def close_fd(self) -> None:
        try:
            super().close_fd()  # the base closes the socket; IOStream.close calls this once
        finally:
            self.server.open_connections -= 1
            if self._lingerer is not None:
                duplicate, self._lingerer = self._lingerer, None
                try:
                    self.server.linger(IOStream(duplicate))
                except Exception:
                    duplicate.close()
                    raise


class _Acceptor:
    """Accepts on one listening socket, and steps back for a while when descriptors run out."""

    def __init__(self, server: GuardedHTTPServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.loop = IOLoop.current()
        self.delay = BACKOFF_MIN_S
        self.stopped = False
        self._timer: object | None = None
        self.loop.add_handler(sock, self._ready, IOLoop.READ)
        self._watching = True

    def stop(self) -> None:
        self.stopped = True
        if self._watching:
            self.loop.remove_handler(self.sock)
            self._watching = False
        if self._timer is not None:
            self.loop.remove_timeout(self._timer)
            self._timer = None

    def _ready(self, fd: Any, events: int) -> None:
        for _ in range(ACCEPT_BATCH):
            if self.stopped:
                return
            try:
                connection, address = self.sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._pause(exc)
                return
            self.delay = BACKOFF_MIN_S
            self.server.admit(connection, address)

    def _pause(self, exc: OSError) -> None:
        if exc.errno in _EXHAUSTED:
            self.server.exhausted.note(exc.strerror, self.delay)
        else:  # unexpected, but spinning on it would be worse than a pause
            log.warning("accept failed: %s; pausing %.2f s", exc, self.delay)
        self.loop.remove_handler(self.sock)
        self._watching = False
        self._timer = self.loop.call_later(self.delay, self._resume)
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)

    def _resume(self) -> None:
        self._timer = None
        if not self.stopped:
            self.loop.add_handler(self.sock, self._ready, IOLoop.READ)
            self._watching = True


class GuardedHTTPServer(tornado.httpserver.HTTPServer):
    """tornado's HTTPServer with the cap, the back-off and lingering close of the module docstring.

    Plain HTTP only (TCPServer's TLS path is not taken). Everything runs on the IOLoop.
    """

    def initialize(self, *args: Any, max_connections: int = DEFAULT_MAX, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(*args, **kwargs)
        if self.ssl_options is not None:
            raise ValueError("GuardedHTTPServer serves plain HTTP only")
        self.max_connections = max_connections
        self.open_connections = 0
        self._lingering: set[asyncio.Task[None]] = set()
        self.refused = _Throttled("connection limit (%d) reached: answered 503")
        self.exhausted = _Throttled("accept failed (%s): descriptors exhausted, pausing %.2f s")

    @property
    def lingering(self) -> int:
        return len(self._lingering)

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        # Replaces TCPServer.add_sockets, whose accept handler raises on EMFILE (module docstring).
        for sock in sockets:
            acceptor = _Acceptor(self, sock)
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = acceptor.stop

    def admit(self, connection: socket.socket, address: Any) -> None:
        """Serve a new connection, or answer 503 and close it when the cap is reached."""
        if self.open_connections >= self.max_connections:
            self.refused.note(self.max_connections)
            try:
                connection.setblocking(False)
                connection.send(BUSY_RESPONSE)  # a fresh socket's buffer takes it whole
                stream = IOStream(connection)
            except OSError:
                connection.close()
                return
            self.linger(stream)
            return
        self.open_connections += 1
        try:
            stream = ServerStream(
                connection, self, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size
            )
        except Exception:
            self.open_connections -= 1
            connection.close()
            log.exception("could not set up a connection")
            return
        self.handle_stream(stream, address)

    def linger(self, stream: IOStream) -> None:
        """Close `stream` (ours alone now: detached from HTTP, or never given to it) lingering:
        the answer already handed to it is written, then the sending side is shut down and what
        arrives is dropped, bounded (module docstring). At LINGER_MAX, it is closed at once."""
        if len(self._lingering) >= LINGER_MAX:
            stream.close()
            return
        task = asyncio.ensure_future(_linger(stream))
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)


async def _linger(stream: IOStream) -> None:
    deadline = IOLoop.current().time() + LINGER_S
    try:
        # An empty write resolves once everything written before it is out.
        await gen.with_timeout(deadline, stream.write(b""), quiet_exceptions=StreamClosedError)
        stream.socket.shutdown(socket.SHUT_WR)  # the client reads our answer, then its end
        left = LINGER_BYTES
        while left > 0:
            read = stream.read_bytes(min(left, 64 * 1024), partial=True)
            left -= len(await gen.with_timeout(deadline, read, quiet_exceptions=StreamClosedError))
    except (TimeoutError, StreamClosedError, OSError):
        pass  # the client closed, or it had its time: close now
    finally:
        stream.close()

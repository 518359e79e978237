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

Each connection is read and written by `handlers.connection.Connection` (HTTP/1.x; the rules it
keeps are listed there). Runs on the IOLoop. No TLS: the server listens on plain HTTP (docs/security.md).
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

import tornado.netutil
import tornado.web
from tornado.ioloop import IOLoop

from handlers.connection import Connection
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


class GuardedHTTPServer:
    """The HTTP server: connections read by `handlers.connection.Connection`, each request run by
    the Tornado application; with the cap, the back-off and lingering close of the module docstring.

    Plain HTTP only. Everything runs on the loop.
    """

    def __init__(
        self,
        application: tornado.web.Application,
        *,
        max_connections: int = DEFAULT_MAX,
        max_body_size: int = 100 * 1024 * 1024,
        idle_connection_timeout: float = 3600,
        body_timeout: float | None = None,
    ) -> None:
        self.application = application
        self.max_connections = max_connections
        self.max_body_size = max_body_size
        self.idle_connection_timeout = idle_connection_timeout  # also the time to send a head
        self.body_timeout = body_timeout
        self.linger_bytes = LINGER_BYTES
        self.linger_seconds = LINGER_S
        self.open_connections = 0
        self.lingering = 0
        self.refused = _Throttled("connection limit (%d) reached: answered 503")
        self.exhausted = _Throttled("accept failed (%s): descriptors exhausted, pausing %.2f s")
        self._acceptors: list[_Acceptor] = []
        self._connections: set[Connection] = set()
        self._starting: set[asyncio.Future[Any]] = set()
        self._all_closed: asyncio.Event | None = None

    def listen(self, port: int, address: str = "") -> None:
        self.add_sockets(tornado.netutil.bind_sockets(port, address=address))

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        # Not TCPServer's accept handler, which raises on EMFILE (module docstring).
        for sock in sockets:
            self._acceptors.append(_Acceptor(self, sock))

    def stop(self) -> None:
        """Stop accepting and close the listening sockets; open connections go on."""
        for acceptor in self._acceptors:
            acceptor.stop()
            acceptor.sock.close()
        self._acceptors.clear()

    async def close_all_connections(self) -> None:
        """Close every open connection now, and wait until they are closed."""
        for connection in list(self._connections):
            connection.abort()
        while self._connections or self._starting:
            self._all_closed = asyncio.Event()
            await self._all_closed.wait()

    def admit(self, sock: socket.socket, address: Any) -> None:
        """Serve a new connection, or answer 503 and close it lingering when the cap is reached."""
        refused = self.open_connections >= self.max_connections
        if refused:
            self.refused.note(self.max_connections)
        else:
            self.open_connections += 1
        protocol = Connection(self, address, BUSY_RESPONSE if refused else None)
        starting = asyncio.ensure_future(
            asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, sock)
        )
        self._starting.add(starting)

        def started(future: asyncio.Future[Any]) -> None:
            self._starting.discard(future)
            if future.cancelled() or future.exception() is not None:
                sock.close()
                protocol.never_started()
                if not future.cancelled():
                    log.warning("could not set up a connection: %s", future.exception())
            self._maybe_all_closed()

        starting.add_done_callback(started)

    def track(self, connection: Connection) -> None:
        """`connection` is open (Connection.connection_made; it may close before `admit`'s task ends)."""
        self._connections.add(connection)

    def forget(self, connection: Connection) -> None:
        """`connection` is closed (Connection.connection_lost)."""
        self._connections.discard(connection)
        self._maybe_all_closed()

    def lingering_starts(self) -> bool:
        """Whether one more connection may linger (at most LINGER_MAX); counted if so."""
        if self.lingering >= LINGER_MAX:
            return False
        self.lingering += 1
        return True

    def lingering_ended(self) -> None:
        self.lingering -= 1

    def _maybe_all_closed(self) -> None:
        if self._all_closed is not None and not self._connections and not self._starting:
            self._all_closed.set()

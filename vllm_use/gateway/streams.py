"""Resumable streams (S5.1): server-side sessions that outlive the client's connection.

A `POST /v1/chat/completions` with `X-Conversation-Id` appends the raw SSE bytes it relays to a
`StreamSession`; `GET /v1/stream` replays them from a byte offset and follows the live tail;
`DELETE /v1/stream` stops the generation. Each session keeps the newest `BUFFER_BYTES` bytes (the
oldest are dropped, whole bytes, even mid-chunk) and counts every byte it ever saw, so an offset is
an absolute position in the stream: `dropped_bytes <= from <= total_bytes` can be served.

    create ──► LIVE ──finish()──────────► DONE ──(TTL_S after completed_at: gc)──► gone
                 │                          ▲
                 └──cancel() / replaced / ──┘   cancel() calls the proxy's canceller once,
                    delete() / close()          which aborts the upstream request

Sessions belong to the API key that created them and are keyed by (owner, conversation id): another
key never sees, replaces or stops them (the handlers answer 404 either way). Everything here runs on
the IOLoop (plain asyncio, no threads): `append` and `finish` are plain functions the proxy calls
from its streaming callback; readers block on an `asyncio.Condition` and never poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from vllm_use.errors import InvalidArguments, VllmUseError
from vllm_use.keys import iso
from vllm_use.storage import now_ms

log = logging.getLogger(__name__)

BUFFER_BYTES = 4 * 1024 * 1024
TTL_S = 300
GC_INTERVAL_S = 60
MAX_SESSIONS = 10000
READ_CHUNK_BYTES = 64 * 1024  # a reader yields at most this much at once, so a replay streams out
ID_MAX_BYTES = 128
MODEL_MAX_BYTES = 256
HEADER = "X-Conversation-Id"


class StreamArgumentError(InvalidArguments, ValueError):
    """A bad conversation id or offset (400); also a ValueError for callers outside the API."""


class OffsetGone(StreamArgumentError):
    """The requested offset fell off the front of the buffer (S5.1: 400)."""

    code = "offset_gone"


class TooManySessions(VllmUseError):
    """`MAX_SESSIONS` sessions are live and none is finished to make room for another."""

    code = "too_many_sessions"
    http_status = 503


def _visible_ascii(value: str) -> bool:
    return all("\x21" <= ch <= "\x7e" for ch in value)


def parse_conversation_id(header: str) -> tuple[str, str | None]:
    """Split an `X-Conversation-Id` value, `<id>` or `<id>::<model>`, into (id, model or None).

    The id is 1–128 bytes of visible ASCII without `:`; the model, when present, 1–256 bytes of
    visible ASCII (it may hold `:` itself, e.g. `qwen:7b`). Raises `StreamArgumentError` (a
    ValueError) naming the problem.
    """
    sep = header.find(":")
    if sep < 0:
        conv_id, model = header, None
    elif header[sep : sep + 2] == "::":
        conv_id, model = header[:sep], header[sep + 2 :]
    else:
        raise StreamArgumentError(f"{HEADER} must be <id> or <id>::<model>; the id may not contain ':'")
    if not 1 <= len(conv_id) <= ID_MAX_BYTES or not _visible_ascii(conv_id):
        raise StreamArgumentError(f"{HEADER}: the id must be 1-{ID_MAX_BYTES} bytes of visible ASCII")
    if model is not None and (not 1 <= len(model) <= MODEL_MAX_BYTES or not _visible_ascii(model)):
        raise StreamArgumentError(f"{HEADER}: the model must be 1-{MODEL_MAX_BYTES} bytes of visible ASCII")
    return conv_id, model


class StreamSession:
    """One conversation's stream: a bounded byte buffer, its readers, and a way to stop it.

    Runs on the IOLoop. `append`/`finish`/`cancel` never block; they wake readers through a small
    notify task because an `asyncio.Condition` may only be notified with its lock held, which a
    plain function cannot await.
    """

    def __init__(self, conversation_id: str, owner: str, model: str | None) -> None:
        self.conversation_id = conversation_id
        self.owner = owner
        self.model = model
        self.started_at: int = now_ms()
        self.completed_at: int | None = None
        self.total_bytes = 0
        self.dropped_bytes = 0
        self._buf = bytearray()  # bytes [dropped_bytes, total_bytes) of the stream
        self._done = False
        self._cancelled = False
        self._canceller: Callable[[], None] | None = None
        self._cond = asyncio.Condition()
        self._wake_task: asyncio.Task[None] | None = None

    @property
    def is_done(self) -> bool:
        return self._done

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    def append(self, data: bytes) -> None:
        """Add relayed bytes and wake readers. Bytes arriving after the end (a cancelled upstream
        still flushing) are ignored."""
        if self._done or not data:
            return
        self.total_bytes += len(data)
        if len(data) >= BUFFER_BYTES:
            # Never hold more than the buffer, even for one oversized chunk.
            self._buf = bytearray(data[len(data) - BUFFER_BYTES :])
        else:
            self._buf += data
        excess = len(self._buf) - BUFFER_BYTES
        if excess > 0:
            del self._buf[:excess]  # cheap in CPython: a bytearray advances its start
        self.dropped_bytes = self.total_bytes - len(self._buf)
        self._wake()

    def finish(self) -> None:
        """Mark the generation ended (idempotent); readers drain what is left and stop."""
        if self._done:
            return
        self._done = True
        self.completed_at = now_ms()
        self._canceller = None  # drop the reference to the finished upstream request
        self._wake()

    def set_canceller(self, fn: Callable[[], None]) -> None:
        """Register how to abort the upstream request. On a session already cancelled, `fn` runs now,
        so a proxy that registers late still stops its request."""
        if self._cancelled:
            self._call(fn)
        elif not self._done:
            self._canceller = fn

    def cancel(self) -> None:
        """Stop the generation: call the canceller (at most once ever) and finish. A session that
        already finished on its own has nothing to stop."""
        if self._done:
            return
        self._cancelled = True
        canceller = self._canceller
        self.finish()
        if canceller is not None:
            self._call(canceller)

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            # The session must end whatever the canceller does; the traceback is for us.
            log.exception("canceller of stream session %s failed", self.conversation_id)

    def check_offset(self, offset: int) -> None:
        """Raise unless `offset` can be served now: `OffsetGone` below the dropped prefix,
        `StreamArgumentError` (a ValueError) when negative or past `total_bytes`."""
        if offset < 0 or offset > self.total_bytes:
            raise StreamArgumentError(f"from must be between 0 and {self.total_bytes}, got {offset}")
        if offset < self.dropped_bytes:
            raise OffsetGone(
                f"from={offset} is no longer buffered; the oldest byte kept is at {self.dropped_bytes}"
            )

    def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """Replay from `offset`, then follow live bytes until the session is done.

        The offset is checked at once (so a handler can answer 400 before any byte is sent), and
        again on every step: a reader that falls more than the buffer behind gets `OffsetGone`.
        Stopping the iteration (a client going away) never stops the generation.
        """
        self.check_offset(offset)
        return self._follow(offset)

    async def _follow(self, pos: int) -> AsyncIterator[bytes]:
        while True:
            if pos < self.dropped_bytes:
                raise OffsetGone(
                    f"reader at {pos} fell behind; the oldest byte kept is at {self.dropped_bytes}"
                )
            if pos < self.total_bytes:
                start = pos - self.dropped_bytes
                chunk = bytes(self._buf[start : start + READ_CHUNK_BYTES])
                pos += len(chunk)
                yield chunk
                continue
            if self._done:
                return
            async with self._cond:
                while pos == self.total_bytes and not self._done:
                    await self._cond.wait()

    def _wake(self) -> None:
        if self._wake_task is not None and not self._wake_task.done():
            return  # the pending notify runs after this change and covers it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop is running, so no reader can be waiting
        self._wake_task = loop.create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def describe(self) -> dict[str, Any]:
        """The state `POST /v1/streams/lookup` reports (S5.1)."""
        return {
            "conversation_id": self.conversation_id,
            "is_done": self._done,
            "total_bytes": self.total_bytes,
            "dropped_bytes": self.dropped_bytes,
            "started_at": iso(self.started_at),
            "completed_at": iso(self.completed_at),
        }


class StreamRegistry:
    """Every stream session of the process, keyed by (owner, conversation id). Runs on the IOLoop.

    Holds at most `MAX_SESSIONS` sessions, live and finished together; finished ones are kept
    `TTL_S` so a client can still replay them, then dropped by `gc` (every `GC_INTERVAL_S` once
    `start_gc` runs). There is no way to list sessions: callers ask for ids they already know.
    """

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], StreamSession] = {}
        self._gc_task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, conversation_id: str, owner: str, model: str | None = None) -> StreamSession:
        """Start the one live session of `conversation_id` for `owner`, replacing (and cancelling)
        an earlier one. Raises `TooManySessions` when full of live sessions."""
        key = (owner, conversation_id)
        old = self._sessions.pop(key, None)
        if old is not None:
            old.cancel()
        if len(self._sessions) >= MAX_SESSIONS:
            self._evict_oldest_finished()
        session = StreamSession(conversation_id, owner, model)
        self._sessions[key] = session
        return session

    def _evict_oldest_finished(self) -> None:
        finished = [(s.completed_at or 0, key) for key, s in self._sessions.items() if s.is_done]
        if not finished:
            log.warning("stream sessions: %d live, refusing another", len(self._sessions))
            raise TooManySessions(f"too many live stream sessions ({MAX_SESSIONS}); try again later")
        del self._sessions[min(finished)[1]]

    def get(self, conversation_id: str, owner: str) -> StreamSession | None:
        """The session, or None when unknown or owned by another key (both answer 404)."""
        return self._sessions.get((owner, conversation_id))

    def lookup(self, ids: list[str], owner: str) -> list[dict[str, Any]]:
        """`describe()` of the asked ids that `owner` has, in the order asked, each once."""
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        for conv_id in ids:
            session = self._sessions.get((owner, conv_id))
            if session is not None and conv_id not in seen:
                seen.add(conv_id)
                found.append(session.describe())
        return found

    def delete(self, conversation_id: str, owner: str) -> None:
        """Stop the generation (idempotent: unknown, foreign or finished ids are fine). The session
        stays, done, for replay until gc."""
        session = self._sessions.get((owner, conversation_id))
        if session is not None:
            session.cancel()

    def gc(self, now: int | None = None) -> int:
        """Drop sessions finished more than `TTL_S` before `now` (unix ms); returns how many."""
        cutoff = (now_ms() if now is None else now) - TTL_S * 1000
        stale = [
            key for key, s in self._sessions.items() if s.completed_at is not None and s.completed_at < cutoff
        ]
        for key in stale:
            del self._sessions[key]
        if stale:
            log.debug("stream sessions: dropped %d finished", len(stale))
        return len(stale)

    def start_gc(self) -> None:
        """Run `gc` every `GC_INTERVAL_S` on the running loop (idempotent)."""
        if self._gc_task is None or self._gc_task.done():
            self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop())

    def stop_gc(self) -> None:
        if self._gc_task is not None:
            self._gc_task.cancel()
            self._gc_task = None

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(GC_INTERVAL_S)
            try:
                self.gc()
            except Exception:
                log.exception("stream session gc failed")

    def close(self) -> None:
        """Shutdown: stop gc and cancel every live session, so no reader is left waiting."""
        self.stop_gc()
        for session in list(self._sessions.values()):
            session.cancel()
        self._sessions.clear()

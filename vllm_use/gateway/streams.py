"""Resumable streams (docs/gateway.md): server-side sessions that outlive the client's connection.

A `POST /v1/chat/completions` with `X-Conversation-Id` appends the raw SSE bytes it relays to a
`StreamSession`; `GET /v1/stream` replays them from a byte offset and follows the live tail;
`DELETE /v1/stream` stops the generation. Each session keeps the newest `BUFFER_BYTES` bytes (the
oldest are dropped, whole bytes, even mid-chunk) and counts every byte it ever saw, so an offset is
an absolute position in the stream: `dropped_bytes <= from <= total_bytes` can be served.

    create ──► LIVE ──finish()───────────────────► DONE ──(TTL_S after completed_at: gc)──► gone
      │          │                                  ▲  └─(dropped early: its key keeps more than
      │          └──cancel(): replaced, delete(), ──┘     MAX_KEPT_PER_KEY, the byte budget is
      │             close(), key revoked,                 spent (oldest DONE first), or its key
      │             admin cancel                          was deleted)──────────────────► gone
      │             (calls the proxy's canceller once: the upstream request is aborted)
      └──refused: the key has MAX_LIVE_PER_KEY live (TooManyStreams, 429, before anything
         changes); MAX_SESSIONS, or the whole BYTE_BUDGET, held with no DONE left to drop
         (TooManySessions, 503)

Limits, and why (docs/gateway.md): an attached generation keeps running and holds an upstream
socket after its client leaves, and a finished session holds up to 4 MiB for `TTL_S`; one key
must not be able to take the process's memory or vLLM's slots. So a key has at most
`MAX_LIVE_PER_KEY` live and `MAX_KEPT_PER_KEY` finished sessions, and all buffers together are
held to `BYTE_BUDGET` by dropping finished sessions (oldest first); live ones are never dropped
for memory (that would stop someone's generation): a new one is refused instead. A finished
session's buffer is copied to an exact-size `bytes`, because a bytearray keeps the allocation
it grew to.

Sessions belong to the API key that created them and are keyed by (owner, conversation id): another
key never sees, replaces or stops them (the handlers answer 404 either way); only an admin
(`streams.list`, `streams.cancel`) sees every key's. Everything here runs on the IOLoop (plain
asyncio, no threads): `append` and `finish` are plain functions the proxy calls from its streaming
callback; readers block on an `asyncio.Condition` and never poll.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from vllm_use.clock import iso, now_ms
from vllm_use.errors import OffsetGone, StreamArgumentError, TooManySessions, TooManyStreams, VllmUseError

log = logging.getLogger(__name__)

BUFFER_BYTES = 4 * 1024 * 1024
TTL_S = 300
GC_INTERVAL_S = 60
MAX_SESSIONS = 10000
MAX_LIVE_PER_KEY = 8  # attached generations of one key at once (each holds an upstream socket)
MAX_KEPT_PER_KEY = 32  # finished sessions of one key kept for replay (each up to BUFFER_BYTES)
BYTE_BUDGET = 256 * 1024 * 1024  # all session buffers together
RETRY_AFTER_S = 5
READ_CHUNK_BYTES = 64 * 1024  # a reader yields at most this much at once, so a replay streams out
HOLD_MAX_BYTES = 1024 * 1024  # a replay holds at most this much of an unfinished event (whole_events)
ID_MAX_BYTES = 128
MODEL_MAX_BYTES = 256
HEADER = "X-Conversation-Id"


class State(enum.StrEnum):
    """A session's state as `streams.list` shows it; DONE and CANCELLED are both finished."""

    LIVE = "live"
    DONE = "done"
    CANCELLED = "cancelled"


class _Listener(Protocol):
    """What a session tells its registry (the registry keeps the byte total and the caps)."""

    def grew(self, session: StreamSession, delta: int) -> None: ...

    def finished(self, session: StreamSession) -> None: ...


def error_event(exc: VllmUseError) -> bytes:
    """The SSE event a replay ends with when it cannot go on (`event: error`), in the shape of
    the gateway's errors: `data: {"error": {"code", "message"}}`."""
    payload = json.dumps({"error": {"code": exc.code, "message": exc.message}}, separators=(",", ":"))
    return f"event: error\ndata: {payload}\n\n".encode()


def whole_events(data: bytes) -> int:
    """How many leading bytes of `data` are whole SSE events, i.e. end with a blank line (`\n\n`
    or `\r\n\r\n`); 0 when no event ends in it. A replay writes up to there and holds the
    rest, so that an error event it must send never lands in the middle of another one."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


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
        # The upstream was cut under it (its instance stopped or died): it ended with an error event.
        self.interrupted = False
        # bytes [dropped_bytes, total_bytes) of the stream; an exact-size `bytes` once finished
        self._buf: bytearray | bytes = bytearray()
        self._done = False
        self._cancelled = False
        self._canceller: Callable[[], None] | None = None
        self._cond = asyncio.Condition()
        self._wake_task: asyncio.Task[None] | None = None
        self.listener: _Listener | None = None  # set by the registry that holds this session

    @property
    def is_done(self) -> bool:
        return self._done

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    @property
    def held_bytes(self) -> int:
        """Bytes buffered now (≤ `BUFFER_BYTES`): what counts against the byte budget."""
        return len(self._buf)

    @property
    def state(self) -> State:
        return State.CANCELLED if self._cancelled else State.DONE if self._done else State.LIVE

    def append(self, data: bytes) -> None:
        """Add relayed bytes and wake readers. Bytes arriving after the end (a cancelled upstream
        still flushing) are ignored."""
        if self._done or not data:
            return
        before = len(self._buf)
        self.total_bytes += len(data)
        assert isinstance(self._buf, bytearray)  # not done, so not compacted
        if len(data) >= BUFFER_BYTES:
            # Never hold more than the buffer, even for one oversized chunk.
            self._buf = bytearray(data[len(data) - BUFFER_BYTES :])
        else:
            self._buf += data
        excess = len(self._buf) - BUFFER_BYTES
        if excess > 0:
            del self._buf[:excess]  # cheap in CPython: a bytearray advances its start
        self.dropped_bytes = self.total_bytes - len(self._buf)
        if self.listener is not None and len(self._buf) != before:
            self.listener.grew(self, len(self._buf) - before)
        self._wake()

    def finish(self) -> None:
        """Mark the generation ended (idempotent); readers drain what is left and stop."""
        if self._done:
            return
        self._done = True
        self.completed_at = now_ms()
        self._canceller = None  # drop the reference to the finished upstream request
        # A bytearray keeps the allocation it grew to (and the front it advanced past): an
        # exact-size copy gives the slack back while the session waits for replays.
        self._buf = bytes(self._buf)
        self._wake()
        if self.listener is not None:
            self.listener.finished(self)

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
        """The state `POST /v1/streams/lookup` reports to the owner (docs/gateway.md, "Resumable streams")."""
        return {
            "conversation_id": self.conversation_id,
            "is_done": self._done,
            "interrupted": self.interrupted,
            "total_bytes": self.total_bytes,
            "dropped_bytes": self.dropped_bytes,
            "started_at": iso(self.started_at),
            "completed_at": iso(self.completed_at),
        }

    def describe_for_admin(self) -> dict[str, Any]:
        """What `streams.list` shows an admin: the owner, model, state and memory too."""
        return {
            "key_id": self.owner,
            "conversation_id": self.conversation_id,
            "model": self.model,
            "state": self.state.value,
            "interrupted": self.interrupted,
            "total_bytes": self.total_bytes,
            "held_bytes": self.held_bytes,
            "dropped_bytes": self.dropped_bytes,
            "started_at": iso(self.started_at),
            "completed_at": iso(self.completed_at),
        }


Key = tuple[str, str]  # (owner key id, conversation id)


class StreamRegistry:
    """Every stream session of the process, keyed by (owner, conversation id). Runs on the IOLoop.

    Holds at most `MAX_SESSIONS` sessions, live and finished together; per key at most
    `MAX_LIVE_PER_KEY` live and `MAX_KEPT_PER_KEY` finished; all buffers together at most
    `BYTE_BUDGET` bytes plus what live sessions add after it was reached (each ≤ `BUFFER_BYTES`).
    Finished ones are kept `TTL_S` so a client can still replay them, then dropped by `gc` (every
    `GC_INTERVAL_S` once `start_gc` runs), or earlier by those caps, oldest finished first. A key
    reads only its own sessions, by ids it already knows; `sessions()` (admin) lists them all.
    """

    def __init__(self) -> None:
        self._sessions: dict[Key, StreamSession] = {}
        self._finished: OrderedDict[Key, None] = OrderedDict()  # oldest completion first
        self._kept: dict[str, OrderedDict[str, None]] = {}  # owner → its finished, oldest first
        self._live: dict[str, int] = {}  # owner → live sessions
        self._held = 0  # sum of held_bytes
        self._gc_task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def held_bytes(self) -> int:
        return self._held

    def live_count(self, owner: str | None = None) -> int:
        """Live sessions of `owner`, or of every key (GET /metrics)."""
        return self._live.get(owner, 0) if owner is not None else sum(self._live.values())

    def create(self, conversation_id: str, owner: str, model: str | None = None) -> StreamSession:
        """Start the one live session of `conversation_id` for `owner`, replacing (and cancelling)
        an earlier one. Refused before anything changes: `TooManyStreams` when the key already has
        `MAX_LIVE_PER_KEY` live (replacing one of them is fine), `TooManySessions` when the process
        is full of live sessions or live buffers hold the whole byte budget."""
        key = (owner, conversation_id)
        old = self._sessions.get(key)
        replacing_live = old is not None and not old.is_done
        if self.live_count(owner) - int(replacing_live) >= MAX_LIVE_PER_KEY:
            log.warning(
                "stream sessions: key %s has %d live, refusing another", owner, self.live_count(owner)
            )
            raise TooManyStreams(
                f"this key already has {MAX_LIVE_PER_KEY} live stream sessions; stop one "
                "(DELETE /v1/stream) or wait for one to finish",
                retry_after_s=RETRY_AFTER_S,
            )
        if old is None:
            self._make_room()
        else:
            old.cancel()
            self._drop(key)
        session = StreamSession(conversation_id, owner, model)
        session.listener = self
        self._sessions[key] = session
        self._live[owner] = self._live.get(owner, 0) + 1
        return session

    def _make_room(self) -> None:
        """Drop finished sessions, oldest first, until one more fits; raise if only live ones are
        left in the way."""
        while self._finished and (len(self._sessions) >= MAX_SESSIONS or self._held >= BYTE_BUDGET):
            self._drop(next(iter(self._finished)))
        if len(self._sessions) >= MAX_SESSIONS or self._held >= BYTE_BUDGET:
            log.warning(
                "stream sessions: %d live holding %d bytes, refusing another", len(self._sessions), self._held
            )
            raise TooManySessions(
                "too many live stream sessions; try again later", retry_after_s=RETRY_AFTER_S
            )

    def grew(self, session: StreamSession, delta: int) -> None:
        """A live session buffered `delta` more bytes: over the budget, finished sessions go."""
        self._held += delta
        while self._held > BYTE_BUDGET and self._finished:
            self._drop(next(iter(self._finished)))

    def finished(self, session: StreamSession) -> None:
        """A session ended: count it as kept, then enforce its key's cap and the budget."""
        key = (session.owner, session.conversation_id)
        if self._sessions.get(key) is not session:
            return  # already dropped from the registry (replaced, closed)
        self._live[session.owner] -= 1
        if not self._live[session.owner]:
            del self._live[session.owner]
        self._finished[key] = None
        kept = self._kept.setdefault(session.owner, OrderedDict())
        kept[session.conversation_id] = None
        while len(kept) > MAX_KEPT_PER_KEY:
            self._drop((session.owner, next(iter(kept))))
        self.grew(session, 0)

    def _drop(self, key: Key) -> None:
        """Forget a session (finished, or about to be: callers cancel live ones first)."""
        session = self._sessions.pop(key, None)
        if session is None:
            return
        session.listener = None
        self._held -= session.held_bytes
        if key in self._finished:
            del self._finished[key]
            kept = self._kept[key[0]]
            del kept[key[1]]
            if not kept:
                del self._kept[key[0]]
        else:  # never finished (close/revocation of a session whose cancel did not finish it)
            self._live[key[0]] -= 1
            if not self._live[key[0]]:
                del self._live[key[0]]

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

    def sessions(self, owner: str | None = None) -> list[StreamSession]:
        """Every session (of `owner` only, if given), oldest start first (ties: creation order).
        For admins only."""
        found = [s for s in self._sessions.values() if owner is None or s.owner == owner]
        return sorted(found, key=lambda s: s.started_at)  # stable: dicts keep insertion order

    def delete(self, conversation_id: str, owner: str) -> None:
        """Stop the generation (idempotent: unknown, foreign or finished ids are fine). The session
        stays, done, for replay until gc."""
        session = self._sessions.get((owner, conversation_id))
        if session is not None:
            session.cancel()

    def revoke(self, owner: str, *, drop: bool) -> int:
        """A key was disabled (`drop=False`: its finished sessions stay until gc, should it be
        enabled again) or deleted (`drop=True`: they go too). Its live generations are cancelled
        either way; returns how many."""
        mine = [key for key in self._sessions if key[0] == owner]
        cancelled = 0
        for key in mine:
            session = self._sessions.get(key)
            if session is None:
                continue  # dropped by the kept cap when an earlier one of this key finished
            if not session.is_done:
                session.cancel()
                cancelled += 1
            if drop:
                self._drop(key)
        return cancelled

    def gc(self, now: int | None = None) -> int:
        """Drop sessions finished more than `TTL_S` before `now` (unix ms); returns how many."""
        cutoff = (now_ms() if now is None else now) - TTL_S * 1000
        stale = [
            key for key, s in self._sessions.items() if s.completed_at is not None and s.completed_at < cutoff
        ]
        for key in stale:
            self._drop(key)
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
        for key in list(self._sessions):
            self._drop(key)

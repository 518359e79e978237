"""Stream sessions and their registry (docs/gateway.md): a 4 MiB buffer of the raw SSE bytes addressed by
absolute offsets, readers that replay then follow without spinning, ownership by API key, one live
session per conversation id, TTL gc, a bounded number of sessions, per-key caps on live and kept
sessions, a byte budget over all buffers, and revocation of a key's sessions."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from vllm_use.gateway import streams
from vllm_use.gateway.streams import (
    BUFFER_BYTES,
    GC_INTERVAL_S,
    MAX_KEPT_PER_KEY,
    MAX_LIVE_PER_KEY,
    READ_CHUNK_BYTES,
    TTL_S,
    OffsetGone,
    StreamArgumentError,
    StreamRegistry,
    StreamSession,
    TooManySessions,
    TooManyStreams,
    error_event,
    parse_conversation_id,
    whole_events,
)

MiB = 1024 * 1024


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro, 10)

    return asyncio.run(main())


async def collect(session: StreamSession, offset: int) -> bytes:
    return b"".join([chunk async for chunk in session.read_from(offset)])


async def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


class Canceller:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_constants_match_the_spec() -> None:
    assert (BUFFER_BYTES, TTL_S, GC_INTERVAL_S, streams.MAX_SESSIONS) == (4 * MiB, 300, 60, 10000)
    assert (MAX_LIVE_PER_KEY, MAX_KEPT_PER_KEY, streams.BYTE_BUDGET) == (8, 32, 256 * MiB)


# --- parse_conversation_id ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("abc", ("abc", None)),
        ("a::m", ("a", "m")),
        ("x" * 128, ("x" * 128, None)),
        ("conv-1::org/Model-7B", ("conv-1", "org/Model-7B")),
        ("c::qwen:7b", ("c", "qwen:7b")),
        ("c::" + "m" * 256, ("c", "m" * 256)),
        ("!~", ("!~", None)),
    ],
)
def test_conversation_id_accepts(header: str, expected: tuple[str, str | None]) -> None:
    assert parse_conversation_id(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "",
        "x" * 129,
        "a:b",
        "a:",
        ":a",
        "::m",
        "a::",
        "a::" + "m" * 257,
        "a b",
        "a\x00b",
        "a\tb",
        "a\x7f",
        "a::m\nX-Injected: 1",
        "caf\u00e9",
        "a::mod\u00e8le",
    ],
)
def test_conversation_id_refuses(header: str) -> None:
    with pytest.raises(ValueError, match="X-Conversation-Id"):
        parse_conversation_id(header)
    with pytest.raises(StreamArgumentError):  # the same error, mapped to 400 by the handlers
        parse_conversation_id(header)


# --- StreamSession --------------------------------------------------------------------------------------


def test_replay_from_zero_returns_everything_appended() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        parts = [b'data: {"a": 1}\n\n', b"data: ", b'{"b": 2}\n\n', b"data: [DONE]\n\n"]
        for part in parts:
            session.append(part)
        session.finish()
        assert await collect(session, 0) == b"".join(parts)
        assert await collect(session, 6) == b"".join(parts)[6:]
        assert await collect(session, session.total_bytes) == b""

    run(main())


def test_live_reader_gets_bytes_in_order_and_ends_at_finish() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", "m")
        session.append(b"early;")
        received: list[bytes] = []

        async def reader() -> None:
            async for chunk in session.read_from(0):
                received.append(chunk)

        task = asyncio.create_task(reader())
        await eventually(lambda: b"".join(received) == b"early;")
        for i in range(20):
            session.append(b"tok%d;" % i)
            if i % 3 == 0:
                await asyncio.sleep(0)
        await eventually(lambda: b"".join(received).endswith(b"tok19;"))
        assert not task.done()  # still following: the generation has not ended
        session.finish()
        await asyncio.wait_for(task, 1)
        assert b"".join(received) == b"early;" + b"".join(b"tok%d;" % i for i in range(20))

    run(main())


def test_several_readers_follow_the_same_stream() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        readers = [asyncio.create_task(collect(session, 0)) for _ in range(3)]
        await asyncio.sleep(0.01)
        for i in range(50):
            session.append(b"%d," % i)
            await asyncio.sleep(0)
        session.finish()
        expected = b"".join(b"%d," % i for i in range(50))
        assert await asyncio.gather(*readers) == [expected] * 3

    run(main())


def test_buffer_keeps_exactly_4_mib() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        data = bytes(range(256)) * (BUFFER_BYTES // 256) + b"0123456789"
        for start in range(0, len(data), 100_000):  # chunks that straddle the drop point
            session.append(data[start : start + 100_000])
        session.finish()
        total = session.total_bytes
        assert total == BUFFER_BYTES + 10
        assert session.dropped_bytes == 10  # whole bytes from the front, even mid-chunk
        edge = total - BUFFER_BYTES
        assert await collect(session, edge) == data[edge:]
        with pytest.raises(OffsetGone):
            session.read_from(edge - 1)
        with pytest.raises(OffsetGone):
            session.read_from(0)
        assert session.describe()["dropped_bytes"] == 10

    run(main())


def test_oversized_chunk_keeps_only_its_tail() -> None:
    session = StreamSession("c", "key", None)
    session.append(b"head")
    session.append(b"x" * BUFFER_BYTES + b"tail")
    assert session.total_bytes == BUFFER_BYTES + 8
    assert session.dropped_bytes == 8
    session.finish()
    replay = run(collect(session, 8))
    assert len(replay) == BUFFER_BYTES and replay.endswith(b"xtail")


def test_replay_streams_out_in_bounded_chunks() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        session.append(b"z" * (3 * READ_CHUNK_BYTES + 5))
        session.finish()
        sizes = [len(chunk) async for chunk in session.read_from(0)]
        assert sizes == [READ_CHUNK_BYTES] * 3 + [5]

    run(main())


@pytest.mark.parametrize("offset", [-1, 11, 10**12])
def test_offset_outside_the_stream_is_refused(offset: int) -> None:
    session = StreamSession("c", "key", None)
    session.append(b"0123456789")
    with pytest.raises(ValueError, match="from"):
        session.read_from(offset)


def test_reader_that_falls_behind_the_buffer_gets_offset_gone() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        session.append(b"a" * 100)
        reader = session.read_from(0)
        assert await reader.__anext__() == b"a" * 100
        session.append(b"b" * (BUFFER_BYTES + 1))  # the reader has not come back yet
        with pytest.raises(OffsetGone):
            await reader.__anext__()

    run(main())


def test_reader_blocks_without_spinning() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        session.append(b"x")
        waits = 0
        real_wait = session._cond.wait

        async def counting_wait() -> bool:
            nonlocal waits
            waits += 1
            return await real_wait()

        session._cond.wait = counting_wait  # type: ignore[method-assign]
        received: list[bytes] = []

        async def reader() -> None:
            async for chunk in session.read_from(0):
                received.append(chunk)

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.2)
        assert received == [b"x"]
        assert waits == 1  # one wait for the whole idle period: no polling loop
        session.append(b"y")
        await eventually(lambda: received == [b"x", b"y"])
        assert waits == 2
        session.finish()
        await asyncio.wait_for(task, 1)
        assert waits == 2

    run(main())


def test_cancel_calls_the_canceller_once_and_ends_readers() -> None:
    async def main() -> None:
        session = StreamSession("c", "key", None)
        canceller = Canceller()
        session.set_canceller(canceller)
        session.append(b"partial")
        reader = asyncio.create_task(collect(session, 0))
        await asyncio.sleep(0.01)
        session.cancel()
        session.cancel()
        assert canceller.calls == 1
        assert session.is_done and session.is_cancelled and session.completed_at is not None
        assert await asyncio.wait_for(reader, 1) == b"partial"
        session.append(b"late bytes from the aborted upstream")
        assert session.total_bytes == len(b"partial")

    run(main())


def test_canceller_registered_after_cancel_runs_at_once() -> None:
    session = StreamSession("c", "key", None)
    session.cancel()
    canceller = Canceller()
    session.set_canceller(canceller)
    assert canceller.calls == 1


def test_finished_session_does_not_call_its_canceller() -> None:
    session = StreamSession("c", "key", None)
    canceller = Canceller()
    session.set_canceller(canceller)
    session.finish()
    session.cancel()
    assert canceller.calls == 0 and not session.is_cancelled


def test_failing_canceller_still_ends_the_session(caplog: pytest.LogCaptureFixture) -> None:
    session = StreamSession("c", "key", None)

    def boom() -> None:
        raise RuntimeError("upstream already gone")

    session.set_canceller(boom)
    session.cancel()
    assert session.is_done
    assert "canceller" in caplog.text


def test_describe_reports_state_with_iso_times() -> None:
    session = StreamSession("conv", "key", "m")
    session.started_at = 1_700_000_000_123
    session.append(b"abc")
    described = session.describe()
    assert described == {
        "conversation_id": "conv",
        "is_done": False,
        "interrupted": False,
        "total_bytes": 3,
        "dropped_bytes": 0,
        "started_at": "2023-11-14T22:13:20.123Z",
        "completed_at": None,
    }
    session.finish()
    assert session.describe()["is_done"] is True
    assert session.describe()["completed_at"].endswith("Z")


# --- StreamRegistry -------------------------------------------------------------------------------------


def test_other_owner_gets_none_and_lookup_hides_it() -> None:
    registry = StreamRegistry()
    mine = registry.create("c1", "alice", None)
    registry.create("c2", "alice", None)
    assert registry.get("c1", "alice") is mine
    assert registry.get("c1", "bob") is None
    assert registry.get("unknown", "alice") is None
    assert registry.lookup(["c1", "c2"], "bob") == []
    assert [s["conversation_id"] for s in registry.lookup(["c2", "nope", "c1", "c2"], "alice")] == [
        "c2",
        "c1",
    ]


def test_other_owner_cannot_stop_or_replace_a_session() -> None:
    registry = StreamRegistry()
    canceller = Canceller()
    registry.create("c", "alice", None).set_canceller(canceller)
    registry.delete("c", "bob")
    theirs = registry.create("c", "bob", None)
    assert canceller.calls == 0
    assert not registry.get("c", "alice").is_done  # type: ignore[union-attr]
    assert registry.get("c", "bob") is theirs


def test_create_replaces_and_cancels_the_old_session() -> None:
    async def main() -> None:
        registry = StreamRegistry()
        old = registry.create("c", "alice", "m")
        canceller = Canceller()
        old.set_canceller(canceller)
        old.append(b"old bytes")
        reader = asyncio.create_task(collect(old, 0))
        await asyncio.sleep(0.01)
        new = registry.create("c", "alice", "m")
        assert new is not old and registry.get("c", "alice") is new
        assert canceller.calls == 1 and old.is_done
        assert await asyncio.wait_for(reader, 1) == b"old bytes"
        assert len(registry) == 1

    run(main())


def test_delete_is_idempotent_and_calls_the_canceller_once() -> None:
    registry = StreamRegistry()
    session = registry.create("c", "alice", None)
    canceller = Canceller()
    session.set_canceller(canceller)
    registry.delete("c", "alice")
    registry.delete("c", "alice")
    registry.delete("unknown", "alice")
    registry.delete("c", "bob")
    assert canceller.calls == 1
    assert session.is_done
    assert registry.lookup(["c"], "alice")[0]["is_done"] is True  # kept for replay until gc


def test_gc_drops_finished_sessions_after_ttl_and_keeps_live_ones() -> None:
    registry = StreamRegistry()
    live = registry.create("live", "alice", None)
    done = registry.create("done", "alice", None)
    done.finish()
    assert done.completed_at is not None
    assert registry.gc(now=done.completed_at + TTL_S * 1000) == 0
    assert registry.get("done", "alice") is done
    assert registry.gc(now=done.completed_at + TTL_S * 1000 + 1) == 1
    assert registry.get("done", "alice") is None
    assert registry.get("live", "alice") is live
    assert registry.gc(now=live.started_at + 10 * TTL_S * 1000) == 0


def test_gc_runs_periodically_once_started(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(streams, "GC_INTERVAL_S", 0.01)
        monkeypatch.setattr(streams, "TTL_S", 0)
        registry = StreamRegistry()
        registry.create("c", "alice", None).finish()
        registry.start_gc()
        registry.start_gc()
        await eventually(lambda: len(registry) == 0)
        registry.stop_gc()
        registry.stop_gc()

    run(main())


def test_close_cancels_every_live_session_and_ends_readers() -> None:
    async def main() -> None:
        registry = StreamRegistry()
        cancellers = [Canceller(), Canceller()]
        sessions = [registry.create(f"c{i}", "alice", None) for i in range(2)]
        for session, canceller in zip(sessions, cancellers, strict=True):
            session.set_canceller(canceller)
        readers = [asyncio.create_task(collect(s, 0)) for s in sessions]
        registry.start_gc()
        await asyncio.sleep(0.01)
        registry.close()
        assert await asyncio.wait_for(asyncio.gather(*readers), 1) == [b"", b""]
        assert [c.calls for c in cancellers] == [1, 1]
        assert len(registry) == 0

    run(main())


def test_full_registry_evicts_the_oldest_finished_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "MAX_SESSIONS", 3)
    registry = StreamRegistry()
    a, b, _c = (registry.create(name, "alice", None) for name in "abc")
    b.finish()
    a.finish()
    b.completed_at, a.completed_at = 1000, 2000  # b finished first
    registry.create("d", "bob", None)
    assert len(registry) == 3
    assert registry.get("b", "alice") is None
    assert registry.get("a", "alice") is a
    registry.create("e", "bob", None)
    assert registry.get("a", "alice") is None
    with pytest.raises(TooManySessions):
        registry.create("f", "bob", None)
    assert len(registry) == 3
    registry.create("c", "alice", None)  # replacing never needs room
    assert len(registry) == 3


# --- per-key caps, the byte budget, revocation ------------------------------------------------------


def held_total(registry: StreamRegistry) -> int:
    return sum(s.held_bytes for s in registry.sessions())


def test_a_key_over_its_live_cap_is_refused_and_nothing_changes() -> None:
    registry = StreamRegistry()
    cancellers = [Canceller() for _ in range(MAX_LIVE_PER_KEY)]
    for i, canceller in enumerate(cancellers):
        registry.create(f"c{i}", "alice", None).set_canceller(canceller)
    with pytest.raises(TooManyStreams) as refused:
        registry.create("one-more", "alice", None)
    assert refused.value.http_status == 429 and refused.value.code == "too_many_streams"
    assert refused.value.details["retry_after_s"] > 0
    assert registry.get("one-more", "alice") is None
    assert [c.calls for c in cancellers] == [0] * MAX_LIVE_PER_KEY
    assert len(registry) == MAX_LIVE_PER_KEY
    registry.create("c0", "alice", None)  # replacing a live one does not add one
    assert cancellers[0].calls == 1
    registry.create("b", "bob", None)  # another key has its own cap
    registry.get("c1", "alice").finish()  # type: ignore[union-attr]
    registry.create("now-fits", "alice", None)
    assert registry.live_count("alice") == MAX_LIVE_PER_KEY


def test_a_key_keeps_at_most_its_cap_of_finished_sessions_oldest_dropped_first() -> None:
    registry = StreamRegistry()
    registry.create("theirs", "bob", None).finish()
    for i in range(MAX_KEPT_PER_KEY + 5):
        session = registry.create(f"c{i}", "alice", None)
        session.append(b"x" * 100)
        session.finish()
    kept = [s.conversation_id for s in registry.sessions("alice")]
    assert kept == [f"c{i}" for i in range(5, MAX_KEPT_PER_KEY + 5)]
    assert registry.get("theirs", "bob") is not None  # another key's are not touched
    assert registry.held_bytes == held_total(registry) == MAX_KEPT_PER_KEY * 100


def test_the_byte_budget_drops_finished_sessions_oldest_first_and_never_live_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streams, "BYTE_BUDGET", 1000)
    registry = StreamRegistry()
    old, newer = registry.create("old", "alice", None), registry.create("newer", "bob", None)
    for session in (old, newer):
        session.append(b"x" * 300)
        session.finish()
    live = registry.create("live", "carol", None)
    live.append(b"y" * 300)
    assert registry.held_bytes == 900
    live.append(b"y" * 200)  # 1100 > 1000: the oldest finished goes, the live one stays
    assert registry.get("old", "alice") is None
    assert registry.get("newer", "bob") is newer
    assert registry.held_bytes == held_total(registry) == 800
    live.append(b"y" * 600)  # 1400: no finished session can make up for it any more but newer
    assert registry.get("newer", "bob") is None
    assert registry.get("live", "carol") is live and live.held_bytes == 1100
    with pytest.raises(TooManySessions):  # only live bytes over the budget: a new one is refused
        registry.create("another", "dave", None)
    live.finish()
    registry.create("another", "dave", None)  # the finished one made room
    assert registry.get("live", "carol") is None


def test_a_finished_session_gives_its_slack_back() -> None:
    session = StreamSession("c", "key", None)
    for _ in range(100):
        session.append(b"z" * 50_000)  # 5 MB through a 4 MiB buffer
    allocated = sys.getsizeof(session._buf)
    assert allocated > session.held_bytes + 100_000  # the bytearray keeps what it grew to
    session.finish()
    assert sys.getsizeof(session._buf) < session.held_bytes + 100
    assert run(collect(session, session.dropped_bytes)) == b"z" * BUFFER_BYTES


def test_held_bytes_stays_the_sum_of_the_buffers_whatever_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "BYTE_BUDGET", 50_000)
    monkeypatch.setattr(streams, "MAX_KEPT_PER_KEY", 3)
    rng = random.Random(7)
    registry = StreamRegistry()
    owners, ids = ["a", "b", "c"], [f"c{i}" for i in range(6)]
    for _ in range(2000):
        owner, conv = rng.choice(owners), rng.choice(ids)
        action = rng.random()
        session = registry.get(conv, owner)
        try:
            if session is None or action < 0.2:
                registry.create(conv, owner, None)
            elif action < 0.7:
                session.append(b"d" * rng.randint(1, 9000))
            elif action < 0.85:
                session.finish()
            elif action < 0.95:
                registry.delete(conv, owner)
            else:
                registry.revoke(owner, drop=rng.random() < 0.5)
        except (TooManySessions, TooManyStreams):
            pass
        assert registry.held_bytes == held_total(registry)
        for who in owners:
            mine = registry.sessions(who)
            assert registry.live_count(who) == sum(not s.is_done for s in mine) <= MAX_LIVE_PER_KEY
            assert sum(s.is_done for s in mine) <= 3


def test_revoking_a_key_cancels_its_live_sessions_and_on_delete_drops_them_all() -> None:
    async def main() -> None:
        registry = StreamRegistry()
        canceller, theirs = Canceller(), Canceller()
        live = registry.create("live", "alice", None)
        live.set_canceller(canceller)
        registry.create("done", "alice", None).finish()
        registry.create("other", "bob", None).set_canceller(theirs)
        reader = asyncio.create_task(collect(live, 0))
        await asyncio.sleep(0.01)
        assert registry.revoke("alice", drop=False) == 1  # disabled: stopped, kept for replay
        assert canceller.calls == 1 and live.is_cancelled
        await asyncio.wait_for(reader, 1)
        assert {s.conversation_id for s in registry.sessions("alice")} == {"live", "done"}
        assert registry.revoke("alice", drop=True) == 0  # deleted: nothing of it is left
        assert registry.sessions("alice") == []
        assert theirs.calls == 0 and registry.live_count("bob") == 1
        assert registry.held_bytes == held_total(registry)

    run(main())


def test_the_admin_view_names_owner_model_state_and_bytes() -> None:
    registry = StreamRegistry()
    session = registry.create("conv", "alice", "org/model")
    session.append(b"abc")
    assert session.describe_for_admin() | {"started_at": None} == {
        "key_id": "alice",
        "conversation_id": "conv",
        "model": "org/model",
        "state": "live",
        "interrupted": False,
        "total_bytes": 3,
        "held_bytes": 3,
        "dropped_bytes": 0,
        "started_at": None,
        "completed_at": None,
    }
    session.cancel()
    assert session.describe_for_admin()["state"] == "cancelled"
    done = registry.create("done", "alice", None)
    done.finish()
    assert done.describe_for_admin()["state"] == "done"


def test_the_error_event_is_one_sse_event_with_the_error_code() -> None:
    event = error_event(OffsetGone("reader at 5 fell behind"))
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert event.count(b"\n\n") == 1
    payload = json.loads(event.split(b"data: ", 1)[1])
    assert payload == {"error": {"code": "offset_gone", "message": "reader at 5 fell behind"}}


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"", 0),
        (b"data: {", 0),
        (b"data: 1\n", 0),
        (b"data: 1\n\n", 9),
        (b"data: 1\n\ndata: 2", 9),
        (b"data: 1\n\ndata: 2\n\n", 18),
        (b"event: e\r\ndata: 1\r\n\r\ndata", 21),
    ],
)
def test_whole_events_ends_at_the_last_blank_line(data: bytes, whole: int) -> None:
    assert whole_events(data) == whole

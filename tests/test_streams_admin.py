"""Control over running streams: an admin lists and cancels every key's sessions (`streams.list`,
`streams.cancel`), and disabling or deleting a key stops what it has running: its open `/v1`
connections are closed and its attached generations cancelled upstream (docs/gateway.md)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import Server, eventually, start_server
from vllm_use.gateway.live import LiveRequests

CHAT = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("streams-admin") / "data", "--upstream", upstream.url)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


def headers(key: str, conv: str | None = None, request_id: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {key}"}
    if conv:
        h["X-Conversation-Id"] = conv
    if request_id:
        h["X-Request-ID"] = request_id
    return h


class Streams:
    """Streaming responses held open (their iterators too: dropping one closes its connection)."""

    def __init__(self, gw: Server, stack: contextlib.ExitStack) -> None:
        self.gw = gw
        self.stack = stack
        self.client = stack.enter_context(httpx.Client(trust_env=False, timeout=30))
        self.readers: list[Iterator[bytes]] = []  # a dropped iterator would close its connection

    def open(self, method: str, path: str, hdrs: dict[str, str], body: Any = None) -> Iterator[bytes]:
        r = self.stack.enter_context(
            self.client.stream(method, self.gw.base_url + path, headers=hdrs, json=body)
        )
        assert r.status_code == 200, r.read()
        chunks = r.iter_raw()
        next(chunks)
        self.readers.append(chunks)
        return chunks


def outcome(chunks: Iterator[bytes], deadline_s: float = 10.0) -> str:
    """Read on: "cut" (the connection closed mid-response), "ended" (a complete response) or
    "running" (still streaming at the deadline; the fake's endless stream never ends itself)."""
    deadline = time.monotonic() + deadline_s
    try:
        for _ in chunks:
            if time.monotonic() > deadline:
                return "running"
    except httpx.TransportError:
        return "cut"
    return "ended"


def sessions(gw: Server, key_id: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    r = gw.fetch("/api/streams" + (f"?key_id={key_id}" if key_id else ""))
    assert r.status_code == 200, r.text
    return {(s["key_id"], s["conversation_id"]): s for s in r.json()["sessions"]}


def upstream_closed(upstream: FakeUpstream, request_id: str) -> bool:
    return any(c.request_id == request_id for c in upstream.closes)


# --- streams.list / streams.cancel ----------------------------------------------------------------------


def test_admin_lists_every_keys_sessions_with_owner_model_state_and_bytes(
    gw: Server, upstream: FakeUpstream
) -> None:
    a_id, a = gw.create_key("inference", name="a")
    b_id, b = gw.create_key("inference", name="b")
    r = gw.client.post(gw.base_url + "/v1/chat/completions", headers=headers(a, "a1::org/m"), json=CHAT)
    assert r.status_code == 200
    upstream.endless = True
    with contextlib.ExitStack() as stack:
        Streams(gw, stack).open("POST", "/v1/chat/completions", headers(b, "b1"), CHAT)
        listed = sessions(gw)
        done, live = listed[(a_id, "a1")], listed[(b_id, "b1")]
        assert done["model"] == "org/m" and done["state"] == "done" and done["completed_at"]
        assert done["total_bytes"] == len(r.content) == done["held_bytes"]
        assert live["model"] is None and live["state"] == "live" and live["completed_at"] is None
        assert set(sessions(gw, a_id)) == {(a_id, "a1")}
        body = gw.fetch("/api/streams").json()
        assert body["limits"] == {
            "live_per_key": 8,
            "kept_per_key": 32,
            "buffer_bytes": 4 * 1024 * 1024,
            "byte_budget": 256 * 1024 * 1024,
            "sessions": 10000,
            "kept_s": 300,
        }
        assert body["held_bytes"] >= done["held_bytes"] + live["held_bytes"]
        _, mcp_admin = gw.create_key("mcp.admin")
        over_mcp = gw.mcp("tools/call", {"name": "streams.list", "arguments": {}}, token=mcp_admin).json()
        assert over_mcp["result"]["isError"] is False
        assert {
            (s["key_id"], s["conversation_id"]) for s in over_mcp["result"]["structuredContent"]["sessions"]
        } >= {
            (a_id, "a1"),
            (b_id, "b1"),
        }


def test_admin_cancel_stops_a_live_generation_and_ends_its_readers(
    gw: Server, upstream: FakeUpstream
) -> None:
    key_id, key = gw.create_key("inference")
    upstream.endless = True
    with contextlib.ExitStack() as stack:
        streams = Streams(gw, stack)
        relay = streams.open("POST", "/v1/chat/completions", headers(key, "c1", "cancel-me"), CHAT)
        replay = streams.open("GET", "/v1/stream?conv_id=c1&from=0", headers(key))
        r = gw.fetch("/api/streams/cancel", "POST", json={"key_id": key_id, "conversation_id": "c1"})
        assert r.status_code == 200, r.text
        assert r.json()["session"]["state"] == "cancelled"
        assert outcome(relay) == "cut"  # never a clean end of a stream that did not finish
        assert outcome(replay) != "running"
    eventually(lambda: upstream_closed(upstream, "cancel-me"), timeout=5)  # vLLM's slot is freed
    again = gw.fetch("/api/streams/cancel", "POST", json={"key_id": key_id, "conversation_id": "c1"})
    assert again.status_code == 200 and again.json()["session"]["state"] == "cancelled"


@pytest.mark.parametrize(
    ("args", "status"),
    [
        ({"key_id": "A" * 24, "conversation_id": "nope"}, 404),
        ({"key_id": "short", "conversation_id": "c"}, 400),
        ({"key_id": "A" * 24, "conversation_id": "a:b"}, 400),
        ({"key_id": "A" * 24, "conversation_id": "x" * 129}, 400),
        ({"key_id": "A" * 24}, 400),
        ({"key_id": "A" * 24, "conversation_id": "c", "extra": 1}, 400),
    ],
)
def test_admin_cancel_refuses_unknown_sessions_and_bad_ids(
    gw: Server, args: dict[str, Any], status: int
) -> None:
    r = gw.fetch("/api/streams/cancel", "POST", json=args)
    assert r.status_code == status, r.text


def test_a_bad_key_id_filter_is_400(gw: Server) -> None:
    assert gw.fetch("/api/streams?key_id=nope").status_code == 400


# --- revocation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("revoke", ["disable", "delete"])
def test_revoking_a_key_closes_its_open_streams_and_cancels_its_generations(
    gw: Server, upstream: FakeUpstream, revoke: str
) -> None:
    key_id, key = gw.create_key("inference", name="revoked")
    other_id, other = gw.create_key("inference", name="bystander")
    upstream.endless = True
    with contextlib.ExitStack() as stack:
        streams = Streams(gw, stack)
        plain = streams.open("POST", "/v1/chat/completions", headers(key, None, f"{revoke}-plain"), CHAT)
        attached = streams.open("POST", "/v1/chat/completions", headers(key, "att", f"{revoke}-att"), CHAT)
        replay = streams.open("GET", "/v1/stream?conv_id=att&from=0", headers(key))
        with streams.client.stream(
            "POST",
            gw.base_url + "/v1/chat/completions",
            headers=headers(key, "left", f"{revoke}-left"),
            json=CHAT,
        ) as r:
            assert r.status_code == 200  # its client leaves; the generation is attached
        theirs = streams.open(
            "POST", "/v1/chat/completions", headers(other, "theirs", f"{revoke}-theirs"), CHAT
        )

        if revoke == "disable":
            assert gw.fetch(f"/api/keys/{key_id}/disable", "POST").status_code == 200
        else:
            assert gw.fetch(f"/api/keys/{key_id}", "DELETE").status_code == 200

        assert outcome(plain) == "cut"
        assert outcome(attached) == "cut"
        assert outcome(replay) == "cut"
        for request_id in ("plain", "att", "left"):  # every generation of the key stopped upstream
            eventually(lambda rid=request_id: upstream_closed(upstream, f"{revoke}-{rid}"), timeout=5)
        assert not upstream_closed(upstream, f"{revoke}-theirs")
        assert outcome(theirs, deadline_s=0.5) == "running"  # another key's stream goes on

    mine = sessions(gw, key_id)
    if revoke == "disable":  # kept for replay until gc, should the key be enabled again
        assert {conv for _, conv in mine} == {"att", "left"}
        assert all(s["state"] != "live" for s in mine.values())
    else:
        assert mine == {}
    assert gw.fetch(f"/api/streams?key_id={other_id}").status_code == 200


# --- the registry of open /v1 requests ---------------------------------------------------------------


class Conn:
    def __init__(self, fail: bool = False) -> None:
        self.is_closed = False
        self.fail = fail

    def close(self) -> None:
        if self.fail:
            raise OSError("already broken")
        self.is_closed = True


def test_revoking_closes_every_open_request_of_that_key_only() -> None:
    live = LiveRequests()
    mine = [Conn(), Conn(fail=True), Conn()]
    theirs = Conn()
    tokens = [live.add("k", c.close, lambda c=c: c.is_closed) for c in mine]
    live.add("other", theirs.close, lambda: theirs.is_closed)
    live.remove("k", tokens[2])  # finished: not closed by the revocation
    assert live.count("k") == 2 and live.count() == 3
    assert live.revoke("k") == 1  # a failing close does not stop the others
    assert mine[0].is_closed and not mine[2].is_closed and not theirs.is_closed
    assert live.count("k") == 0 and live.revoke("k") == 0
    live.remove("k", tokens[0])  # on_finish after the revocation: harmless


def test_entries_of_connections_closed_without_finishing_are_pruned() -> None:
    """A client that leaves mid-body never reaches on_finish: its entry goes at the key's next
    request, so a key's entries stay bounded by its open connections."""
    live = LiveRequests()
    leaked = [Conn() for _ in range(50)]
    for c in leaked:
        live.add("k", c.close, lambda c=c: c.is_closed)
        c.is_closed = True  # gone without on_finish
    live.add("k", Conn().close, lambda: False)
    assert live.count("k") == 1

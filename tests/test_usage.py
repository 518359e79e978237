"""Token accounting (docs/observability.md, "Token accounting"): the counts of each `/v1` answer in
its audit row, the usage event a client did not ask for taken out of its stream, the daily rollups
and `usage.summary` over /api and MCP.

One server for the module, in front of the fake vLLM upstream (tests/fakes/upstream.py, which sends
usage as vLLM 0.32 does: tests/test_fakes_match_vllm.py) and running one deployment on the fake
`vllm` executable, with `--max-audit-records 2` so that the rollups are seen to outlive the rows.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import fake_vllm_bin, shapes
from tests.fakes.upstream import FakeUpstream, running
from tests.support.deployments import START_TIMEOUT_S, create, load, register
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.gateway import audit
from vllm_use.gateway.aliases import OPTIONS_MAX, prepare
from vllm_use.storage import Database
from vllm_use.usage import store
from vllm_use.usage.ledger import UsageLedger
from vllm_use.usage.tap import BODY_MAX, COUNT_MAX, HOLD_MAX, tap_for

UPSTREAM_KEY = "usage-upstream-key-0123456789"
PROMPT = "Say hello to everyone here"  # the fakes count one token per word: 5
REPLY = "Hello from the fake upstream"  # 5 tokens
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]}
COMPLETION = {"model": "tiny", "prompt": PROMPT}
RESPONSE = {"model": "tiny", "input": PROMPT}
MESSAGE = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
EMBEDDING = {"model": "tiny", "input": ["one two", "three"]}
TODAY = time.strftime("%Y-%m-%d", time.gmtime())


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running(api_key=UPSTREAM_KEY)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("usage")
    vllm = fake_vllm_bin(root / "bin", max_lifetime=300)
    first = free_port()
    srv = start_server(
        root / "data",
        "--upstream",
        upstream.url,
        "--vllm-bin",
        str(vllm),
        "--runtime-ports",
        f"{first}-{first + 3}",
        "--max-audit-records",
        "2",
        env={"VLLM_USE_UPSTREAM_API_KEY": UPSTREAM_KEY},
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keys(gw: Server) -> dict[str, tuple[str, str]]:
    """Two inference keys ("alice", "bob") by name: (id, secret)."""
    return {name: gw.create_key("inference", name=name) for name in ("alice", "bob")}


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


def send(gw: Server, secret: str, path: str, body: Any, **headers: str) -> tuple[httpx.Response, str]:
    """One /v1 request; (the answer, its request id)."""
    request_id = "rq-" + uuid.uuid4().hex
    r = gw.client.post(
        gw.base_url + path,
        content=json.dumps(body).encode(),  # with spaces: a body is relayed byte for byte
        headers={
            "Authorization": f"Bearer {secret}",
            "Content-Type": "application/json",
            "X-Request-ID": request_id,
            **headers,
        },
    )
    assert r.status_code == 200, r.text
    return r, request_id


def audited(gw: Server, request_id: str) -> dict[str, Any]:
    """The audit row of a request, once written (the writer flushes every 0.5 s)."""

    def row() -> dict[str, Any] | None:
        r = gw.fetch("/api/requests/recent?limit=2")
        assert r.status_code == 200, r.text
        assert r.json()["corrupt"] == []
        return next((rec for rec in r.json()["requests"] if rec["request_id"] == request_id), None)

    return eventually(row, timeout=10)


def summary(gw: Server, query: str = "", token: str | None = "admin") -> Any:
    r = gw.fetch("/api/usage" + query, token=token)
    assert r.status_code == 200, r.text
    return r.json()


def direct(upstream: FakeUpstream, path: str, body: Any) -> bytes:
    """The same request sent to the upstream itself: the bytes a client of vLLM would get."""
    r = httpx.post(upstream.url + path, json=body, headers={"Authorization": f"Bearer {UPSTREAM_KEY}"})
    assert r.status_code == 200, r.text
    return r.content


def normalised(stream: bytes) -> bytes:
    """A stream without what differs between two generations of the same text: ids and times."""
    stream = re.sub(rb'"id":"[^"]*"', b'"id":"-"', stream)
    return re.sub(rb'"created":[0-9]+', b'"created":0', stream)


def usage_events(stream: bytes) -> list[dict[str, Any]]:
    return [
        event
        for line in stream.split(b"\n")
        if line.startswith(b"data: {")
        and "usage" in (event := json.loads(line[6:]))
        and event.get("choices") == []
    ]


# --- the counts of each route ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/v1/chat/completions", CHAT, ("prompt_tokens", "completion_tokens")),
        ("/v1/completions", COMPLETION, ("prompt_tokens", "completion_tokens")),
        ("/v1/responses", RESPONSE, ("input_tokens", "output_tokens")),
        ("/v1/messages", MESSAGE, ("input_tokens", "output_tokens")),
    ],
    ids=["chat", "completions", "responses", "messages"],
)
def test_streamed_and_plain_answers_record_the_counts_the_upstream_reports(
    gw: Server, keys: dict[str, tuple[str, str]], path: str, body: dict[str, Any], names: tuple[str, str]
) -> None:
    secret = keys["alice"][1]
    plain, plain_id = send(gw, secret, path, body)
    reported = plain.json()["usage"]
    assert (reported[names[0]], reported[names[1]]) == (5, 5)  # what the client saw
    row = audited(gw, plain_id)
    assert (row["prompt_tokens"], row["completion_tokens"], row["stream"]) == (5, 5, False)
    _, streamed_id = send(gw, secret, path, {**body, "stream": True})
    row = audited(gw, streamed_id)
    assert (row["prompt_tokens"], row["completion_tokens"], row["stream"]) == (5, 5, True)
    assert row["deployment"] is None  # --upstream serves it: no deployment


def test_embeddings_record_their_prompt_tokens(gw: Server, keys: dict[str, tuple[str, str]]) -> None:
    answer, request_id = send(gw, keys["alice"][1], "/v1/embeddings", EMBEDDING)
    assert answer.json()["usage"]["prompt_tokens"] == 3
    row = audited(gw, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (3, 0)


def test_an_answer_without_usage_records_counts_as_not_known(
    gw: Server, keys: dict[str, tuple[str, str]], upstream: FakeUpstream
) -> None:
    upstream.fail = (200, b'{"object":"chat.completion","usage":{"prompt_tokens":-1}}', "application/json")
    _, request_id = send(gw, keys["alice"][1], "/v1/chat/completions", CHAT)
    row = audited(gw, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (None, None)


# --- what the client receives ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)],
    ids=["chat", "completions"],
)
def test_a_stream_carries_no_usage_event_the_client_did_not_ask_for(
    gw: Server, keys: dict[str, tuple[str, str]], upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    streamed = {**body, "stream": True, "max_tokens": 4}
    answer, request_id = send(gw, keys["alice"][1], path, streamed)
    # The upstream was asked for the usage event, by one member added to the body as sent.
    sent = upstream.received(request_id)[0].body
    assert sent == json.dumps(streamed).encode().replace(
        b"{", b'{"stream_options":{"include_usage":true},', 1
    )
    assert usage_events(answer.content) == []
    assert normalised(answer.content) == normalised(direct(upstream, path, streamed))
    assert b'"system_fingerprint"' in answer.content  # back on the terminal chunk, as vLLM puts it
    row = audited(gw, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (5, 4)


def test_a_stream_keeps_the_usage_event_the_client_asked_for(
    gw: Server, keys: dict[str, tuple[str, str]], upstream: FakeUpstream
) -> None:
    streamed = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    answer, request_id = send(gw, keys["alice"][1], "/v1/chat/completions", streamed)
    assert upstream.received(request_id)[0].body == json.dumps(streamed).encode()  # unchanged
    assert [event["usage"]["completion_tokens"] for event in usage_events(answer.content)] == [5]
    assert normalised(answer.content) == normalised(direct(upstream, "/v1/chat/completions", streamed))
    row = audited(gw, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (5, 5)


def test_a_resumable_stream_replays_without_the_usage_event(
    gw: Server, keys: dict[str, tuple[str, str]], upstream: FakeUpstream
) -> None:
    secret = keys["alice"][1]
    conversation = "conv-" + uuid.uuid4().hex[:12]
    answer, _ = send(
        gw, secret, "/v1/chat/completions", {**CHAT, "stream": True}, **{"X-Conversation-Id": conversation}
    )
    replay = gw.client.get(
        gw.base_url + f"/v1/stream?conv_id={conversation}", headers={"Authorization": f"Bearer {secret}"}
    )
    assert replay.status_code == 200, replay.text
    assert replay.content == answer.content and usage_events(replay.content) == []
    assert b"data: [DONE]" in replay.content


def _vllm_stream(kind: type[shapes.ChatStream] | type[shapes.CompletionStream], include_usage: bool) -> bytes:
    stream = kind("tiny", 5, include_usage)
    stream.created, stream.id = 1, "fixed"
    return b"".join([*stream.start(), stream.piece(" a"), stream.piece(" b"), *stream.end(" c")])


@pytest.mark.parametrize("kind", [shapes.ChatStream, shapes.CompletionStream], ids=["chat", "completions"])
def test_the_usage_event_comes_out_wherever_the_chunks_split(kind: Any) -> None:
    """The bytes vLLM sends when asked, cut into chunks at every place (an event split across
    chunks, or a whole stream in one), come out as the stream it sends when not asked."""
    asked, plain = _vllm_stream(kind, True), _vllm_stream(kind, False)
    path = "chat/completions" if kind is shapes.ChatStream else "completions"
    for cut in range(1, len(asked) + 1):
        tap = tap_for(path, 200, shapes.SSE_CONTENT_TYPE, "added")
        assert tap is not None
        out = tap.feed(asked[:cut]) + tap.feed(asked[cut:]) + tap.end()
        assert out == plain, cut
        assert (tap.prompt_tokens, tap.completion_tokens) == (5, 3), cut


def _settled(path: str, body: bytes) -> tuple[int | None, int | None]:
    tap = tap_for(path, 200, "application/json", "none")
    assert tap is not None
    tap.feed(body)
    asyncio.run(tap.settle())
    return tap.prompt_tokens, tap.completion_tokens


def test_the_taps_limits_hold_at_their_edges() -> None:
    # A count is an int up to 2**31.
    at_most = json.dumps({"usage": {"prompt_tokens": COUNT_MAX, "completion_tokens": COUNT_MAX + 1}})
    assert _settled("chat/completions", at_most.encode()) == (COUNT_MAX, None)
    # A JSON answer up to BODY_MAX is read (past 8 KiB by the scan, in the executor), a longer one not.
    usage = b',"usage":{"input_tokens":3,"output_tokens":4}}'
    head = b'{"pad":"'
    body = head + b"x" * (BODY_MAX - len(head) - len(usage) - 1) + b'"' + usage
    assert len(body) == BODY_MAX and _settled("messages", body) == (3, 4)
    longer = head + b"x" * (BODY_MAX - len(head) - len(usage)) + b'"' + usage
    assert _settled("messages", longer) == (None, None)
    # A client's stream_options up to OPTIONS_MAX characters is read and extended; a longer one is left.
    for size, usage_state in ((OPTIONS_MAX, "added"), (OPTIONS_MAX + 1, "none")):
        pad = "p" * (size - len('{"x":""}'))
        sent = b'{"stream":true,"stream_options":{"x":"' + pad.encode() + b'"}}'
        prepared = prepare(sent, {}, add_usage=True)
        assert prepared.usage == usage_state, size
        assert (b'"include_usage":true' in prepared.body) is (usage_state == "added")


def test_terminal_chunks_are_held_up_to_hold_max_for_their_fingerprint() -> None:
    """n > 1 choices: what comes after the first terminal chunk waits for the usage event, up to
    HOLD_MAX bytes; past that it goes out as it came (without the fingerprint), and the usage event
    is still taken out."""
    stream = shapes.ChatStream("tiny", 5, True)
    stream.created, stream.id = 1, "fixed"
    head = b"".join(stream.start())
    terminal, usage_event, done = stream.end(" c")
    for filler_size, patched in ((HOLD_MAX - len(terminal), True), (HOLD_MAX - len(terminal) + 1, False)):
        filler = b"data: {" + b"x" * (filler_size - 10) + b"}\n\n"
        assert len(terminal + filler) - HOLD_MAX == (0 if patched else 1)
        tap = tap_for("chat/completions", 200, shapes.SSE_CONTENT_TYPE, "added")
        assert tap is not None
        out = b"".join(tap.feed(c) for c in (head, terminal, filler, usage_event, done)) + tap.end()
        assert usage_event not in out and out.endswith(filler + done)
        assert (b'"system_fingerprint"' in out) is patched, filler_size
        assert (tap.prompt_tokens, tap.completion_tokens) == (5, 1)


def test_rollups_are_written_when_no_audit_row_is_kept_and_seed_todays_tokens(tmp_path: Path) -> None:
    """--max-audit-records 0 keeps no audit row; the rollups are still written (at shutdown too)."""
    (tmp_path / "data").mkdir(mode=0o700)
    db = Database(tmp_path / "data" / "vllm-use.db")
    db.open()
    try:
        writer = audit.AuditWriter(db, 0)
        for n, (prompt, completion) in enumerate(((5, 6), (7, None), (None, None))):
            writer.record(
                audit_id=f"au_{n:024d}",
                request_id=f"rq-{n}",
                key_id="k" * 24,
                method="POST",
                path="/v1/chat/completions",
                model="tiny",
                status=200,
                duration_ms=1.0,
                stream=False,
                deployment="llama",
                prompt_tokens=prompt,
                completion_tokens=completion,
            )
        assert writer.flush_sync()
        assert db.query_sync(audit.count) == 0
        found = db.query_sync(store.summary, TODAY, TODAY, None, None)
        assert found["totals"] == {"requests": 3, "prompt_tokens": 12, "completion_tokens": 6}
        assert [(d["deployment"], d["requests"]) for d in found["deployments"]] == [("llama", 3)]
        ledger = UsageLedger()
        ledger.seed(ledger.day, db.query_sync(store.tokens_on, ledger.day))
        assert ledger.tokens_today("k" * 24) == 18
    finally:
        db.close()


# --- rollups and usage.summary ---------------------------------------------------------------------


def test_rollups_sum_every_request_and_outlive_the_audit_cap(
    gw: Server, keys: dict[str, tuple[str, str]]
) -> None:
    bob_id, bob = keys["bob"]
    before = summary(gw, f"?key_id={bob_id}")["totals"]
    ids = [send(gw, bob, "/v1/chat/completions", {**CHAT, "max_tokens": n})[1] for n in (1, 2, 3)]
    audited(gw, ids[-1])
    # --max-audit-records 2: the first of the three is gone from the audit, not from the rollups.
    kept = {rec["request_id"] for rec in gw.fetch("/api/requests/recent?limit=1000").json()["requests"]}
    assert ids[0] not in kept and len(kept) == 2
    totals = summary(gw, f"?key_id={bob_id}")["totals"]
    assert totals == {
        "requests": before["requests"] + 3,
        "prompt_tokens": before["prompt_tokens"] + 15,
        "completion_tokens": before["completion_tokens"] + 6,
    }


def test_a_deployments_requests_are_rolled_up_under_its_name(
    gw: Server, keys: dict[str, tuple[str, str]]
) -> None:
    model_id = register(gw, "llama-files")
    body = {"name": "llama", "model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}}
    assert create(gw, body).status_code == 201
    assert load(gw, "llama").status_code == 200
    alice_id, alice = keys["alice"]
    plain, _ = send(gw, alice, "/v1/chat/completions", {**CHAT, "model": "llama"})
    usage = plain.json()["usage"]
    _, request_id = send(gw, alice, "/v1/chat/completions", {**CHAT, "model": "llama", "stream": True})
    row = audited(gw, request_id)
    assert (row["deployment"], row["prompt_tokens"], row["completion_tokens"]) == (
        "llama",
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    found = summary(gw, "?deployment=llama")
    assert found["totals"] == {
        "requests": 2,
        "prompt_tokens": 2 * usage["prompt_tokens"],
        "completion_tokens": 2 * usage["completion_tokens"],
    }
    assert [d["deployment"] for d in found["deployments"]] == ["llama"]
    assert [k["key_id"] for k in found["keys"]] == [alice_id]


def test_usage_summary_by_day_key_and_deployment_over_api_and_mcp(
    gw: Server, keys: dict[str, tuple[str, str]]
) -> None:
    alice_id, alice = keys["alice"]
    bob_id, bob = keys["bob"]
    audited(gw, send(gw, alice, "/v1/chat/completions", CHAT)[1])
    audited(gw, send(gw, bob, "/v1/chat/completions", {**CHAT, "max_tokens": 1})[1])
    found = summary(gw)
    assert found["until"] == TODAY and len(found["days"]) == 30 and found["days"][-1]["day"] == TODAY
    assert all(
        d == {"day": d["day"], "requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        for d in found["days"][:-1]
    )
    assert found["days"][-1] | {"day": "-"} == found["totals"] | {"day": "-"}
    by_key = {k["key_id"]: k for k in found["keys"]}
    assert by_key[alice_id]["key_name"] == "alice" and by_key[bob_id]["key_name"] == "bob"
    tokens = [k["prompt_tokens"] + k["completion_tokens"] for k in found["keys"]]
    assert tokens == sorted(tokens, reverse=True)
    assert sum(k["requests"] for k in found["keys"]) == found["totals"]["requests"]
    assert {d["deployment"] for d in found["deployments"]} <= {"", "llama"}
    assert sum(d["requests"] for d in found["deployments"]) == found["totals"]["requests"]
    # MCP with mcp.read: the same numbers, the key names withheld (listing keys is mcp.admin).
    reader = gw.create_key("mcp.read", name="reader")[1]
    r = gw.mcp("tools/call", {"name": "usage.summary", "arguments": {"since": TODAY}}, token=reader)
    assert r.status_code == 200, r.text
    over_mcp = r.json()["result"]["structuredContent"]
    assert over_mcp["totals"] == found["totals"] and over_mcp["days"] == found["days"][-1:]
    assert {k["key_name"] for k in over_mcp["keys"]} == {None}
    # An inference key reads nothing here.
    assert gw.fetch("/api/usage", token=alice).status_code in (401, 403)


def test_a_deleted_keys_usage_stays_and_reads_without_a_name(gw: Server) -> None:
    key_id, secret = gw.create_key("inference", name="leaving")
    audited(gw, send(gw, secret, "/v1/chat/completions", CHAT)[1])
    assert gw.fetch(f"/api/keys/{key_id}", "DELETE").status_code in (200, 204)
    (gone,) = summary(gw, f"?key_id={key_id}")["keys"]
    assert gone == {
        "key_id": key_id,
        "key_name": None,
        "requests": 1,
        "prompt_tokens": 5,
        "completion_tokens": 5,
    }


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?since=2026-02-30", "since"),
        ("?until=26-01-01", "until"),
        ("?since=2026-03-02&until=2026-03-01", "until"),
        ("?since=2025-01-01&until=2026-01-02", "until"),  # 367 days
        ("?key_id=not-a-key", "key_id"),
        ("?deployment=%20x", "deployment"),
    ],
)
def test_bad_ranges_and_filters_are_refused_naming_the_field(gw: Server, query: str, field: str) -> None:
    r = gw.fetch("/api/usage" + query)
    assert r.status_code == 400, r.text
    assert field in json.dumps(r.json()["error"])


def test_a_range_of_366_days_is_the_longest_accepted(gw: Server) -> None:
    found = summary(gw, "?since=2025-01-02&until=2026-01-02")
    assert len(found["days"]) == 366 and found["days"][0]["day"] == "2025-01-02"

"""Resumable streams over HTTP: attach, survive a disconnect, replay, stop, look up; a replay
that falls behind ends with an error event; per-key caps on live and kept sessions (docs/gateway.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FAKE_VLLM
from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.gateway.streams import BUFFER_BYTES, MAX_KEPT_PER_KEY, MAX_LIVE_PER_KEY

BODY = {
    "model": "tiny",
    "stream": True,
    "max_tokens": 60,
    "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(60))}],
}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    port = free_port()
    log = open(tmp_path / "fake.log", "wb")
    env = {**os.environ, "FAKE_VLLM_LOAD_SECONDS": "0.1", "FAKE_VLLM_TOKEN_SECONDS": "0.05"}
    fake = subprocess.Popen(
        [str(FAKE_VLLM), "serve", "tiny", "--port", str(port), "--served-model-name", "tiny"],
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    server = start_server(tmp_path / "data", "--upstream", f"http://127.0.0.1:{port}")
    eventually(lambda: httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200)
    server.keys = [server.create_key("inference")[1] for _ in range(2)]  # type: ignore[attr-defined]
    server.fake_log = tmp_path / "fake.log"  # type: ignore[attr-defined]
    yield server
    server.stop()
    os.killpg(fake.pid, signal.SIGKILL)
    fake.wait()
    log.close()


def auth(key: str, conv: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if conv:
        headers["X-Conversation-Id"] = conv
    return headers


def read_some(client: httpx.Client, url: str, headers: dict[str, str], n: int) -> bytes:
    got = b""
    with client.stream("POST", url, headers=headers, json=BODY) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            got += chunk
            if len(got) >= n:
                break
    return got


def test_a_dropped_client_resumes_with_the_exact_bytes(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        first = read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-a"), 300)
        r = client.get(gateway.base_url + "/v1/stream?conv_id=conv-a&from=0", headers=auth(key))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.content.startswith(first)
    assert r.content.endswith(b"data: [DONE]\n\n")
    with httpx.Client(trust_env=False, timeout=30) as client:
        tail = client.get(
            gateway.base_url + f"/v1/stream?conv_id=conv-a&from={len(first)}", headers=auth(key)
        )
    assert first + tail.content == r.content


def test_lookup_returns_only_the_ids_asked_for_and_owned(gateway: Any) -> None:
    mine, theirs = gateway.keys
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(mine, "conv-b"), 100)
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(mine, "conv-c"), 100)
        r = client.post(
            gateway.base_url + "/v1/streams/lookup",
            headers=auth(mine),
            json={"conversation_ids": ["conv-b", "unknown"]},
        )
        assert [s["conversation_id"] for s in r.json()["sessions"]] == ["conv-b"]
        assert set(r.json()["sessions"][0]) == {
            "conversation_id",
            "is_done",
            "interrupted",
            "total_bytes",
            "dropped_bytes",
            "started_at",
            "completed_at",
        }
        other = client.post(
            gateway.base_url + "/v1/streams/lookup",
            headers=auth(theirs),
            json={"conversation_ids": ["conv-b"]},
        )
        assert other.json() == {"sessions": []}
        assert (
            client.get(gateway.base_url + "/v1/stream?conv_id=conv-b", headers=auth(theirs)).status_code
            == 404
        )


def test_delete_stops_the_generation_and_is_idempotent(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-d"), 100)
        assert (
            client.delete(gateway.base_url + "/v1/stream?conv_id=conv-d", headers=auth(key)).status_code
            == 204
        )
        assert (
            client.delete(gateway.base_url + "/v1/stream?conv_id=conv-d", headers=auth(key)).status_code
            == 204
        )

        def done() -> bool:
            r = client.post(
                gateway.base_url + "/v1/streams/lookup",
                headers=auth(key),
                json={"conversation_ids": ["conv-d"]},
            )
            return r.json()["sessions"][0]["is_done"]

        eventually(done, timeout=5)
        replay = client.get(gateway.base_url + "/v1/stream?conv_id=conv-d&from=0", headers=auth(key))
    assert b"[DONE]" not in replay.content  # stopped before the end
    eventually(lambda: b"Aborted request" in gateway.fake_log.read_bytes(), timeout=5)


def test_a_stream_stopped_by_delete_while_its_client_reads_is_audited_as_canceled(gateway: Any) -> None:
    """The owner stopped it (499), the upstream did not fail (not 502); the reader sees an
    incomplete response, never a clean end of a truncated stream."""
    key = gateway.keys[0]
    headers = {**auth(key, "conv-stop"), "X-Request-ID": "stop-while-reading"}
    with httpx.Client(trust_env=False, timeout=30) as reader, httpx.Client(trust_env=False) as other:
        with reader.stream(
            "POST", gateway.base_url + "/v1/chat/completions", headers=headers, json=BODY
        ) as r:
            chunks = r.iter_raw()
            next(chunks)
            stop = other.delete(gateway.base_url + "/v1/stream?conv_id=conv-stop", headers=auth(key))
            assert stop.status_code == 204
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in chunks:
                    pass

    def record() -> list[dict[str, Any]]:
        recent = gateway.fetch("/api/requests/recent").json()["requests"]
        return [x for x in recent if x["request_id"] == "stop-while-reading"]

    (audited,) = eventually(record, timeout=5)
    assert audited["status"] == 499


def test_bad_offsets_are_400(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-e"), 100)
        time.sleep(0.2)
        for offset in ("-1", "abc", "99999999"):
            r = client.get(gateway.base_url + f"/v1/stream?conv_id=conv-e&from={offset}", headers=auth(key))
            assert r.status_code == 400, (offset, r.text)
        assert client.get(gateway.base_url + "/v1/stream", headers=auth(key)).status_code == 400


def test_without_a_conversation_id_a_disconnect_aborts_the_upstream(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key), 100)
    eventually(lambda: b"Aborted request" in gateway.fake_log.read_bytes(), timeout=1.5)


def test_from_with_a_non_ascii_digit_is_400_not_500(gateway: Any) -> None:
    key = gateway.keys[0]
    with httpx.Client(trust_env=False, timeout=30) as client:
        read_some(client, gateway.base_url + "/v1/chat/completions", auth(key, "conv-digits"), 100)
        for offset in ("\u00b2", "\u0663", "1\u00b2"):  # str.isdigit() accepts them, int() does not
            r = client.get(
                gateway.base_url + "/v1/stream",
                params={"conv_id": "conv-digits", "from": offset},
                headers=auth(key),
            )
            assert r.status_code == 400, (offset, r.text)
            assert r.json()["error"]["code"] == "invalid_arguments"


# --- against tests/fakes/upstream.py: big chunks, endless streams -------------------------------------

MiB = 1024 * 1024
WORD = "x" * 65536  # one streamed chunk of ~64 KiB per word


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture
def fake(upstream: FakeUpstream, tmp_path: Path) -> Iterator[Server]:
    upstream.reset()
    server = start_server(tmp_path / "data", "--upstream", upstream.url)
    yield server
    upstream.reset()
    server.stop()


def chat(stream: bool = True) -> dict[str, Any]:
    return {"model": "tiny", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def sessions_of(server: Server, key_id: str) -> list[dict[str, Any]]:
    r = server.fetch(f"/api/streams?key_id={key_id}")
    assert r.status_code == 200, r.text
    return r.json()["sessions"]


def http_body(raw: bytes) -> tuple[int, bytes]:
    """Status and de-chunked body of one HTTP/1.1 response read off a socket."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return status, body
        body, rest = body + rest[:size], rest[size + 2 :]


def test_a_replay_reader_that_falls_behind_gets_an_error_event_not_a_clean_end(
    fake: Server, upstream: FakeUpstream
) -> None:
    """A reader that does not keep up falls more than the 4 MiB buffer behind: its stream must say
    so, or the client takes a stream with a hole in it for the whole answer."""
    _, key = fake.create_key("inference")
    upstream.reply = " ".join([WORD] * 256)  # ~17 MB: more than the buffer plus the socket buffers
    released = threading.Event()  # the bulk comes once the reader follows the session
    upstream.hold_after_first = released
    url = fake.base_url + "/v1/chat/completions"
    whole: list[int] = []

    def owner_reads_it_all() -> None:
        with httpx.Client(trust_env=False, timeout=60) as own:
            whole.append(len(own.post(url, headers=auth(key, "behind"), json=chat()).content))

    owner = threading.Thread(target=owner_reads_it_all)
    owner.start()
    with httpx.Client(trust_env=False, timeout=30) as client:

        def started() -> bool:
            lookup = client.post(
                fake.base_url + "/v1/streams/lookup", headers=auth(key), json={"conversation_ids": ["behind"]}
            )
            return bool(lookup.json()["sessions"])

        eventually(started, timeout=10)
        host, port = fake.base_url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader, deterministically
        reader.connect((host, int(port)))
        reader.settimeout(30)
        reader.sendall(
            f"GET /v1/stream?conv_id=behind&from=0 HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        first = reader.recv(1024)  # the answer has started: the replay is following the session
        assert first.startswith(b"HTTP/1.1 200"), first
        released.set()

        def done() -> bool:
            lookup = client.post(
                fake.base_url + "/v1/streams/lookup", headers=auth(key), json={"conversation_ids": ["behind"]}
            )
            return lookup.json()["sessions"][0]["is_done"]

        eventually(done, timeout=60)
    owner.join(timeout=60)
    assert whole and whole[0] > 16_000_000  # the owner got it all: only the slow reader fell behind
    raw = first
    with reader:
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            data = reader.recv(1 << 20)
            assert data, "the connection closed before the end of the response"
            raw += data
    status, body = http_body(raw)
    assert status == 200
    assert len(body) < 17_000_000  # it did not get everything
    *events, last_event, end = body.split(b"\n\n")
    assert end == b""
    assert last_event.startswith(b"event: error\ndata: "), last_event[-300:]
    error = json.loads(last_event.split(b"data: ", 1)[1])["error"]
    assert error["code"] == "offset_gone" and "behind" in error["message"]
    for event in events:  # whole events only before it: the error never lands inside one
        assert event.startswith(b"data: {") and json.loads(event[6:])["object"] == "chat.completion.chunk"


def test_attached_generations_survive_their_clients_hanging_up_mid_stream(
    fake: Server, upstream: FakeUpstream
) -> None:
    """Owners hang up (a reset) while their streams pour in. Whatever the gateway was writing to
    them then must not abort the generations: they are attached, and only DELETE stops them."""
    _, key = fake.create_key("inference")
    upstream.reply = " ".join(["word"] * 4000)
    upstream.word_interval = 0.0005
    host, port = fake.base_url.removeprefix("http://").split(":")
    body = json.dumps(chat()).encode()
    conversations = [f"leaving-{i}" for i in range(MAX_LIVE_PER_KEY)]
    owners = []
    for conv in conversations:
        owner = socket.socket()
        owner.connect((host, int(port)))
        owner.settimeout(30)
        owner.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"X-Conversation-Id: {conv}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        owners.append(owner)
    for owner in owners:
        assert owner.recv(4096).startswith(b"HTTP/1.1 200")  # streaming to its owner
        owner.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        owner.close()  # a reset, mid-stream
    with httpx.Client(trust_env=False, timeout=30) as client:

        def sessions() -> list[dict[str, Any]]:
            lookup = client.post(
                fake.base_url + "/v1/streams/lookup",
                headers=auth(key),
                json={"conversation_ids": conversations},
            )
            return lookup.json()["sessions"]

        eventually(lambda: all(s["is_done"] for s in sessions()), timeout=60)
        for session in sessions():
            conv, total = session["conversation_id"], session["total_bytes"]
            tail = client.get(
                fake.base_url + f"/v1/stream?conv_id={conv}&from={total - 64}", headers=auth(key)
            ).content
            assert tail.endswith(b"data: [DONE]\n\n"), (conv, tail)  # generated to its end


def test_an_attached_stream_the_upstream_cuts_keeps_the_error_event_for_its_replay(
    fake: Server, upstream: FakeUpstream
) -> None:
    """The owner left after the first chunk; the upstream then breaks mid-stream. The session must
    end with the same error event a connected client gets, so a replay never looks complete."""
    _, key = fake.create_key("inference")
    upstream.reply = " ".join(["word"] * 200)
    upstream.break_midway = True
    url = fake.base_url + "/v1/chat/completions"
    with httpx.Client(trust_env=False, timeout=30) as client:
        with client.stream("POST", url, headers=auth(key, "cut"), json=chat()) as r:
            assert r.status_code == 200
            next(r.iter_raw())  # the first chunk, then the owner leaves

        def state() -> dict[str, Any]:
            lookup = client.post(
                fake.base_url + "/v1/streams/lookup", headers=auth(key), json={"conversation_ids": ["cut"]}
            )
            return lookup.json()["sessions"][0]

        eventually(lambda: state()["is_done"], timeout=30)
        replay = client.get(fake.base_url + "/v1/stream?conv_id=cut&from=0", headers=auth(key)).content
    events = [e for e in replay.split(b"\n\n") if e]
    assert b"upstream connection lost" in events[-1], events[-3:]
    assert b"[DONE]" not in replay


def test_a_key_over_its_live_cap_is_429_and_nothing_more_reaches_the_upstream(
    fake: Server, upstream: FakeUpstream
) -> None:
    _, key = fake.create_key("inference")
    _, other = fake.create_key("inference")
    upstream.endless = True
    url = fake.base_url + "/v1/chat/completions"
    with httpx.Client(trust_env=False, timeout=30) as client, contextlib.ExitStack() as open_streams:
        readers = []  # a dropped iterator closes its connection: keep them all
        for i in range(MAX_LIVE_PER_KEY):  # generations that never end on their own
            r = open_streams.enter_context(
                client.stream("POST", url, headers=auth(key, f"live-{i}"), json=chat())
            )
            assert r.status_code == 200
            readers.append(r.iter_raw())
            next(readers[-1])
        upstream_before = len(upstream.requests)
        with client.stream("POST", url, headers=auth(key, "one-too-many"), json=chat()) as refused:
            assert refused.status_code == 429
            assert json.loads(refused.read())["error"]["code"] == "too_many_streams"
            assert int(refused.headers["Retry-After"]) >= 1
        assert len(upstream.requests) == upstream_before  # refused before anything was sent
        with client.stream("POST", url, headers=auth(other, "theirs"), json=chat()) as r:
            assert r.status_code == 200  # another key has its own cap
        assert (
            client.delete(fake.base_url + "/v1/stream?conv_id=live-0", headers=auth(key)).status_code == 204
        )
        with client.stream("POST", url, headers=auth(key, "fits-again"), json=chat()) as r:
            assert r.status_code == 200


def vm_rss(server: Server) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_one_key_cannot_pile_up_finished_sessions_in_memory(fake: Server, upstream: FakeUpstream) -> None:
    """One key, many finished ~4.6 MB sessions: only MAX_KEPT_PER_KEY are kept (oldest dropped
    first), each trimmed to its exact size, so memory stops growing at about the cap's worth."""
    key_id, key = fake.create_key("inference")
    upstream.reply = " ".join([WORD] * 70)
    url = fake.base_url + "/v1/chat/completions"
    count = MAX_KEPT_PER_KEY * 3
    with httpx.Client(trust_env=False, timeout=60) as client:

        def one(i: int) -> None:
            r = client.post(url, headers=auth(key, f"big-{i}"), json=chat())
            assert r.status_code == 200 and len(r.content) > BUFFER_BYTES

        for i in range(4):  # warm-up: allocator arenas, the pool, caches
            one(-1 - i)
        baseline = vm_rss(fake)
        for i in range(count):
            one(i)
    kept = sessions_of(fake, key_id)
    assert [s["conversation_id"] for s in kept] == [
        f"big-{i}" for i in range(count - MAX_KEPT_PER_KEY, count)
    ]
    assert all(s["state"] == "done" and s["held_bytes"] == BUFFER_BYTES for s in kept)
    grown = vm_rss(fake) - baseline
    # Measured: ~160 MiB here, ~430 MiB without the cap (every session kept 300 s, each in a
    # bytearray that keeps the allocation it grew to).
    assert grown < MAX_KEPT_PER_KEY * BUFFER_BYTES + 96 * MiB, grown / MiB

"""The fakes of vLLM answer like the real vLLM 0.32 they imitate: the same requests, the same answers.

tests/fakes/upstream.py (the gateway tests' upstream) and tests/fakes/vllm.py (the supervisor tests'
`vllm`) both serve the shapes of tests/fakes/shapes.py. A fake is only as good as its last comparison
with the real thing; this is that comparison. The real CPU vLLM serves the tiny model, started once
for the run, directly (tests/support/real_vllm.py), with `--api-key` (a vLLM started without a key
checks none) and `--max-model-len 2048` (the engine-death test needs a long generation to stop in):
the one real vLLM test_chat_real uses too (`shared_vllm`), started again after that test ends it.

Compared: status codes; error bodies exactly (they hold no generated text); bodies and SSE events by
shape: keys in order and the types of their values, the values of `object`/`type`/`role`/`owned_by`,
event names and their order (consecutive events of the same shape count as one). Generated text is
never compared. Killing the real engine ends the real server, so that test comes last.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fakes import FAKE_VLLM
from tests.fakes.upstream import FakeUpstream
from tests.support.real_vllm import (
    SHARED_KEY,
    SHARED_MAX_MODEL_LEN,
    SharedVllm,
    VllmServer,
    group_members,
    run_cache,
)
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.gateway.upstream import IDLE_TIMEOUT_S

KEY = SHARED_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_MODEL_LEN = SHARED_MAX_MODEL_LEN
POOL_IDLE_S = IDLE_TIMEOUT_S
VALUES = {"object", "type", "role", "owned_by"}  # named kinds, not generated text: compared as values
# Greedy: the real model's output is then the same every run (its first tokens are no end of text).
CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "one two three four five"}],
    "temperature": 0,
}
PROMPT = {"model": "tiny", "prompt": "one two three four five", "temperature": 0}
RESPONSE = {"model": "tiny", "input": "one two three four five", "temperature": 0}
MESSAGE = {**CHAT, "max_tokens": 3}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_datetime",
        "description": "The current date and time.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
STREAMS = {
    "/v1/chat/completions": {**CHAT, "max_tokens": 3, "stream": True},
    "/v1/completions": {**PROMPT, "max_tokens": 3, "stream": True},
    "/v1/responses": {**RESPONSE, "max_output_tokens": 3, "stream": True},
    "/v1/messages": {**MESSAGE, "stream": True},
}


# --- the three servers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(shared_vllm: SharedVllm) -> VllmServer:
    """The shared real vLLM (tests/support/real_vllm.py), started again if a test ended it. Its
    tool parser is the one the chat's deployments use (docs/chat.md, Tools): it streams the forced
    call."""
    return shared_vllm.get()


def test_the_real_vllm_runs_as_one_process_group_and_answers(real: VllmServer) -> None:
    """What the other real-vLLM tests stand on: the whole tree shares the leader's group (one killpg
    reaches EngineCore and Worker too), the model-class inspection is kept in the run's cache (every
    later start reads it rather than inspect again in a subprocess: tests/support/real_vllm.py,
    `run_cache`), and the tiny model answers."""
    names = [name for _, name in group_members(real.pgid)]
    assert any(name.startswith("VLLM::EngineCor") for name in names), names
    assert "VLLM::Worker" in names, names
    assert list((run_cache() / "modelinfos").glob("*LlamaForCausalLM.json")), real.log()[-2000:]
    r = httpx.post(
        real.base_url + "/v1/chat/completions",
        json={**CHAT, "max_tokens": 8},
        headers=AUTH,
        timeout=60,
        trust_env=False,
    )
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["model"] == "tiny" and reply["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(reply["choices"][0]["message"]["content"], str)
    assert reply["usage"]["completion_tokens"] >= 1


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream(api_key=KEY).start()
    fake.max_model_len = MAX_MODEL_LEN
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


@dataclass
class FakeVllm:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


@contextlib.contextmanager
def fake_vllm(model: Path, scratch: Path, **knobs: str) -> Iterator[FakeVllm]:
    """tests/fakes/vllm.py serving `model` as the real one is served here, healthy."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_VLLM_", "VLLM_"))}
    env |= {"FAKE_VLLM_LOAD_SECONDS": "0", "FAKE_VLLM_MAX_LIFETIME": "300"}
    env |= {f"FAKE_VLLM_{name.upper()}": value for name, value in knobs.items()}
    argv = [sys.executable, str(FAKE_VLLM), "serve", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", "tiny", "--max-model-len", str(MAX_MODEL_LEN)]
    argv += ["--api-key", KEY]
    scratch.mkdir(parents=True, exist_ok=True)
    log = scratch / f"fake-vllm-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    fake = FakeVllm(proc, f"http://127.0.0.1:{port}", log)
    try:
        eventually(lambda: proc.poll() is not None or "Uvicorn running" in log.read_text(), timeout=20)
        assert proc.poll() is None, log.read_text()
        yield fake
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def fake_bin(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeVllm]:
    with fake_vllm(tiny_models[0], tmp_path_factory.mktemp("fake-vllm")) as fake:
        yield fake


@pytest.fixture(scope="module")
def targets(real: VllmServer, upstream: FakeUpstream, fake_bin: FakeVllm) -> dict[str, str]:
    """Origins by name, the real one first."""
    return {"vllm": real.base_url, "fakeupstream": upstream.url, "fake_vllm": fake_bin.url}


# --- raw HTTP: what each server sends, byte for byte -------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes  # de-chunked
    clean: bool  # the body ended as framed (its last chunk, or its Content-Length), not cut

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[tuple[str | None, str]]:
        """(event name, data) of each SSE event."""
        found = []
        for block in self.body.decode("utf-8", "replace").split("\n\n"):
            lines = [line for line in block.split("\n") if line]
            if lines:
                name = next((line[7:] for line in lines if line.startswith("event: ")), None)
                found.append((name, "\n".join(line[6:] for line in lines if line.startswith("data: "))))
        return found


class Exchange:
    """One request on its own connection (`Connection: close`), its answer read as it comes."""

    def __init__(
        self,
        url: str,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        origin = urlsplit(url)
        self.sock = socket.create_connection((origin.hostname, origin.port), timeout=10)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {origin.netloc}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        self.raw = b""
        self.eof = False

    def read_until(self, done: Callable[[bytes], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.raw):
            assert not self.eof, f"the answer ended first: {self.raw[-600:]!r}"
            assert time.monotonic() < deadline, f"not within {timeout} s: {self.raw[-600:]!r}"
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            with contextlib.suppress(TimeoutError):
                chunk = self.sock.recv(65536)
                self.raw += chunk
                self.eof = not chunk

    def answer(self, timeout: float = 60) -> Answer:
        """Everything, up to the server's close."""
        try:
            self.read_until(lambda raw: self.eof, timeout)
        except ConnectionResetError:
            pass
        self.sock.close()
        head, _, rest = self.raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body, clean = _dechunk(rest)
        else:
            length = int(headers.get("content-length", len(rest)))
            body, clean = rest[:length], len(rest) >= length
        return Answer(int(status_line.split()[1]), headers, body, clean)


class DrainedExchange(Exchange):
    """An `Exchange` whose answer a thread reads as it arrives, so that nothing waits unread in the
    socket while the test does other things: a server that exits may reset the connection, and a
    reset discards what the client had not read yet."""

    READ_TIMEOUT_S = 120.0  # a quiet stream (its engine stopped) is not a dead one

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arrived = threading.Condition()
        self.sock.settimeout(self.READ_TIMEOUT_S)
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        chunk = b"-"
        while chunk:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            with self._arrived:
                self.raw += chunk
                self.eof = not chunk
                self._arrived.notify_all()

    def read_until(self, done: Callable[[bytes], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not done(self.raw):
                assert not self.eof, f"the answer ended first: {self.raw[-600:]!r}"
                left = deadline - time.monotonic()
                assert left > 0, f"not within {timeout} s: {self.raw[-600:]!r}"
                self._arrived.wait(left)


def _dechunk(raw: bytes) -> tuple[bytes, bool]:
    body, pos = b"", 0
    while True:
        end = raw.find(b"\r\n", pos)
        if end < 0:
            return body, False
        size = int(raw[pos:end].split(b";")[0], 16)
        if size == 0:
            return body, True
        if len(raw) < end + 2 + size + 2:
            return body + raw[end + 2 : end + 2 + size], False
        body += raw[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def request(url: str, method: str, path: str, payload: Any = None, **options: Any) -> Answer:
    """`payload` as JSON (bytes: as is); `auth=False` sends no key; `headers` replace the defaults."""
    headers = dict(AUTH) if options.get("auth", True) else {}
    body = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload).encode()
    if payload is not None:
        headers["Content-Type"] = "application/json"
    headers |= options.get("headers", {})
    return Exchange(url, method, path, body, {k: v for k, v in headers.items() if v is not None}).answer()


def each(targets: dict[str, str], ask: Callable[[str], Any]) -> dict[str, Any]:
    return {name: ask(url) for name, url in targets.items()}


def assert_fakes_answer_like_vllm(answers: dict[str, Any]) -> None:
    real = answers["vllm"]
    assert answers == dict.fromkeys(answers, real), "the fakes differ from vLLM 0.32 (see the diff)"


# --- shapes -----------------------------------------------------------------------------------


def shape(value: Any, key: str | None = None) -> Any:
    """Keys in order and value types; the values of VALUES keys."""
    if isinstance(value, dict):
        return [[k, shape(v, k)] for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    if key in VALUES and isinstance(value, str):
        return value
    return type(value).__name__


def kinds(answer: Answer) -> list[Any]:
    """The events as (name, shape), consecutive repeats as one."""
    seen: list[Any] = []
    for name, data in answer.events():
        kind = [name, data if data == "[DONE]" else shape(json.loads(data))]
        if not seen or seen[-1] != kind:
            seen.append(kind)
    return seen


def streamed(url: str, path: str, body: dict[str, Any]) -> tuple[int, str, list[Any], bool]:
    answer = request(url, "POST", path, body)
    return answer.status, answer.headers.get("content-type", ""), kinds(answer), answer.clean


# --- what a client sends ------------------------------------------------------------------------


def test_a_request_without_a_model_is_served_by_the_default_model(targets: dict[str, str]) -> None:
    def ask(url: str) -> list[Any]:
        answers = [
            request(url, "POST", "/v1/chat/completions", {**CHAT, "model": None, "max_tokens": 2}),
            request(
                url,
                "POST",
                "/v1/completions",
                {k: v for k, v in PROMPT.items() if k != "model"} | {"max_tokens": 2},
            ),
            request(url, "POST", "/v1/responses", {**RESPONSE, "model": "", "max_output_tokens": 2}),
        ]
        return [(a.status, a.json()["model"], shape(a.json())) for a in answers]

    answers = each(targets, ask)
    assert [(status, model) for status, model, _ in answers["vllm"]] == [(200, "tiny")] * 3
    assert_fakes_answer_like_vllm(answers)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "model": "nope"}),
        ("/v1/chat/completions", {**CHAT, "model": "nope", "stream": True}),
        ("/v1/completions", {**PROMPT, "model": "nope"}),
        ("/v1/responses", {**RESPONSE, "model": "nope"}),
        ("/v1/messages", {**MESSAGE, "model": "nope"}),
        ("/v1/messages/count_tokens", {"model": "nope", "messages": CHAT["messages"]}),
    ],
    ids=["chat", "chat-stream", "completions", "responses", "messages", "count_tokens"],
)
def test_an_unknown_model_is_404_naming_the_served_ones(
    targets: dict[str, str], path: str, body: dict[str, Any]
) -> None:
    def ask(url: str) -> tuple[int, str, Any]:
        answer = request(url, "POST", path, body)
        return answer.status, answer.headers["content-type"], answer.json()

    answers = each(targets, ask)
    assert answers["vllm"][0] == 404
    assert "The model `nope` does not exist. Valid aliases: tiny." in json.dumps(answers["vllm"][2])
    assert_fakes_answer_like_vllm(answers)


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/v1/chat/completions", b"{", "application/json"),
        ("/v1/chat/completions", b"[1]", "application/json"),
        ("/v1/chat/completions", b"", "application/json"),
        ("/v1/chat/completions", b'{"model":"\xff"}', "application/json"),
        ("/v1/chat/completions", json.dumps(CHAT).encode(), None),
        ("/v1/chat/completions", json.dumps(CHAT).encode(), "text/plain"),
        ("/v1/chat/completions", b'{"model":"tiny"}', "application/json"),
        ("/v1/chat/completions", json.dumps({**CHAT, "messages": []}).encode(), "application/json"),
        ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": 100_000}).encode(), "application/json"),
        ("/v1/completions", b'{"model":"tiny"}', "application/json"),
        ("/v1/messages", b"{", "application/json"),
        ("/v1/messages", b"{}", "application/json"),
        ("/v1/messages", json.dumps(CHAT).encode(), "application/json"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "empty",
        "not-utf-8",
        "no-content-type",
        "text-plain",
        "no-messages",
        "empty-messages",
        "max-tokens-too-big",
        "no-prompt",
        "messages-not-json",
        "messages-empty-object",
        "messages-no-max-tokens",
    ],
)
def test_a_bad_request_is_400_with_vllms_error_body(
    targets: dict[str, str], path: str, body: bytes, content_type: str | None
) -> None:
    def ask(url: str) -> tuple[int, Any]:
        answer = request(url, "POST", path, body, headers={"Content-Type": content_type})
        return answer.status, answer.json()

    answers = each(targets, ask)
    assert answers["vllm"][0] == 400
    assert_fakes_answer_like_vllm(answers)


def test_with_a_key_the_first_bearer_must_match_on_every_v1_path(targets: dict[str, str]) -> None:
    def ask(url: str) -> list[tuple[int, Any]]:
        answers = [
            request(url, "GET", "/v1/models", auth=False),
            request(url, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"}),
            request(url, "GET", "/v1/models", headers={"Authorization": f"bearer {KEY}"}),
            request(url, "POST", "/v1/chat/completions", b"{", auth=False),
            request(url, "POST", "/v1/messages", MESSAGE, auth=False, headers={"X-Api-Key": KEY}),
            request(url, "GET", "/v1/no-such-route", auth=False),
            request(url, "GET", "/health", auth=False),
        ]
        return [(a.status, a.json() if a.status == 401 else None) for a in answers]

    answers = each(targets, ask)
    assert [status for status, _ in answers["vllm"]] == [401, 401, 200, 401, 401, 401, 200]
    assert answers["vllm"][0][1] == {"error": "Unauthorized"}
    assert_fakes_answer_like_vllm(answers)


def test_an_unknown_route_is_404_and_a_wrong_method_405(targets: dict[str, str]) -> None:
    def ask(url: str) -> list[tuple[int, str | None, Any]]:
        answers = [
            request(url, "POST", "/v1/no-such-route", {}),
            request(url, "GET", "/v1/chat/completions"),
            request(url, "POST", "/v1/models", {}),
        ]
        return [(a.status, a.headers.get("allow"), a.json()) for a in answers]

    answers = each(targets, ask)
    assert [status for status, _, _ in answers["vllm"]] == [404, 405, 405]
    assert_fakes_answer_like_vllm(answers)


# --- what the server answers ------------------------------------------------------------------


def test_plain_answers_have_the_same_shapes(targets: dict[str, str]) -> None:
    def ask(url: str) -> list[Any]:
        answers = [
            request(url, "GET", "/v1/models"),
            request(url, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 3}),
            request(url, "POST", "/v1/completions", {**PROMPT, "max_tokens": 3}),
            request(url, "POST", "/v1/responses", {**RESPONSE, "max_output_tokens": 3}),
            request(url, "POST", "/v1/messages", MESSAGE),
            request(
                url, "POST", "/v1/messages/count_tokens", {"model": "tiny", "messages": CHAT["messages"]}
            ),
        ]
        return [(a.status, a.headers["content-type"], shape(a.json())) for a in answers]

    answers = each(targets, ask)
    assert {status for status, _, _ in answers["vllm"]} == {200}
    assert_fakes_answer_like_vllm(answers)


@pytest.mark.parametrize("include_usage", [False, True], ids=["plain", "include-usage"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_streamed_chunks_have_the_same_shapes_and_order(
    targets: dict[str, str], path: str, include_usage: bool
) -> None:
    body = {**STREAMS[path], "stream_options": {"include_usage": include_usage}}
    answers = each(targets, lambda url: streamed(url, path, body))
    status, content_type, events, clean = answers["vllm"]
    assert (status, content_type, clean) == (200, "text/event-stream; charset=utf-8", True)
    assert events[-1] == [None, "[DONE]"]
    assert_fakes_answer_like_vllm(answers)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_events_with_names_come_in_the_same_order_with_the_same_shapes(
    targets: dict[str, str], path: str
) -> None:
    answers = each(targets, lambda url: streamed(url, path, STREAMS[path]))
    names = [name for name, _ in answers["vllm"][2]]
    assert names[0] in ("response.created", "message_start") and None not in names  # an event: line each
    assert_fakes_answer_like_vllm(answers)


@pytest.mark.parametrize("include_usage", [False, True], ids=["plain", "include-usage"])
def test_a_tool_call_streams_in_the_same_chunks(targets: dict[str, str], include_usage: bool) -> None:
    """The chunks the chat's tool loop folds (static/js/chat/stream.js): `tool_choice: "required"`
    makes the real tiny model call the tool through the hermes parser (its arguments are noise, cut
    by max_tokens: only shapes are compared). The fake `vllm` executable serves no tool calls."""
    body = {
        **CHAT,
        "max_tokens": 60,  # the parser's first delta needs the call's name: ~45 characters in
        "stream": True,
        "stream_options": {"include_usage": include_usage},
        "tools": [TOOL],
        "tool_choice": "required",
    }
    chat = "/v1/chat/completions"
    answers = {name: streamed(url, chat, body) for name, url in targets.items() if name != "fake_vllm"}
    status, _, events, clean = answers["vllm"]
    assert (status, clean) == (200, True)
    deltas = [shape_of for _, shape_of in events if shape_of != "[DONE]"]
    assert any("tool_calls" in json.dumps(d) for d in deltas), events  # the real model did call it
    assert_fakes_answer_like_vllm(answers)


def test_an_idle_keep_alive_connection_is_closed_after_the_pool_lets_go_of_it(
    targets: dict[str, str],
) -> None:
    """uvicorn closes a connection 5 s after its last response; the gateway's pool keeps an idle one
    at most POOL_IDLE_S (4 s), so it never sends a request on a connection about to be closed. Order,
    not milliseconds: each connection is seen closed (EOF), and not within POOL_IDLE_S of the moment
    its request was sent (the answer came after that, so a slow machine only makes it later)."""
    sockets = {}
    for name, url in targets.items():
        origin = urlsplit(url)
        sock = socket.create_connection((origin.hostname, origin.port), timeout=10)
        sent = time.monotonic()
        sock.sendall(
            f"GET /v1/models HTTP/1.1\r\nHost: {origin.netloc}\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
        )
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _length(raw):
            raw += sock.recv(65536)
        sockets[sock] = (name, sent)
    closed_after: dict[str, float] = {}
    deadline = time.monotonic() + 30  # far beyond 5 s: only a server that never closes fails here
    while len(closed_after) < len(targets) and time.monotonic() < deadline:
        readable, _, _ = select.select(list(sockets), [], [], 1.0)
        for sock in readable:
            name, sent = sockets.pop(sock)
            assert sock.recv(1) == b"", f"{name} sent bytes on an idle connection"
            closed_after[name] = time.monotonic() - sent
            sock.close()
    assert set(closed_after) == set(targets), f"never closed: {set(targets) - set(closed_after)}"
    assert all(after >= POOL_IDLE_S for after in closed_after.values()), closed_after


def _length(raw: bytes) -> int:
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    return int(head.split("content-length:")[1].split("\r\n")[0]) if "content-length:" in head else 0


# --- the engine dies under a stream (last: the real server exits) -------------------------------


def _tail(answer: Answer, normal: list[Any]) -> list[tuple[str | None, Any]]:
    """The events after the leading ones that a normal stream also has: what the death added."""
    events = answer.events()
    i = 0
    while i < len(events) and [events[i][0], _kind_of(events[i][1])] in normal:
        i += 1
    return [(name, data if data == "[DONE]" else json.loads(data)) for name, data in events[i:]]


def _kind_of(data: str) -> Any:
    return data if data == "[DONE]" else shape(json.loads(data))


DEATH = {
    "/v1/chat/completions": {**CHAT, "max_tokens": 2000, "ignore_eos": True, "stream": True},
    "/v1/completions": {**PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True},
    "/v1/responses": {**RESPONSE, "max_output_tokens": 2000, "ignore_eos": True, "stream": True},
    "/v1/messages": {**MESSAGE, "max_tokens": 2000, "stream": True},
}


def test_the_engine_dying_mid_stream_is_answered_in_band_and_the_gateway_says_when_it_is_cut(
    targets: dict[str, str],
    real: VllmServer,
    upstream: FakeUpstream,
    tiny_models: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """The EngineCore of the real one is killed while streams are open: the chat stream after its
    first pieces, the others stopped (SIGSTOP) before any piece. Each answer ends the way vLLM ends
    it (in-band error and a clean end, or a cut for /v1/responses); the fakes' `engine_dies` knobs end
    theirs the same way. Through the gateway, the cut /v1/responses stream ends with its error event."""
    normal = {path: each(targets, lambda url, p=path: streamed(url, p, STREAMS[p])[2]) for path in DEATH}
    gateway = start_server(
        tmp_path / "data", "--upstream", real.base_url, env={"VLLM_USE_UPSTREAM_API_KEY": KEY}
    )
    try:
        _, secret = gateway.create_key("inference")
        real_answers, relayed = _kill_the_real_engine(real, gateway, secret)
    finally:
        gateway.stop()
    assert real.proc.wait(60) == 0  # the real server shuts down after its engine, exit status 0

    upstream.engine_dies = True
    fake_answers = {"fakeupstream": {p: _death_stream(upstream.url, p) for p in DEATH}, "fake_vllm": {}}
    for path in DEATH:  # each fake_vllm exits after its engine died: one start per stream
        with fake_vllm(tiny_models[0], tmp_path / "fakes", engine_dies="1", token_seconds="0") as fake:
            fake_answers["fake_vllm"][path] = _death_stream(fake.url, path)
            assert fake.proc.wait(10) == 0

    ends = {
        name: {path: (a.status, _tail(a, normal[path][name]), a.clean) for path, a in answers.items()}
        for name, answers in {"vllm": real_answers, **fake_answers}.items()
    }
    chat = real_answers["/v1/chat/completions"]
    assert ends["vllm"]["/v1/chat/completions"][1], f"vLLM's chat answer: {chat.clean} {chat.body[-1500:]!r}"
    chat_error, done = ends["vllm"]["/v1/chat/completions"][1]
    assert chat_error[1]["error"]["type"] == "InternalServerError" and done == (None, "[DONE]")
    assert ends["vllm"]["/v1/responses"] == (200, [], False)  # cut, not a clean end
    assert_fakes_answer_like_vllm(ends)

    assert relayed.status == 200 and not relayed.clean
    events = relayed.events()
    assert [name for name, _ in events[:2]] == ["response.created", "response.in_progress"]
    assert json.loads(events[-1][1]) == {
        "error": {
            "message": "upstream connection lost",
            "type": "api_error",
            "param": None,
            "code": "upstream_unavailable",
        }
    }


def _death_stream(url: str, path: str) -> Answer:
    return request(url, "POST", path, DEATH[path])


def _yield_to_everyone(pid: int) -> None:
    """Give every thread of `pid` the lowest CPU priority (nice 19). The engine writes the 2000
    tokens in about a second; on a loaded machine the API server and this test, which must show and
    see the first pieces before the engine is stopped, could wait longer than that for a core, and
    the generation would end unseen (it did in full runs, and in 3 of 4 runs beside four busy
    loops; at nice 19, 8 of 8 passed beside four and eight). At nice 19 the engine runs only when
    they do not want the core, so it cannot outrun them. Threads started later inherit the value.
    This test kills the engine, so nothing after it runs slower."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), 19)


def _kill_the_real_engine(real: VllmServer, gateway: Server, secret: str) -> tuple[dict[str, Answer], Answer]:
    (engine,) = [pid for pid, name in group_members(real.pgid) if name == "VLLM::EngineCor"]
    _yield_to_everyone(engine)
    body = {path: json.dumps(b).encode() for path, b in DEATH.items()}
    json_auth = {**AUTH, "Content-Type": "application/json"}
    chat = DrainedExchange(
        real.base_url, "POST", "/v1/chat/completions", body["/v1/chat/completions"], json_auth
    )
    chat.read_until(lambda raw: raw.count(b"data: ") >= 3)  # the role chunk and two pieces
    os.kill(engine, signal.SIGSTOP)  # no piece more from here: the others start before any piece
    try:
        others = {
            path: Exchange(real.base_url, "POST", path, body[path], json_auth)
            for path in ("/v1/completions", "/v1/responses", "/v1/messages")
        }
        gateway_auth = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        relayed = Exchange(gateway.base_url, "POST", "/v1/responses", body["/v1/responses"], gateway_auth)
        for exchange in others.values():
            exchange.read_until(lambda raw: b"\r\n\r\n" in raw)  # the answer started: status and headers
        # /v1/responses sends its first two events before the engine's first piece: relayed already.
        relayed.read_until(lambda raw: b"response.in_progress" in raw)
    finally:
        os.kill(engine, signal.SIGKILL)
    answers = {"/v1/chat/completions": chat.answer(), **{p: e.answer() for p, e in others.items()}}
    return answers, relayed.answer()

"""The inference gateway `/v1` (docs/gateway.md): SDKs end to end, streaming, cancellation, auth, limits,
audit.

Everything runs against `tests/fakes/upstream.py`, a fake vLLM that records what it receives, so each
test can say what reached the upstream (and that nothing did, for a refused request).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakes.upstream import FakeUpstream, Received, running
from tests.support.server import Server, eventually, start_server

try:  # anthropic ≥ 2 is built on httpx2 and refuses httpx clients
    import httpx2 as anthropic_httpx
except ImportError:  # pragma: no cover - older anthropic SDKs
    anthropic_httpx = httpx  # type: ignore[no-redef]

UPSTREAM_KEY = "upstream-key-0123456789abcdef"
MIB = 1024 * 1024
LIMIT = 16 * MIB
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}]}
MESSAGE = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello"}]}
CACHE_HEADERS = {
    "Cache-Control": "public, max-age=3600",
    "Pragma": "cache",
    "Expires": "Thu, 01 Jan 2099 00:00:00 GMT",
}


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running(api_key=UPSTREAM_KEY)


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


def start_gateway(data_dir: Path, upstream: FakeUpstream, *flags: str) -> Server:
    return start_server(
        data_dir,
        "--upstream",
        upstream.url,
        "--model-aliases",
        "fast=tiny",
        *flags,
        env={"VLLM_USE_UPSTREAM_API_KEY": UPSTREAM_KEY},
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    srv = start_gateway(tmp_path_factory.mktemp("gateway") / "data", upstream)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def key(gw: Server, upstream: FakeUpstream) -> tuple[str, str]:
    """An `inference` key, already verified once (the first use of a key pays for scrypt)."""
    key_id, secret = gw.create_key("inference")
    assert post(gw, "/v1/chat/completions", secret, CHAT).status_code == 200
    upstream.reset()
    return key_id, secret


def post(
    gw: Server,
    path: str,
    secret: str | None,
    body: Any = None,
    *,
    headers: dict[str, Any] | None = None,
    content: Any = None,
) -> httpx.Response:
    hdrs = dict(headers or {})
    if secret is not None:
        hdrs["Authorization"] = f"Bearer {secret}"
    return gw.client.post(gw.base_url + path, json=body, content=content, headers=hdrs)


def raw_request(
    gw: Server, method: str, path: str, headers: list[tuple[str, str | bytes]], body: bytes = b""
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request with exactly these header lines (repeats included), over http.client."""
    conn = http.client.HTTPConnection(gw.base_url.removeprefix("http://"), timeout=30)
    try:
        has_host = any(name.lower() == "host" for name, _ in headers)
        conn.putrequest(method, path, skip_host=has_host, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if method == "POST":
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if method == "POST" else None)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def assert_forwarded_as_ours(received: list[Received]) -> None:
    """What reached the upstream: our upstream key as the only credential, no client credential."""
    assert received, "nothing reached the upstream"
    for r in received:
        assert r.header_list("Authorization") == [f"Bearer {UPSTREAM_KEY}"], r.headers
        assert "x-api-key" not in r.header_names(), r.headers


def recent(gw: Server) -> list[dict[str, Any]]:
    r = gw.fetch("/api/requests/recent?limit=1000")
    assert r.status_code == 200, r.text
    return r.json()["requests"]


def audit_of(gw: Server, request_id: str) -> list[dict[str, Any]]:
    return [rec for rec in recent(gw) if rec["request_id"] == request_id]


def openai_client(gw: Server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=secret,
        base_url=gw.base_url + "/v1",
        http_client=httpx.Client(trust_env=False, timeout=30),
        max_retries=0,
    )


@pytest.fixture
def no_sdk_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)


# --- the official SDKs ---------------------------------------------------------------------------


def test_openai_sdk_chat_completions_stream_and_not(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    client = openai_client(gw, key[1])
    reply = client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "Say hello"}])
    assert reply.choices[0].message.content == upstream.reply
    assert reply.model == "tiny"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Say hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == upstream.reply
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    received = upstream.requests
    assert [r.path for r in received] == ["/v1/chat/completions"] * 2
    assert [r.json()["model"] for r in received] == ["tiny", "tiny"]
    assert_forwarded_as_ours(received)


def test_openai_sdk_completions_stream_and_not(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    client = openai_client(gw, key[1])
    done = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8)
    assert done.choices[0].text == upstream.reply
    streamed = list(
        client.completions.create(model="fast", prompt="Once upon a time", max_tokens=8, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed) == upstream.reply
    assert [r.path for r in upstream.requests] == ["/v1/completions"] * 2
    assert_forwarded_as_ours(upstream.requests)


def test_openai_sdk_responses_stream_and_not(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    client = openai_client(gw, key[1])
    done = client.responses.create(model="tiny", input="Say hello")
    assert done.output_text == upstream.reply and done.status == "completed"
    events = list(client.responses.create(model="fast", input="Say hello", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == upstream.reply
    assert events[-1].response.output_text == upstream.reply
    assert [r.path for r in upstream.requests] == ["/v1/responses"] * 2
    assert_forwarded_as_ours(upstream.requests)


def test_openai_sdk_embeddings_in_base64_and_float(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    client = openai_client(gw, key[1])
    default = client.embeddings.create(model="tiny", input=["one", "two"])  # the SDK asks for base64
    as_float = client.embeddings.create(model="fast", input=["one", "two"], encoding_format="float")
    assert len(default.data) == 2 and len(default.data[0].embedding) == 8
    assert [round(x, 3) for x in default.data[1].embedding] == as_float.data[1].embedding
    assert [r.json().get("encoding_format") for r in upstream.requests] == ["base64", "float"]
    assert_forwarded_as_ours(upstream.requests)


def test_openai_sdk_models_lists_the_upstream_models_and_the_aliases(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    models = openai_client(gw, key[1]).models.list()
    assert [m.id for m in models.data] == ["tiny", "fast"]
    assert [(r.method, r.path) for r in upstream.requests] == [("GET", "/v1/models")]
    assert_forwarded_as_ours(upstream.requests)


def test_async_openai_sdk_covers_every_openai_endpoint(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            client = openai.AsyncOpenAI(
                api_key=key[1], base_url=gw.base_url + "/v1", http_client=http, max_retries=0
            )
            chat = await client.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hi"}]
            )
            assert chat.choices[0].message.content == upstream.reply
            stream = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert (
                "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                == upstream.reply
            )
            completion = await client.completions.create(model="tiny", prompt="hi", max_tokens=8)
            assert completion.choices[0].text == upstream.reply
            stream = await client.completions.create(model="tiny", prompt="hi", max_tokens=8, stream=True)
            assert "".join([c.choices[0].text async for c in stream]) == upstream.reply
            response = await client.responses.create(model="tiny", input="hi")
            assert response.output_text == upstream.reply
            stream = await client.responses.create(model="tiny", input="hi", stream=True)
            assert [e.type async for e in stream][-1] == "response.completed"
            embedding = await client.embeddings.create(model="tiny", input="hi")
            assert len(embedding.data[0].embedding) == 8
            models = await client.models.list()
            assert {m.id for m in models.data} == {"tiny", "fast"}

    asyncio.run(main())
    assert len(upstream.requests) == 8
    assert_forwarded_as_ours(upstream.requests)


@pytest.mark.usefixtures("no_sdk_env")
@pytest.mark.parametrize("credential", ["api_key", "auth_token"])
def test_anthropic_sdk_messages_stream_and_not_and_count_tokens(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, credential: str
) -> None:
    sent: list[anthropic_httpx.Headers] = []
    http = anthropic_httpx.Client(
        trust_env=False, timeout=30, event_hooks={"request": [lambda req: sent.append(req.headers)]}
    )
    client = anthropic.Anthropic(
        base_url=gw.base_url, http_client=http, max_retries=0, **{credential: key[1]}
    )
    message = client.messages.create(**MESSAGE)
    assert message.content[0].text == upstream.reply and message.stop_reason == "end_turn"
    with client.messages.stream(**{**MESSAGE, "model": "fast"}) as stream:
        assert stream.get_final_text() == upstream.reply
    streamed = client.messages.create(**MESSAGE, stream=True)
    kinds = [event.type for event in streamed]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    counted = client.messages.count_tokens(
        model="tiny", messages=[{"role": "user", "content": "one two three"}]
    )
    assert counted.input_tokens == 3
    bearer = {"authorization": f"Bearer {key[1]}"}
    # auth_token= is always a Bearer; api_key= is X-Api-Key in older SDKs, a Bearer since anthropic 2.
    allowed = [bearer] if credential == "auth_token" else [bearer, {"x-api-key": key[1]}]
    assert sent and all(
        {k: v for k, v in h.items() if k in ("authorization", "x-api-key")} in allowed for h in sent
    )
    assert [r.path for r in upstream.requests] == ["/v1/messages"] * 3 + ["/v1/messages/count_tokens"]
    assert [r.json()["model"] for r in upstream.requests] == ["tiny"] * 4
    assert_forwarded_as_ours(upstream.requests)


@pytest.mark.usefixtures("no_sdk_env")
def test_anthropic_sdk_with_an_x_api_key_header(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    sent: list[anthropic_httpx.Headers] = []
    http = anthropic_httpx.Client(
        trust_env=False, timeout=30, event_hooks={"request": [lambda req: sent.append(req.headers)]}
    )
    client = anthropic.Anthropic(
        base_url=gw.base_url, http_client=http, max_retries=0, default_headers={"X-Api-Key": key[1]}
    )
    assert client.messages.create(**MESSAGE).content[0].text == upstream.reply
    with client.messages.stream(**MESSAGE) as stream:
        assert stream.get_final_text() == upstream.reply
    assert (
        client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "a b"}]).input_tokens
        == 2
    )
    assert all(h.get("x-api-key") == key[1] and "authorization" not in h for h in sent)
    assert len(upstream.requests) == 3
    assert_forwarded_as_ours(upstream.requests)


def test_client_credentials_and_hop_by_hop_headers_are_not_forwarded(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    status, _, body = raw_request(
        gw,
        "POST",
        "/v1/chat/completions",
        [
            ("Host", "gateway.example"),
            ("Authorization", f"Bearer {key[1]}"),
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Hop-Test"),
            ("X-Hop-Test", "listed in Connection"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Proxy-Authorization", "Basic dXNlcjpwYXNz"),
            ("Proxy-Connection", "keep-alive"),
            ("Cookie", "session=abc"),
            ("X-Forwarded-For", "203.0.113.9"),
            ("Accept-Encoding", "gzip"),
            ("X-Custom", "kept"),
            ("X-Request-ID", "hop-test"),
        ],
        b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}',
    )
    assert status == 200, body
    (received,) = upstream.received("hop-test")
    names = received.header_names()
    for gone in (
        "x-hop-test",
        "keep-alive",
        "te",
        "trailer",
        "proxy-authorization",
        "proxy-connection",
        "cookie",
    ):
        assert gone not in names, (gone, received.headers)
    assert "x-forwarded-for" not in names
    assert received.header_list("Authorization") == [f"Bearer {UPSTREAM_KEY}"]
    assert received.header("Host") == upstream.url.removeprefix("http://")
    assert received.header("Accept-Encoding") == "identity"
    assert received.header("X-Custom") == "kept"


def test_claims_about_the_client_address_are_not_forwarded(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    claims = [
        ("Forwarded", "for=203.0.113.9;proto=https;by=10.0.0.1"),
        ("X-Real-IP", "203.0.113.9"),
        ("X-Forwarded-For", "203.0.113.9"),
        ("X-Forwarded-Host", "admin.example"),
        ("X-Forwarded-Proto", "https"),
    ]
    headers = [("Authorization", f"Bearer {key[1]}"), ("X-Request-ID", "claims"), *claims]
    headers.append(("Content-Type", "application/json"))  # vLLM answers 400 to a body without it
    status, _, body = raw_request(gw, "POST", "/v1/chat/completions", headers, json.dumps(CHAT).encode())
    assert status == 200, body
    (received,) = upstream.received("claims")
    assert not {name.lower() for name, _ in claims} & received.header_names(), received.headers


def test_no_upstream_key_configured_means_no_authorization_upstream(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.api_key = None
    try:
        srv = start_server(tmp_path / "data", "--upstream", upstream.url)
        try:
            _, secret = srv.create_key("inference")
            r = post(srv, "/v1/chat/completions", secret, CHAT, headers={"X-Request-ID": "no-up-key"})
            assert r.status_code == 200, r.text
        finally:
            srv.stop()
    finally:
        upstream.api_key = UPSTREAM_KEY
    (received,) = upstream.received("no-up-key")
    assert "authorization" not in received.header_names()


# --- streaming and cancellation -----------------------------------------------------------------


STREAMS = {
    "/v1/chat/completions": {**CHAT, "stream": True},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "stream": True},
    "/v1/responses": {"model": "tiny", "input": "hi", "stream": True},
    "/v1/messages": {**MESSAGE, "stream": True},
}


@pytest.mark.parametrize("path", list(STREAMS))
def test_first_chunk_reaches_the_client_before_the_upstream_finishes(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    # The upstream sends the rest only once the client has the first chunk: a gateway that held
    # anything back would leave both waiting until the client's read timeout (30 s, shorter than
    # the fake's HOLD_MAX_S), and fail here.
    released = threading.Event()
    upstream.hold_after_first = released
    headers = {"Authorization": f"Bearer {key[1]}"}
    with gw.client.stream("POST", gw.base_url + path, json=STREAMS[path], headers=headers) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        first = next(chunks)
        released.set()
        rest = b"".join(chunks)
    assert first.startswith((b"data: ", b"event: "))
    assert rest and upstream.reply.split()[-1].encode() in rest  # the rest came after the release
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"


def test_an_answer_read_whole_leaves_in_one_piece_and_a_trickling_stream_as_chunks(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    """What the upstream sent whole before the gateway wrote a byte goes out with a Content-Length
    (one write); a stream whose words come apart is relayed chunk by chunk as they arrive."""
    auth = [("Authorization", f"Bearer {key[1]}"), ("Content-Type", "application/json")]
    body = json.dumps(CHAT).encode()
    status, headers, answer = raw_request(gw, "POST", "/v1/chat/completions", auth, body)
    assert status == 200, answer
    assert headers["Content-Length"] == str(len(answer)) and "Transfer-Encoding" not in headers
    assert json.loads(answer)["choices"][0]["message"]["content"] == upstream.reply

    upstream.word_interval = 0.05
    streamed = json.dumps({**json.loads(body), "stream": True}).encode()
    status, headers, answer = raw_request(gw, "POST", "/v1/chat/completions", auth, streamed)
    assert status == 200, answer
    assert headers["Transfer-Encoding"] == "chunked" and "Content-Length" not in headers
    assert answer.endswith(b"data: [DONE]\n\n") and upstream.reply.split()[-1].encode() in answer


def test_a_client_that_stops_reading_a_long_stream_then_gets_every_byte_in_order(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    """The client reads nothing until the upstream's writes stand still: of the 6.5 MB stream, more
    than the gateway's socket to the client holds (4 MiB at most here, tcp_wmem) has to wait, so
    the gateway's writes back up and it stops reading the upstream (handlers/gateway.py, `_piece`);
    once the client reads again, every byte comes, in order."""
    upstream.reply = " ".join(f"w{i}" for i in range(30000))  # 6.5 MB of events
    released = threading.Event()
    upstream.hold_after_first = released  # the rest after the head: relayed piece by piece
    body = json.dumps({**CHAT, "stream": True}).encode()
    host, port = gw.base_url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect((host, int(port)))
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {key[1]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        received = sock.recv(1024)
        released.set()
        stalled = -1
        while upstream.flushed != stalled:  # until the upstream's writes stand still
            stalled = upstream.flushed
            time.sleep(0.3)
        while data := sock.recv(65536):
            received += data
    head_bytes, _, chunked = received.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head_bytes
    events = dechunk(chunked)
    assert events.endswith(b"data: [DONE]\n\n")
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in events.decode().splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == upstream.reply


def dechunk(data: bytes) -> bytes:
    """The payload of a whole chunked body."""
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end], 16)
        if not size:
            return b"".join(out)
        out.append(data[end + 2 : end + 2 + size])
        pos = end + 4 + size


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_client_disconnect_closes_the_upstream_connection_promptly(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    upstream.endless = True
    log_before = len(gw.log())
    request_id = f"cancel-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {key[1]}", "X-Request-ID": request_id}
    with httpx.Client(trust_env=False, timeout=30) as client:
        with client.stream("POST", gw.base_url + path, json=STREAMS[path], headers=headers) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            next(chunks)
            next(chunks)
            closed_at = time.monotonic()
    seen = eventually(lambda: [c for c in upstream.closes if c.request_id == request_id], timeout=5)
    assert seen[0].at - closed_at < 1.0, f"upstream saw the close {seen[0].at - closed_at:.2f} s later"
    (record,) = eventually(lambda: audit_of(gw, request_id), timeout=5)
    assert record["status"] == 499 and record["stream"] is True
    assert "Traceback" not in gw.log()[log_before:]  # a client going away is not a server error
    # The cancelled connection is never handed to the next request.
    upstream.endless = False
    assert post(gw, "/v1/chat/completions", key[1], CHAT).status_code == 200
    cancelled, after = upstream.requests[-2:]
    assert cancelled.header("X-Request-ID") == request_id and after.peer != cancelled.peer


def test_upstream_connections_are_kept_alive_and_reused(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    for i in range(30):
        body = {**CHAT, "stream": i % 2 == 1}
        r = post(gw, "/v1/chat/completions" if i % 3 else "/v1/messages", key[1], body if i % 3 else MESSAGE)
        assert r.status_code == 200
    peers = [r.peer for r in upstream.requests]
    assert len(peers) == 30 and len(set(peers)) == 1, peers


# --- authentication -------------------------------------------------------------------------------


def _headers_for(case: str, credentials: dict[str, str]) -> list[tuple[str, str]]:
    inference = credentials["inference"]
    return {
        "no credential": [],
        "bearer and x-api-key": [("Authorization", f"Bearer {inference}"), ("X-API-Key", inference)],
        "two bearer headers": [
            ("Authorization", f"Bearer {inference}"),
            ("Authorization", f"Bearer {inference}"),
        ],
        "comma-joined bearer": [("Authorization", f"Bearer {inference}, Bearer {inference}")],
        "two x-api-key headers": [("X-API-Key", inference), ("X-API-Key", inference)],
        "comma-joined x-api-key": [("X-API-Key", f"{inference},{inference}")],
        "lower-case scheme": [("Authorization", f"bearer {inference}")],
        "basic scheme": [("Authorization", f"Basic {inference}")],
        "extra space": [("Authorization", f"Bearer  {inference}")],
        "unknown key": [("Authorization", "Bearer vu_" + "A" * 48)],
        "admin.read key": [("Authorization", f"Bearer {credentials['admin.read']}")],
        "admin.read key as x-api-key": [("X-API-Key", credentials["admin.read"])],
        "mcp.admin key": [("Authorization", f"Bearer {credentials['mcp.admin']}")],
        "admin token": [("Authorization", f"Bearer {credentials['admin']}")],
        "admin token as x-api-key": [("X-API-Key", credentials["admin"])],
    }[case]


AUTH_CASES = [
    "no credential",
    "bearer and x-api-key",
    "two bearer headers",
    "comma-joined bearer",
    "two x-api-key headers",
    "comma-joined x-api-key",
    "lower-case scheme",
    "basic scheme",
    "extra space",
    "unknown key",
    "admin.read key",
    "admin.read key as x-api-key",
    "mcp.admin key",
    "admin token",
    "admin token as x-api-key",
]


@pytest.fixture(scope="module")
def credentials(gw: Server, key: tuple[str, str]) -> dict[str, str]:
    return {
        "inference": key[1],
        "admin.read": gw.create_key("admin.read")[1],
        "mcp.admin": gw.create_key("mcp.admin")[1],
        "admin": gw.admin_token or "",
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("case", AUTH_CASES)
def test_refused_credentials_are_401_and_nothing_reaches_the_upstream(
    gw: Server, credentials: dict[str, str], upstream: FakeUpstream, case: str, path: str
) -> None:
    body = MESSAGE if path == "/v1/messages" else CHAT
    headers = [("Content-Type", "application/json"), *_headers_for(case, credentials)]
    status, resp_headers, payload = raw_request(
        gw, "POST", path, headers, httpx.Request("POST", "/", json=body).read()
    )
    assert status == 401, payload
    assert resp_headers["Cache-Control"] == "no-store"
    error = httpx.Response(401, content=payload).json()
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "authentication_error"
        assert isinstance(error["error"]["message"], str)
    else:
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert error["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/models"),
    ],
)
def test_x_api_key_alone_is_refused_outside_messages(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, method: str, path: str
) -> None:
    r = gw.client.request(
        method, gw.base_url + path, json=CHAT if method == "POST" else None, headers={"X-API-Key": key[1]}
    )
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_x_api_key_alone_is_accepted_on_messages(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    r = gw.client.post(gw.base_url + path, json=MESSAGE, headers={"X-API-Key": key[1], "X-Request-ID": "xak"})
    assert r.status_code == 200, r.text
    assert_forwarded_as_ours(upstream.received("xak"))


# --- limits ------------------------------------------------------------------------------------------


def _json_body(size: int) -> bytes:
    head = b'{"model":"fast","messages":[{"role":"user","content":"'
    tail = b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _chunked(body: bytes) -> Iterator[bytes]:
    for i in range(0, len(body), MIB):
        yield body[i : i + MIB]


@pytest.mark.parametrize("transfer", ["content-length", "chunked, no content type"])
def test_a_body_of_exactly_16_mib_reaches_the_upstream(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, transfer: str
) -> None:
    body = _json_body(LIMIT)
    headers = {"X-Request-ID": "big-ok"}
    if transfer == "content-length":
        headers["Content-Type"] = "application/json"
        r = post(gw, "/v1/chat/completions", key[1], headers=headers, content=body)
    else:
        r = post(gw, "/v1/chat/completions", key[1], headers=headers, content=_chunked(body))
    # vLLM refuses a body that is not `application/json` (400) once it has it all: what counts here
    # is that all of it reached the upstream.
    assert r.status_code == (200 if transfer == "content-length" else 400), r.text[:500]
    (received,) = upstream.received("big-ok")
    assert len(received.body) == LIMIT
    assert received.body == body.replace(b'"model":"fast"', b'"model":"tiny"')


@pytest.mark.parametrize(
    ("path", "content_type", "chunked"),
    [
        ("/v1/chat/completions", "application/json", False),
        ("/v1/chat/completions", None, False),
        ("/v1/chat/completions", "text/plain", False),
        ("/v1/chat/completions", "application/json", True),
        ("/v1/embeddings", "multipart/form-data; boundary=x", False),
        ("/v1/messages", "application/json", True),
        ("/v1/messages", None, False),
    ],
)
def test_a_body_of_16_mib_plus_one_byte_is_413_and_nothing_reaches_the_upstream(
    gw: Server,
    key: tuple[str, str],
    upstream: FakeUpstream,
    path: str,
    content_type: str | None,
    chunked: bool,
) -> None:
    body = _json_body(LIMIT + 1)
    headers = {"Content-Type": content_type} if content_type else {}
    r = post(gw, path, key[1], headers=headers, content=_chunked(body) if chunked else body)
    assert r.status_code == 413, r.text[:500]
    assert r.headers["cache-control"] == "no-store"
    if path == "/v1/messages":
        assert r.json()["error"]["type"] == "request_too_large"
    else:
        assert r.json()["error"]["code"] == "payload_too_large"
    assert upstream.requests == []


# --- upstream failures -------------------------------------------------------------------------


def test_upstream_down_is_502_in_the_shape_of_each_surface(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    upstream.down()
    try:
        chat = post(gw, "/v1/chat/completions", key[1], CHAT)
        streamed = post(gw, "/v1/chat/completions", key[1], {**CHAT, "stream": True})
        models = gw.client.get(gw.base_url + "/v1/models", headers={"Authorization": f"Bearer {key[1]}"})
        message = post(gw, "/v1/messages", key[1], MESSAGE)
    finally:
        upstream.up()
    for r in (chat, streamed, models):
        assert r.status_code == 502, r.text
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert error["type"] == "api_error" and error["code"] == "upstream_unavailable"
        assert "choices" not in r.json()
    assert message.status_code == 502
    assert message.json()["type"] == "error" and message.json()["error"]["type"] == "api_error"
    assert post(gw, "/v1/chat/completions", key[1], CHAT).status_code == 200  # and back


def test_a_502_names_neither_the_upstream_nor_its_error_and_the_log_does(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    upstream.down()
    try:
        answers = [
            post(gw, "/v1/chat/completions", key[1], CHAT),
            post(gw, "/v1/messages", key[1], MESSAGE),
            gw.client.get(gw.base_url + "/v1/models", headers={"Authorization": f"Bearer {key[1]}"}),
        ]
    finally:
        upstream.up()
    port = str(upstream.port)
    for r in answers:
        assert r.status_code == 502, r.text
        message = r.json()["error"]["message"]
        assert message == "upstream unavailable", message
        assert port not in r.text and "127.0.0.1" not in r.text and "refused" not in r.text.lower()
    assert f"upstream {upstream.url} is not answering" in gw.log()


@pytest.mark.parametrize(
    ("path", "status", "body", "content_type"),
    [
        (
            "/v1/chat/completions",
            500,
            b'{"error":{"message":"engine died","type":"InternalServerError","code":500}}',
            "application/json",
        ),
        ("/v1/chat/completions", 503, b"Service Unavailable", "text/plain; charset=utf-8"),
        (
            "/v1/messages",
            500,
            b'{"type":"error","error":{"type":"api_error","message":"engine died"}}',
            "application/json",
        ),
        (
            "/v1/completions",
            429,
            b'{"error":{"message":"slow down","type":"RateLimitError","code":429}}',
            "application/json",
        ),
    ],
)
def test_upstream_error_statuses_are_relayed_as_is(
    gw: Server,
    key: tuple[str, str],
    upstream: FakeUpstream,
    path: str,
    status: int,
    body: bytes,
    content_type: str,
) -> None:
    upstream.fail = (status, body, content_type)
    r = post(gw, path, key[1], MESSAGE if path == "/v1/messages" else CHAT)
    assert r.status_code == status
    assert r.content == body
    assert r.headers.get_list("content-type") == [content_type]
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_upstream_hanging_up_without_an_answer_is_502(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    upstream.hang_up = True
    r = post(gw, path, key[1], {**(MESSAGE if path == "/v1/messages" else CHAT), "stream": True})
    assert r.status_code == 502, r.text
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    else:
        assert r.json()["error"]["code"] == "upstream_unavailable"
    assert len(upstream.requests) == 1


def test_upstream_breaking_mid_stream_is_not_passed_off_as_a_complete_stream(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    upstream.break_midway = True
    headers = {"Authorization": f"Bearer {key[1]}"}
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):  # an incomplete chunked body, as the upstream sent it
        with gw.client.stream(
            "POST",
            gw.base_url + "/v1/chat/completions",
            json=STREAMS["/v1/chat/completions"],
            headers=headers,
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                received += chunk
    assert received.startswith(b"data: ") and b"[DONE]" not in received
    assert post(gw, "/v1/chat/completions", key[1], CHAT).status_code == 200  # the gateway is fine


UPSTREAM_LOST = {
    "error": {
        "message": "upstream connection lost",
        "type": "api_error",
        "param": None,
        "code": "upstream_unavailable",
    }
}
ANTHROPIC_UPSTREAM_LOST = {
    "type": "error",
    "error": {"type": "api_error", "message": "upstream connection lost"},
}


def stream_raw(gw: Server, secret: str, path: str) -> tuple[int, bytes, bool]:
    """Status, the bytes of the body, and whether it ended as framed (False: the connection was cut)."""
    received = b""
    with gw.client.stream(
        "POST", gw.base_url + path, json=STREAMS[path], headers={"Authorization": f"Bearer {secret}"}
    ) as r:
        try:
            for chunk in r.iter_raw():
                received += chunk
        except httpx.RemoteProtocolError:
            return r.status_code, received, False
    return r.status_code, received, True


def last_event(received: bytes) -> tuple[str | None, Any]:
    block = [b for b in received.decode().split("\n\n") if b.strip()][-1]
    lines = block.split("\n")
    name = next((line[7:] for line in lines if line.startswith("event: ")), None)
    data = "".join(line[6:] for line in lines if line.startswith("data: "))
    return name, data if data == "[DONE]" else json.loads(data)


@pytest.mark.parametrize("path", list(STREAMS))
def test_a_stream_the_upstream_cuts_ends_with_an_error_event_and_no_clean_end(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    upstream.break_midway = True
    status, received, clean = stream_raw(gw, key[1], path)
    assert status == 200 and not clean
    if path == "/v1/messages":
        assert last_event(received) == ("error", ANTHROPIC_UPSTREAM_LOST)
    else:
        assert last_event(received) == (None, UPSTREAM_LOST)
    for clean_end in (b"[DONE]", b"message_stop", b"response.completed"):
        assert clean_end not in received
    assert upstream.url.removeprefix("http://").encode() not in received


def test_the_sdks_raise_the_error_of_a_stream_the_upstream_cut(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    upstream.break_midway = True
    with pytest.raises(openai.APIError, match="upstream connection lost"):
        for _ in openai_client(gw, key[1]).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass
    http = anthropic_httpx.Client(trust_env=False, timeout=30)
    client = anthropic.Anthropic(base_url=gw.base_url, http_client=http, max_retries=0, api_key=key[1])
    with pytest.raises(anthropic.APIError, match="upstream connection lost"):
        for _ in client.messages.create(**MESSAGE, stream=True):
            pass


@pytest.mark.parametrize("path", list(STREAMS))
def test_an_engine_death_mid_stream_reaches_the_client_as_vllm_tells_it(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream, path: str
) -> None:
    """vLLM answers its engine's death in-band and ends the stream cleanly, except on /v1/responses,
    which it cuts (tests/fakes/shapes.py): relayed as is, and the cut one ends with our error event."""
    upstream.engine_dies = True
    status, received, clean = stream_raw(gw, key[1], path)
    assert status == 200
    name, data = last_event(received)
    if path == "/v1/responses":
        assert (name, data, clean) == (None, UPSTREAM_LOST, False)
    elif path == "/v1/messages":
        assert (name, data["type"], data["error"]["type"], clean) == (
            "error",
            "error",
            "internal_error",
            True,
        )
    else:
        assert (data, clean) == ("[DONE]", True)
        assert b'"type": "InternalServerError"' in received


def test_an_unknown_model_is_the_upstream_404(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    r = post(gw, "/v1/chat/completions", key[1], {**CHAT, "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `nope` does not exist. Valid aliases: tiny."


def test_a_request_without_a_model_is_answered_by_the_upstreams_default_model(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    """vLLM 0.32 serves its first model name when a request names none (tests/test_fakes_match_vllm.py)."""
    r = post(
        gw,
        "/v1/chat/completions",
        key[1],
        {"messages": CHAT["messages"]},
        headers={"X-Request-ID": "no-model"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"
    (received,) = upstream.received("no-model")
    assert "model" not in received.json()  # the gateway names no model of its own
    (record,) = eventually(lambda: audit_of(gw, "no-model"), timeout=5)
    assert record["model"] is None and record["status"] == 200


# --- response headers -----------------------------------------------------------------------------


def _assert_no_store(r: httpx.Response) -> None:
    assert r.headers.get_list("cache-control") == ["no-store"], r.headers
    assert r.headers.get_list("pragma") == ["no-cache"], r.headers
    assert "expires" not in r.headers


def test_every_v1_response_is_no_store_and_upstream_cache_headers_are_replaced(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    upstream.extra_headers = dict(CACHE_HEADERS)
    auth = {"Authorization": f"Bearer {key[1]}"}
    url = gw.base_url
    responses = {
        "json": gw.client.post(url + "/v1/chat/completions", json=CHAT, headers=auth),
        "models": gw.client.get(url + "/v1/models", headers=auth),
        "messages": gw.client.post(url + "/v1/messages", json=MESSAGE, headers=auth),
        "401": gw.client.post(url + "/v1/chat/completions", json=CHAT),
        "404 route": gw.client.post(url + "/v1/nope", json=CHAT, headers=auth),
        "405": gw.client.get(url + "/v1/chat/completions", headers=auth),
        "413": gw.client.post(url + "/v1/embeddings", content=b"x" * (LIMIT + 1), headers=auth),
    }
    with gw.client.stream(
        "POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth
    ) as r:
        r.read()
        _assert_no_store(r)
        assert r.headers.get_list("x-accel-buffering") == ["no"]
    with gw.client.stream("POST", url + "/v1/messages", json={**MESSAGE, "stream": True}, headers=auth) as r:
        r.read()
        _assert_no_store(r)
        assert r.headers.get_list("x-accel-buffering") == ["no"]
    upstream.fail = (500, b'{"error":{"message":"boom"}}', "application/json")
    responses["relayed 500"] = gw.client.post(url + "/v1/chat/completions", json=CHAT, headers=auth)
    upstream.down()
    try:
        responses["502"] = gw.client.post(url + "/v1/chat/completions", json=CHAT, headers=auth)
    finally:
        upstream.up()
    expected = {"json": 200, "models": 200, "messages": 200, "401": 401, "404 route": 404, "405": 405}
    expected |= {"413": 413, "relayed 500": 500, "502": 502}
    assert {name: r.status_code for name, r in responses.items()} == expected
    for r in responses.values():
        _assert_no_store(r)


def test_responses_carry_the_request_id(gw: Server, key: tuple[str, str], upstream: FakeUpstream) -> None:
    ok = post(gw, "/v1/chat/completions", key[1], CHAT, headers={"X-Request-ID": "echo-me"})
    assert ok.headers["x-request-id"] == "echo-me"
    refused = post(gw, "/v1/chat/completions", None, CHAT, headers={"X-Request-ID": "echo-401"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "echo-401"
    generated = post(gw, "/v1/chat/completions", key[1], CHAT)
    assert generated.headers["x-request-id"].startswith("au_")
    assert upstream.requests[-1].header("X-Request-ID") == generated.headers["x-request-id"]


# --- audit ---------------------------------------------------------------------------------------------


def test_request_ids_duplicated_or_invalid_never_overwrite_and_are_replaced(
    gw: Server, key: tuple[str, str], upstream: FakeUpstream
) -> None:
    dup = f"dup-{uuid.uuid4().hex[:8]}"
    exact = "r" * 128
    for _ in range(2):
        assert (
            post(gw, "/v1/chat/completions", key[1], CHAT, headers={"X-Request-ID": dup}).status_code == 200
        )
    assert post(gw, "/v1/chat/completions", key[1], CHAT, headers={"X-Request-ID": exact}).status_code == 200
    assert (
        post(gw, "/v1/chat/completions", key[1], CHAT, headers={"X-Request-ID": "q" * 129}).status_code == 200
    )
    assert (
        post(gw, "/v1/chat/completions", key[1], CHAT, headers={"X-Request-ID": "café".encode()}).status_code
        == 200
    )
    forwarded = [r.header("X-Request-ID") for r in upstream.requests]
    assert forwarded[:3] == [dup, dup, exact]
    replaced = forwarded[3:]
    assert all(rid and rid.startswith("au_") for rid in replaced) and len(set(replaced)) == 2

    def records() -> list[dict[str, Any]]:
        wanted = {dup, exact, *replaced}
        found = [rec for rec in recent(gw) if rec["request_id"] in wanted]
        return found if len(found) == 5 else []

    found = eventually(records, timeout=5)
    assert len([rec for rec in found if rec["request_id"] == dup]) == 2
    assert len({rec["audit_id"] for rec in found}) == 5
    for rid in replaced:
        (rec,) = [rec for rec in found if rec["request_id"] == rid]
        assert rec["audit_id"] == rid


def test_every_gateway_request_is_audited_once(tmp_path: Path, upstream: FakeUpstream) -> None:
    srv = start_gateway(tmp_path / "data", upstream)
    try:
        key_a, secret_a = srv.create_key("inference", name="a")
        key_b, secret_b = srv.create_key("inference", name="b")
        admin_read = srv.create_key("admin.read", name="reader")[1]
        expected: dict[str, tuple[int, str | None, str, bool, str | None]] = {}
        n = 0

        def rid() -> str:
            nonlocal n
            n += 1
            return f"audit-{n:03d}"

        def send(
            path: str,
            secret: str | None,
            body: Any,
            key_id: str | None,
            model: str | None,
            *,
            x_api_key: bool = False,
        ) -> None:
            request_id = rid()
            headers = {"X-Request-ID": request_id}
            if secret and x_api_key:
                headers["X-API-Key"] = secret
            elif secret:
                headers["Authorization"] = f"Bearer {secret}"
            r = srv.client.post(srv.base_url + path, json=body, headers=headers)
            expected[request_id] = (r.status_code, key_id, path, bool(body.get("stream")), model)

        for _ in range(40):  # 200, key a, an alias (recorded as sent)
            send("/v1/chat/completions", secret_a, {**CHAT, "model": "fast"}, key_a, "fast")
        for _ in range(30):  # 200 streamed, key b
            send("/v1/chat/completions", secret_b, {**CHAT, "stream": True}, key_b, "tiny")
        for _ in range(30):  # 200 over X-API-Key, key b
            send("/v1/messages", secret_b, MESSAGE, key_b, "tiny", x_api_key=True)
        for secret in [None, "vu_" + "B" * 48, admin_read, srv.admin_token] * 5:  # 401, no key id, no model
            send("/v1/chat/completions", secret, CHAT, None, None)
        upstream.down()
        try:
            for _ in range(20):  # 502
                send("/v1/completions", secret_a, {"model": "tiny", "prompt": "hi"}, key_a, "tiny")
        finally:
            upstream.up()
        upstream.fail = (500, b'{"error":{"message":"engine died"}}', "application/json")
        for _ in range(40):  # relayed 500
            send("/v1/embeddings", secret_b, {"model": "tiny", "input": "hi"}, key_b, "tiny")
        upstream.fail = None
        upstream.endless = True
        with httpx.Client(trust_env=False, timeout=30) as client:
            for _ in range(20):  # canceled by the client mid-stream
                request_id = rid()
                headers = {"Authorization": f"Bearer {secret_a}", "X-Request-ID": request_id}
                url = srv.base_url + "/v1/chat/completions"
                with client.stream("POST", url, json=STREAMS["/v1/chat/completions"], headers=headers) as r:
                    next(r.iter_raw())
                expected[request_id] = (499, key_a, "/v1/chat/completions", True, "tiny")
        # The last one is over (and audited) before the upstream may end its stream: an answer that
        # ends as its client leaves is a race between 200 and 499 (docs/gateway.md).
        eventually(lambda: any(rec["request_id"] == request_id for rec in recent(srv)), timeout=10)
        upstream.endless = False
        assert len(expected) == 200
        statuses = [status for status, *_ in expected.values()]
        assert {s: statuses.count(s) for s in set(statuses)} == {200: 100, 401: 20, 502: 20, 500: 40, 499: 20}

        # Refused credentials are counted, never audited: they must not evict real records.
        refused = {rid for rid, (status, *_) in expected.items() if status == 401}
        audited = {rid: v for rid, v in expected.items() if rid not in refused}
        eventually(lambda: len(recent(srv)) >= 180, timeout=10)
        time.sleep(0.8)  # another flush: nothing late, nothing twice
        records = recent(srv)
        assert len(records) == 180
        assert len({rec["audit_id"] for rec in records}) == 180
        by_id = {rec["request_id"]: rec for rec in records}
        assert set(by_id) == set(audited)
        failures = srv.fetch("/api/requests/recent").json()["auth_failures"]
        assert failures["by_surface"]["gateway"] == 20
        for request_id, (status, key_id, path, stream, model) in audited.items():
            rec = by_id[request_id]
            got = (rec["status"], rec["key_id"], rec["path"], rec["stream"], rec["model"])
            assert got == (status, key_id, path, stream, model), (request_id, rec)
            assert rec["method"] == "POST"
            assert rec["duration_ms"] > 0
    finally:
        upstream.reset()
        srv.stop()


def test_max_audit_records_keeps_the_newest_and_zero_records_nothing_new(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    data = tmp_path / "data"
    srv = start_gateway(data, upstream, "--max-audit-records", "50")
    try:
        _, secret = srv.create_key("inference")
        for i in range(60):
            r = post(srv, "/v1/chat/completions", secret, CHAT, headers={"X-Request-ID": f"cap-{i:02d}"})
            assert r.status_code == 200
        newest = [f"cap-{i:02d}" for i in range(59, 9, -1)]
        eventually(lambda: [rec["request_id"] for rec in recent(srv)] == newest, timeout=10)
    finally:
        srv.stop()
    srv = start_gateway(data, upstream, "--max-audit-records", "0")
    try:
        for i in range(5):
            r = post(srv, "/v1/chat/completions", secret, CHAT, headers={"X-Request-ID": f"zero-{i}"})
            assert r.status_code == 200
        time.sleep(1.2)  # two flush periods
        assert [rec["request_id"] for rec in recent(srv)] == newest
    finally:
        srv.stop()
    assert len(upstream.requests) == 65


def test_audit_records_still_queued_are_written_at_shutdown(tmp_path: Path, upstream: FakeUpstream) -> None:
    data = tmp_path / "data"
    srv = start_gateway(data, upstream)
    _, secret = srv.create_key("inference")
    for i in range(10):
        r = post(srv, "/v1/chat/completions", secret, CHAT, headers={"X-Request-ID": f"late-{i}"})
        assert r.status_code == 200
    assert srv.stop() == 0  # at once: within the 0.5 s flush period
    srv = start_gateway(data, upstream)
    try:
        assert sorted(rec["request_id"] for rec in recent(srv)) == [f"late-{i}" for i in range(10)]
    finally:
        srv.stop()


def test_prompts_and_outputs_are_never_stored_or_logged(tmp_path: Path, upstream: FakeUpstream) -> None:
    prompt = f"PROMPT-{uuid.uuid4().hex}"
    upstream.reply = f"REPLY-{uuid.uuid4().hex}"
    srv = start_gateway(tmp_path / "data", upstream)
    try:
        _, secret = srv.create_key("inference")
        chat = {"model": "fast", "messages": [{"role": "user", "content": prompt}]}
        sent = [
            post(srv, "/v1/chat/completions", secret, chat),
            post(srv, "/v1/chat/completions", secret, {**chat, "stream": True}),
            post(srv, "/v1/completions", secret, {"model": "tiny", "prompt": prompt, "stream": True}),
            post(srv, "/v1/responses", secret, {"model": "tiny", "input": prompt}),
            post(srv, "/v1/embeddings", secret, {"model": "tiny", "input": prompt}),
            post(srv, "/v1/messages", secret, {**MESSAGE, "messages": [{"role": "user", "content": prompt}]}),
        ]
        assert [r.status_code for r in sent] == [200] * 6
        assert upstream.reply in sent[0].text
        eventually(lambda: len(recent(srv)) == 6, timeout=5)
    finally:
        srv.stop()
    files = [p for p in (tmp_path / "data").iterdir() if p.is_file()]
    assert any(p.name.startswith("vllm-use.db") for p in files)
    for path in files:
        content = path.read_bytes()
        assert prompt.encode() not in content, path
        assert upstream.reply.encode() not in content, path
    assert prompt not in srv.log() and upstream.reply not in srv.log()

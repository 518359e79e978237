"""The gateway's upstream client (vllm_use/gateway/upstream.py): keep-alive reuse, and when it must not reuse.

`UpstreamPool` runs here on its own, inside `asyncio.run`, against `tests/fakes/upstream.py` (a fake
vLLM on Tornado) and against small raw-socket servers that misbehave on purpose (resets, clean
hang-ups after a request, byte-by-byte chunked bodies, HTTP/1.0). Through the gateway, the same
rules are checked in tests/test_gateway.py (keep-alive reuse, a cancelled connection never reused).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, running
from vllm_use.errors import UpstreamError, UpstreamProtocolError
from vllm_use.gateway.upstream import IDLE_TIMEOUT_S, Exchange, UpstreamPool, _Dechunker

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


PIPED = False  # how `drain` reads a body: iterating the exchange, or `Exchange.pipe`


@pytest.fixture(autouse=True, params=["iterated", "piped"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here reads bodies both ways the gateway does: the first pieces by iterating, the
    rest of a stream through `Exchange.pipe` (handlers/gateway.py)."""
    monkeypatch.setitem(globals(), "PIPED", request.param == "piped")


async def drain(exchange: Exchange, on_piece: Callable[[bytes], Any]) -> None:
    """Each piece of the body to `on_piece`, awaiting what it returns before the next."""
    if PIPED:

        def sink(piece: bytes) -> asyncio.Future[None] | None:
            pending = on_piece(piece)
            return None if pending is None else asyncio.ensure_future(pending)

        await exchange.pipe(sink)
        return
    async for piece in exchange:
        if (pending := on_piece(piece)) is not None:
            await pending


def run_with_client(body: Callable[[UpstreamPool], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        client = UpstreamPool(**options)
        try:
            return await body(client)
        finally:
            client.close()

    return asyncio.run(main())


@dataclass
class Answer:
    code: int
    reason: str
    headers: dict[str, str]
    body: bytes  # empty when the pieces went to `on_chunk`


async def fetch(
    client: UpstreamPool,
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    on_chunk: Callable[[bytes], Any] | None = None,
) -> Answer:
    """One exchange through the pool's API: the pieces of the body to `on_chunk` (awaited when it
    returns an awaitable, as the gateway awaits its flush), or gathered into `body`."""
    async with client.stream(method, url, headers, body) as exchange:
        pieces: list[bytes] = []
        await drain(exchange, pieces.append if on_chunk is None else on_chunk)
        return Answer(exchange.status, exchange.reason, dict(exchange.headers), b"".join(pieces))


def chat(url: str, stream: bool = False) -> dict[str, Any]:
    return {
        "url": url + "/v1/chat/completions",
        "method": "POST",
        "body": json.dumps({**CHAT, "stream": stream}).encode(),
        "headers": (("Content-Type", "application/json"),),
    }


def sse_text(raw: bytes) -> str:
    """The assistant text of an OpenAI SSE body."""
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            text += delta.get("content") or ""
    return text


# --- reuse --------------------------------------------------------------------------------------


def test_sequential_requests_share_one_connection(upstream: FakeUpstream) -> None:
    async def body(client: UpstreamPool) -> list[bytes]:
        bodies = []
        for i in range(20):
            chunks: list[bytes] = []
            response = await fetch(
                client, **chat(upstream.url, i % 2 == 1), on_chunk=chunks.append if i % 2 else None
            )
            assert response.code == 200
            bodies.append(b"".join(chunks) if i % 2 else response.body)
        assert client.opened == 1 and client.idle_count() == 1
        return bodies

    bodies = run_with_client(body)
    assert json.loads(bodies[0])["choices"][0]["message"]["content"] == upstream.reply
    assert sse_text(bodies[1]) == upstream.reply
    assert len({r.peer for r in upstream.requests}) == 1
    assert len(upstream.requests) == 20


def test_concurrent_requests_open_one_connection_each_then_reuse_them(upstream: FakeUpstream) -> None:
    async def body(client: UpstreamPool) -> None:
        for _ in range(3):
            responses = await asyncio.gather(
                *(fetch(client, **chat(upstream.url, True), on_chunk=lambda c: None) for _ in range(8))
            )
            assert {r.code for r in responses} == {200}
        assert client.opened == 8 and client.idle_count() == 8

    run_with_client(body)
    assert len({r.peer for r in upstream.requests}) == 8


def test_idle_connections_are_closed_after_the_idle_timeout(upstream: FakeUpstream) -> None:
    async def body(client: UpstreamPool) -> None:
        await fetch(client, **chat(upstream.url))
        assert client.idle_count() == 1
        await asyncio.sleep(0.6)
        assert client.idle_count() == 0
        await fetch(client, **chat(upstream.url))
        assert client.opened == 2

    run_with_client(body, idle_timeout=0.2)


def test_a_request_just_inside_the_idle_limit_reaches_the_upstream_exactly_once(
    upstream: FakeUpstream,
) -> None:
    """Near the edge, at the pool's real limit (4 s) against the fake's uvicorn keep-alive (5 s,
    measured on vLLM by tests/test_fakes_match_vllm.py): reused or not, depending on how late the
    second request leaves on a busy machine, it is answered and reaches the upstream once."""
    idle_timeout = IDLE_TIMEOUT_S

    async def body(client: UpstreamPool) -> None:
        assert (await fetch(client, **chat(upstream.url))).code == 200
        await asyncio.sleep(idle_timeout - 0.5)
        assert (await fetch(client, **chat(upstream.url))).code == 200

    run_with_client(body)
    assert len(upstream.requests) == 2  # neither lost to the upstream's close nor sent twice


def test_an_idle_connection_the_upstream_closed_is_replaced_not_reused(upstream: FakeUpstream) -> None:
    """A pool that kept connections longer than the upstream (here 60 s against uvicorn's 5 s) finds
    the closed one before use (MSG_PEEK sees the FIN) and sends the request once, on a new one."""

    async def body(client: UpstreamPool) -> None:
        assert (await fetch(client, **chat(upstream.url))).code == 200
        first = upstream.requests[0].peer
        deadline = time.monotonic() + upstream.keep_alive + 10
        while not any(end.peer == first and end.by_keep_alive for end in upstream.connection_ends):
            assert time.monotonic() < deadline, "the upstream never closed the idle connection"
            await asyncio.sleep(0.05)
        assert client.idle_count() == 1  # still pooled, closed on the other side
        assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 2

    run_with_client(body, idle_timeout=60)
    first, second = upstream.requests
    assert first.peer != second.peer


def test_at_most_max_idle_connections_are_kept(upstream: FakeUpstream) -> None:
    async def body(client: UpstreamPool) -> None:
        await asyncio.gather(*(fetch(client, **chat(upstream.url)) for _ in range(5)))
        assert client.opened == 5 and client.idle_count() == 2

    run_with_client(body, max_idle=2)


# --- never reused -------------------------------------------------------------------------------


def test_a_cancelled_connection_is_closed_at_once_and_never_reused(upstream: FakeUpstream) -> None:
    upstream.endless = True

    async def body(client: UpstreamPool) -> None:
        exchange = client.stream(**chat(upstream.url, True))

        async def consume() -> None:
            async with exchange:
                await drain(exchange, lambda piece: None)

        first = asyncio.ensure_future(consume())
        while not upstream.requests:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        cancelled_at = time.monotonic()
        exchange.abort()
        with pytest.raises(UpstreamError, match="aborted"):
            await first
        while not upstream.closes:
            await asyncio.sleep(0.01)
        assert upstream.closes[0].at - cancelled_at < 1.0
        upstream.endless = False
        assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 2

    run_with_client(body)
    first, second = upstream.requests
    assert first.peer != second.peer


def test_a_task_cancelled_while_it_pipes_closes_the_connection(upstream: FakeUpstream) -> None:
    upstream.endless = True

    async def body(client: UpstreamPool) -> None:
        pieces: list[bytes] = []

        async def consume() -> None:
            async with client.stream(**chat(upstream.url, True)) as exchange:
                await exchange.pipe(pieces.append)

        task = asyncio.ensure_future(consume())
        while not pieces:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while not upstream.closes:
            await asyncio.sleep(0.01)
        upstream.endless = False
        assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 2

    run_with_client(body)


def test_an_error_while_reading_the_body_drops_the_connection(upstream: FakeUpstream) -> None:
    class Gone(Exception):
        pass

    def refuse(chunk: bytes) -> None:
        raise Gone()

    async def body(client: UpstreamPool) -> None:
        with pytest.raises(Gone):
            await fetch(client, **chat(upstream.url, True), on_chunk=refuse)
        assert client.idle_count() == 0
        assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 2

    run_with_client(body)


def test_backpressure_the_next_piece_waits_for_the_reader(upstream: FakeUpstream) -> None:
    """While the reader is busy with a piece, nothing more is delivered."""

    async def body(client: UpstreamPool) -> None:
        calls: list[float] = []

        async def slow(chunk: bytes) -> None:
            calls.append(time.monotonic())
            await asyncio.sleep(0.05)

        response = await fetch(client, **chat(upstream.url, True), on_chunk=lambda chunk: slow(chunk))
        assert response.code == 200 and len(calls) >= 2
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        assert min(gaps) >= 0.045
        assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 1  # reading was held, and given back: the connection is reused

    upstream.first_chunk_pause = 0.2  # two deliveries at least: the first chunk, then the rest
    run_with_client(body)


def test_a_body_iterated_first_and_piped_after_arrives_whole_and_its_connection_is_reused(
    upstream: FakeUpstream,
) -> None:
    """As the gateway reads a stream: the first piece by iterating, the rest through `pipe`."""

    async def body(client: UpstreamPool) -> None:
        async with client.stream(**chat(upstream.url, True)) as exchange:
            first = await exchange.__anext__()
            assert not exchange.complete  # the rest comes after the pause
            rest: list[bytes] = []
            await exchange.pipe(rest.append)
            assert exchange.complete
        whole = await fetch(client, **chat(upstream.url, True))
        assert sse_text(first + b"".join(rest)) == sse_text(whole.body) == upstream.reply
        assert client.opened == 1

    upstream.first_chunk_pause = 0.2
    run_with_client(body)


def test_an_upstream_that_went_down_and_came_back_is_reached_on_a_new_connection(
    upstream: FakeUpstream,
) -> None:
    async def body(client: UpstreamPool) -> None:
        assert (await fetch(client, **chat(upstream.url))).code == 200
        upstream.down()  # closes the idle connection from the other side
        upstream.up()
        await asyncio.sleep(0.05)
        response = await fetch(client, **chat(upstream.url))
        assert response.code == 200
        assert client.opened == 2

    run_with_client(body)
    assert len(upstream.requests) == 2  # the second request was sent once


def test_a_connection_close_answer_is_not_reused(upstream: FakeUpstream) -> None:
    upstream.extra_headers = {"Connection": "close"}

    async def body(client: UpstreamPool) -> None:
        for _ in range(3):
            assert (await fetch(client, **chat(upstream.url))).code == 200
        assert client.opened == 3 and client.idle_count() == 0

    run_with_client(body)


# --- against raw servers that misbehave ---------------------------------------------------------

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            length = int(line.split(":")[1])
    return head + await reader.readexactly(length)


async def raw_server(script: Script) -> tuple[str, list[bytes], list[int], asyncio.Server]:
    """A loopback server running `script(reader, writer, connection number)` per connection."""
    received: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await script(reader, writer, connections[-1])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def recording(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        original = reader.readuntil

        async def readuntil(separator: bytes = b"\n") -> bytes:
            data = await original(separator)
            if separator == b"\r\n\r\n":
                received.append(data)
            return data

        reader.readuntil = readuntil  # type: ignore[method-assign]
        await handle(reader, writer)

    server = await asyncio.start_server(recording, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", received, connections, server


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a kernel does for a socket closed with unread data."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def test_a_reset_of_a_reused_connection_before_any_answer_is_sent_again_once() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 0:  # the second request on this connection gets a reset, unread
            await reader.readuntil(b"\r\n")
            reset(writer)
            return
        while True:
            await read_request(reader)
            writer.write(OK)
            await writer.drain()

    async def body(client: UpstreamPool) -> None:
        url, _received, connections, server = await raw_server(script)
        async with server:
            assert (await fetch(client, url + "/a")).body == b"ok"
            response = await fetch(client, url + "/b")
            assert response.code == 200 and response.body == b"ok"
            assert connections == [0, 1] and client.opened == 2

    run_with_client(body)


def test_a_clean_hang_up_after_the_request_is_never_sent_again() -> None:
    """The upstream may have started the work: a second generation must not be started behind the client's back."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)  # read the second request, then close without a word
        writer.close()

    async def body(client: UpstreamPool) -> None:
        url, received, connections, server = await raw_server(script)
        async with server:
            assert (await fetch(client, url + "/a")).code == 200
            with pytest.raises(UpstreamError):
                await fetch(client, url + "/b", method="POST", body=b"{}")
            assert connections == [0] and len(received) == 2

    run_with_client(body)


def test_chunked_bodies_written_byte_by_byte_with_extensions_and_trailers_are_decoded() -> None:
    payload = b'data: {"x": 1}\n\n' * 3
    body = b"5;name=value\r\n" + payload[:5] + b"\r\n" + f"{len(payload) - 5:x}\r\n".encode() + payload[5:]
    body += b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(head)
            for i in range(len(body)):
                writer.write(body[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0)

    async def body_(client: UpstreamPool) -> None:
        url, _received, _connections, server = await raw_server(script)
        async with server:
            for _ in range(2):
                chunks: list[bytes] = []
                response = await fetch(client, url + "/s", on_chunk=chunks.append)
                assert response.code == 200 and b"".join(chunks) == payload
            assert client.opened == 1  # a complete chunked body leaves the connection reusable

    run_with_client(body_)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",  # not hex
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",  # no CRLF after data
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ],
    ids=["bad-size", "no-crlf", "negative-length", "bad-status", "bad-header", "not-http"],
)
def test_a_malformed_answer_is_an_error_and_the_connection_is_dropped(answer: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(answer if n == 0 else OK)
        await writer.drain()
        await read_request(reader)
        writer.write(OK)
        await writer.drain()

    async def body(client: UpstreamPool) -> None:
        url, _received, _connections, server = await raw_server(script)
        async with server:
            with pytest.raises(UpstreamProtocolError):
                await fetch(client, url + "/a", on_chunk=lambda chunk: None)
            assert client.idle_count() == 0
            assert (await fetch(client, url + "/b")).body == b"ok"
            assert client.opened == 2

    run_with_client(body)


def test_an_http_1_0_answer_delimited_by_close_is_read_whole_and_not_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async def body(client: UpstreamPool) -> None:
        url, _received, connections, server = await raw_server(script)
        async with server:
            for _ in range(2):
                assert (await fetch(client, url + "/a")).body == b"until the end"
            assert connections == [0, 1] and client.idle_count() == 0

    run_with_client(body)


def test_interim_100_continue_is_skipped_and_error_statuses_are_responses() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy")
            await writer.drain()

    async def body(client: UpstreamPool) -> Answer:
        url, _received, _connections, server = await raw_server(script)
        async with server:
            response = await fetch(client, url + "/a")
            again = await fetch(client, url + "/a")
            assert again.code == 503 and client.opened == 1
            return response

    response = run_with_client(body)
    assert (response.code, response.reason, response.body) == (503, "Busy", b"busy")


def test_a_redirect_is_relayed_as_it_is_never_followed() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n"
            )
            await writer.drain()

    async def body(client: UpstreamPool) -> None:
        url, received, _connections, server = await raw_server(script)
        async with server:
            response = await fetch(client, url + "/v1/models")
            assert response.code == 302 and response.headers["Location"] == "http://169.254.169.254/"
            assert len(received) == 1

    run_with_client(body)


def test_proxy_environment_variables_are_ignored(
    monkeypatch: pytest.MonkeyPatch, upstream: FakeUpstream
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def body(client: UpstreamPool) -> None:
        assert (await fetch(client, **chat(upstream.url))).code == 200  # straight to the upstream

    run_with_client(body)
    assert len(upstream.requests) == 1


def test_a_refused_connection_is_an_upstream_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def body(client: UpstreamPool) -> None:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await fetch(client, f"http://127.0.0.1:{port}/v1/models")

    run_with_client(body)


def test_header_values_with_line_breaks_are_refused_before_anything_is_sent(upstream: FakeUpstream) -> None:
    async def body(client: UpstreamPool) -> None:
        with pytest.raises(ValueError, match="line break"):
            await fetch(client, upstream.url + "/v1/models", headers=(("X-Evil", "a\r\nHost: elsewhere"),))

    run_with_client(body)
    assert upstream.requests == []


# --- the chunked decoder on its own --------------------------------------------------------------


def test_the_dechunker_gives_the_same_payload_whatever_the_split() -> None:
    payload = bytes(range(256)) * 3
    encoded = b"".join(
        f"{n:X}\r\n".encode() + payload[i : i + n] + b"\r\n" for i, n in ((0, 1), (1, 300), (301, 467))
    )
    encoded += b"0\r\n\r\n"
    for split in range(len(encoded) + 1):
        decoder = _Dechunker()
        out = decoder.feed(encoded[:split]) + decoder.feed(encoded[split:])
        assert out == payload and decoder.done


def test_the_dechunkers_fast_path_reads_many_chunks_as_the_general_loop_does() -> None:
    """Whole chunks read at once take the fast path (`_whole_chunks`): leading zeros, both cases
    of hex, an extension in the middle (the general loop's) and the last chunk with a trailer give
    the payload they give fed a byte at a time."""
    events = [f"data: {{'n': {i}}}\n\n".encode() * (1 + i % 3) for i in range(64)]
    sizes = ["%x", "%X", "%04x", "%x;ext=1"]
    encoded = b"".join(
        (sizes[i % 4] % len(event)).encode() + b"\r\n" + event + b"\r\n" for i, event in enumerate(events)
    )
    encoded += b"0\r\nX-Trailer: yes\r\n\r\n"
    whole = _Dechunker()
    assert whole.feed(encoded) == b"".join(events) and whole.done
    one_by_one = _Dechunker()
    assert b"".join(one_by_one.feed(encoded[i : i + 1]) for i in range(len(encoded))) == b"".join(events)
    assert one_by_one.done
    for split in range(0, len(encoded), 5):  # a run of whole chunks, then one cut anywhere
        decoder = _Dechunker()
        assert decoder.feed(encoded[:split]) + decoder.feed(encoded[split:]) == b"".join(events)
        assert decoder.done


@pytest.mark.parametrize("line", [b"+5", b" 5", b"0x5", b"5_0", b"-5", b"5 "])
def test_a_size_line_that_int_would_read_but_http_does_not_allow_is_refused(line: bytes) -> None:
    """`int(…, 16)` reads these; a chunk size is hex digits only (RFC 9112), so they are errors."""
    with pytest.raises(UpstreamProtocolError, match="bad chunk size line"):
        _Dechunker().feed(b"3\r\nabc\r\n" + line + b"\r\nhello\r\n0\r\n\r\n")


def test_the_dechunker_refuses_an_endless_size_line_and_bytes_after_the_end() -> None:
    with pytest.raises(UpstreamProtocolError, match="too long"):
        _Dechunker().feed(b"1" * 2000)
    with pytest.raises(UpstreamProtocolError, match="after the end"):
        _Dechunker().feed(b"0\r\n\r\nextra")
    with pytest.raises(UpstreamProtocolError):
        _Dechunker().feed(b"12345678901234567\r\n")


@pytest.mark.parametrize("when", ["with-the-answer", "while-idle"])
def test_bytes_after_an_answer_make_its_connection_unfit_for_reuse(when: str) -> None:
    """Whatever the upstream sends beyond a response (glued to it, or later, into an idle connection)
    could be read as the next request's answer: that connection is closed, the next goes on a new one."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            if n > 0:
                writer.write(OK)
                await writer.drain()
                continue
            writer.write(
                OK + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray" if when == "with-the-answer" else OK
            )
            await writer.drain()
            if when == "while-idle":
                await asyncio.sleep(0.1)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
                await writer.drain()

    async def body(client: UpstreamPool) -> None:
        url, _received, connections, server = await raw_server(script)
        async with server:
            assert (await fetch(client, url + "/a")).body == b"ok"
            if when == "while-idle":  # until the pool's connection has seen them (they come 0.1 s later)
                deadline = time.monotonic() + 10
                while all(conn.clean for pool in client._idle.values() for conn in pool):
                    assert time.monotonic() < deadline, "the stray bytes never arrived"
                    await asyncio.sleep(0.01)
            assert (await fetch(client, url + "/b")).body == b"ok"
            assert connections == [0, 1] and client.opened == 2

    run_with_client(body)

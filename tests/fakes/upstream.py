"""A small, faithful fake of a vLLM 0.32 OpenAI/Anthropic HTTP server (`vllm serve`), for gateway tests.

It runs a Tornado app on ``127.0.0.1`` in a background thread with its own IOLoop, and records what
it receives: every request (method, path with query, headers in arrival order, raw body bytes,
arrival time, client port), every connection its client closed while it was still answering,
how every connection ended, and how many bytes of answers it has flushed (`flushed`). Every body, SSE event and error comes from `tests/fakes/shapes.py`,
the shapes `tests/fakes/vllm.py` serves too; tests/test_fakes_match_vllm.py compares both with the
real vLLM, request for request. It serves:

    GET  /health                        200, empty
    GET  /v1/models                     {"object":"list","data":[{"id":…,"object":"model",…}]}
    POST /v1/chat/completions           chat.completion, or SSE chat.completion.chunk … data: [DONE]
    POST /v1/completions                text_completion, or SSE chunks … data: [DONE]
    POST /v1/responses                  response JSON, or SSE with ``event: response.created`` …
                                        ``event: response.completed`` lines (no [DONE], like vLLM)
    POST /v1/embeddings                 list of embeddings (``encoding_format`` float or base64); the
                                        real one serves it for a pooling model only
    POST /v1/messages                   Anthropic message, or SSE ``event: message_start`` …
                                        ``event: message_stop``
    POST /v1/messages/count_tokens      {"input_tokens": n, "context_management": {…}}

Like vLLM 0.32 (measured; see tests/fakes/shapes.py): a request without ``model`` is answered by the
first of ``models``; an unknown model is 404 ``The model `x` does not exist. Valid aliases: tiny.``;
a body that is not ``application/json``, not JSON or not an object is 400; with ``api_key`` set
(``vllm serve --api-key``) a request under /v1 whose first Authorization header is not that Bearer is
401 ``{"error": "Unauthorized"}``; an idle keep-alive connection is closed ``keep_alive`` s (5, as
uvicorn does) after its last response. The generated text is ``reply``, one piece (token) per word,
cut to the request's max tokens (finish reason ``length``); a prompt counts one token per word.

Knobs (set from the test thread; read by the handlers as they run):

    first_chunk_pause   seconds between a stream's first chunk and the rest (0: none)
    hold_after_first    a `threading.Event`: a stream sends the rest only once it is set (at most
                        HOLD_MAX_S later), so a test proves that chunk 1 arrived before chunk 2 was
                        sent by setting it when chunk 1 is in (None: no hold)
    word_interval       seconds between the streamed pieces (0: none)
    reasoning           a streamed chat completion first sends this, word by word, as
                        ``delta.reasoning`` (as vLLM 0.32 with a reasoning parser), then the reply as
                        ``delta.content`` ("": no reasoning); a plain one has it in
                        ``message.reasoning``
    endless             streams never end: one more piece every ``endless_interval`` s
    fail                (status, body, content type): every request answers that, as is
    hang_up             close the connection once the request is read, without answering (a crash)
    break_midway        close the connection 0.1 s after a stream's first chunk, mid-body (a crash)
    engine_dies         after a stream's first chunk and one piece, answer as vLLM does when its
                        engine process dies: the in-band error events, then a clean end (chat,
                        completions, messages) or a cut connection (responses). The real server then
                        exits; use down() for that
    keep_alive          seconds an idle keep-alive connection is kept (uvicorn: 5)
    extra_headers       added to every answer (e.g. cache headers the gateway must replace)
    reply               the generated text
    script              chat turns, one per chat completion request in order (then ``reply`` again):
                        a str is that answer's text; a list of ``shapes.ToolCall`` is an answer
                        with those tool calls (streamed as vLLM does with a tool-call parser,
                        finish reason ``tool_calls``). Every request body is recorded, so a test
                        reads what the ``tool`` messages carried. Unscripted, a request whose
                        ``tool_choice`` is "required" or names a function gets that call, as from
                        vLLM (``shapes.forced_tool_call``)
    down() / up()       stop listening (connections refused) / listen again on the same port

``reset()`` clears the records and the knobs. ``stop()`` ends endless streams and closes every open
connection within a second.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import tornado.httpserver
import tornado.httputil
import tornado.netutil
import tornado.web
from tornado.iostream import IOStream, StreamClosedError

from tests.fakes import shapes

MODEL = "tiny"
HOLD_MAX_S = 60.0  # `hold_after_first` never holds a stream longer than this
_MAX_BODY = 64 * 1024 * 1024
_ROUTES = {
    "/health": ("GET",),
    "/v1/models": ("GET",),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/responses": ("POST",),
    "/v1/embeddings": ("POST",),
    "/v1/messages": ("POST",),
    "/v1/messages/count_tokens": ("POST",),
}


@dataclass(frozen=True)
class Received:
    """One request as the fake received it."""

    method: str
    path: str  # with the query string
    headers: tuple[tuple[str, str], ...]  # in arrival order, names as Tornado normalises them
    body: bytes
    at: float  # time.monotonic()
    peer: int = 0  # the client's port: one value per TCP connection, so keep-alive reuse shows

    def header_list(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def header(self, name: str) -> str | None:
        values = self.header_list(name)
        return values[0] if values else None

    def header_names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Closed:
    """A connection the fake saw closed by its client while it was still answering."""

    path: str
    request_id: str | None  # the X-Request-ID of the request being answered
    at: float  # time.monotonic()


@dataclass(frozen=True)
class ConnectionEnd:
    """A connection that ended, whoever closed it."""

    peer: int  # the client's port, as in Received.peer
    at: float  # time.monotonic()
    by_keep_alive: bool  # closed by the fake: idle `keep_alive` s after its last response


class _Gone(Exception):
    """The client closed the connection; stop answering."""


def _split_words(text: str) -> list[str]:
    """`text` in pieces that join back to it: each word after the first with its leading space."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


class _Handler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self._closed_recorded = False
        self.reply_override: str | None = None  # this request's scripted text (`script`)

    def set_default_headers(self) -> None:
        # uvicorn's own headers; Tornado adds Date.
        self.set_header("Server", "uvicorn")
        self.clear_header("Content-Type")

    def prepare(self) -> None:
        super().prepare()
        self.fake._record(
            Received(
                method=self.request.method or "",
                path=self.request.uri or "",
                headers=tuple(self.request.headers.get_all()),
                body=self.request.body,
                at=time.monotonic(),
                peer=self.request.connection.stream.socket.getpeername()[1],
            )
        )
        for name, value in self.fake.extra_headers.items():
            self.set_header(name, value)

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self._note_closed()

    def on_finish(self) -> None:
        self.fake._response_ended(self.request.connection.stream)

    def _note_closed(self) -> None:
        if not self._closed_recorded:
            self._closed_recorded = True
            self.fake._record_close(
                Closed(self.request.path, self.request.headers.get("X-Request-ID"), time.monotonic())
            )

    # --- dispatch ----------------------------------------------------------------------------

    async def get(self) -> None:
        await self._answer()

    async def post(self) -> None:
        await self._answer()

    head = get
    put = patch = delete = post

    async def _answer(self) -> None:
        path = self.request.path
        try:
            if self.fake.hang_up:
                self._hang_up()
            if self.fake.fail is not None:
                status, body, content_type = self.fake.fail
                self.set_status(status)
                self.set_header("Content-Type", content_type)
                self.finish(body)
                return
            authorization = self.request.headers.get_list("Authorization")
            if not shapes.authorized(path, authorization[0] if authorization else None, self.fake.api_key):
                self.set_status(401)
                self._json(shapes.UNAUTHORIZED)
                return
            shapes.check_route(path, self.request.method or "", _ROUTES)
            await {
                "/health": self._health,
                "/v1/models": self._models,
                "/v1/chat/completions": self._chat,
                "/v1/completions": self._completions,
                "/v1/responses": self._responses,
                "/v1/embeddings": self._embeddings,
                "/v1/messages": self._messages,
                "/v1/messages/count_tokens": self._count_tokens,
            }[path]()
        except shapes.ApiError as exc:
            self._error(exc, path)
        except _Gone:
            self._note_closed()

    def _hang_up(self) -> None:
        """Close the connection now, as a crashing server does: no answer, or half of one."""
        self._closed_recorded = True  # our own close, not one we observed
        self.request.connection.close()
        self._finished = True  # nothing more to send; Tornado must not try
        raise _Gone()

    def _error(self, exc: shapes.ApiError, path: str) -> None:
        self.set_status(exc.status)
        if isinstance(exc, shapes.DetailError) and exc.allow:
            self.set_header("Allow", exc.allow)
        self._json(exc.body(path))

    def _body(self) -> dict[str, Any]:
        return shapes.parse_body(
            self.request.path, self.request.headers.get("Content-Type"), self.request.body
        )

    def _model(self, body: dict[str, Any]) -> str:
        return shapes.served_model(body, list(self.fake.models))

    # --- plain JSON and SSE --------------------------------------------------------------------

    def _json(self, payload: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(shapes.json_bytes(payload))

    async def _send(self, chunk: bytes) -> None:
        if self.fake._stopping.is_set():
            raise _Gone()
        self.write(chunk)
        try:
            await self.flush()
        except StreamClosedError:
            raise _Gone() from None
        self.fake.flushed += len(chunk)

    def _reply(self, limit: Any) -> tuple[list[str], str]:
        """The pieces of `reply` (or of this request's scripted text) and the finish reason: cut to
        the request's max tokens, `length`."""
        words = _split_words(self.reply_override or self.fake.reply)
        if isinstance(limit, int) and 0 < limit < len(words):
            return words[:limit], "length"
        return words, "stop"

    async def _stream(self, stream: shapes.Stream, limit: Any, reasoning: str = "") -> None:
        """The first chunk (what comes before the text; a completion's first piece), the pause, the
        pieces `word_interval` s apart (endless: more of them), then the end."""
        fake = self.fake
        self.set_header("Content-Type", shapes.SSE_CONTENT_TYPE)
        words, finish = self._reply(limit)
        last = words.pop()
        first = stream.start()
        if not first and words:  # a completion has no head: its first piece is its first chunk
            first = [stream.piece(words.pop(0))]
        await self._send(b"".join(first))
        if fake.break_midway:
            await asyncio.sleep(0.1)  # the first chunk is relayed before the crash
            self._hang_up()
        if fake.engine_dies:
            await self._send(stream.piece(words.pop(0) if words else last))
            events, clean = stream.engine_died()
            for event in events:
                await self._send(event)
            if not clean:
                self._hang_up()
            self.finish()
            return
        if fake.first_chunk_pause:
            await asyncio.sleep(fake.first_chunk_pause)
        hold = fake.hold_after_first
        if hold is not None:
            deadline = time.monotonic() + HOLD_MAX_S
            while not hold.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        pieces: list[Any] = []
        if isinstance(stream, shapes.ChatStream):
            pieces += [(stream.reasoning, w) for w in (_split_words(reasoning) if reasoning else [])]
        pieces += [(stream.piece, w) for w in words]
        for n, (make, text) in enumerate(pieces):
            if fake.word_interval and n:
                await asyncio.sleep(fake.word_interval)
            await self._send(make(text))
        i = 0
        while fake.endless:
            await asyncio.sleep(fake.endless_interval)
            await self._send(stream.piece(f" more{i}"))
            i += 1
        if fake.word_interval and pieces:
            await asyncio.sleep(fake.word_interval)
        for chunk in stream.end(last, finish):
            await self._send(chunk)
        self.finish()

    def _generated(self, model: str, prompt: str, limit: Any) -> shapes.Generated:
        words, finish = self._reply(limit)
        return shapes.Generated(model, "".join(words), _tokens(prompt), len(words), finish)

    # --- OpenAI ------------------------------------------------------------------------------

    async def _health(self) -> None:
        self.finish()

    async def _models(self) -> None:
        models = list(self.fake.models)
        self._json(shapes.models(models, f"/models/{models[0]}", self.fake.max_model_len))

    def _usage_options(self, body: dict[str, Any]) -> bool:
        return bool((body.get("stream_options") or {}).get("include_usage"))

    async def _chat(self) -> None:
        body = self._body()
        model = self._model(body)
        messages = body.get("messages")
        shapes.check_messages(messages)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        shapes.check_max_tokens(limit, self.fake.max_model_len)
        prompt = " ".join(shapes.text_of(m.get("content")) for m in messages if isinstance(m, dict))
        turn: str | list[shapes.ToolCall] | None = self.fake._next_turn()
        finish = "tool_calls"
        if turn is None and (forced := shapes.forced_tool_call(body)) is not None:
            turn, finish = forced  # vLLM calls the tool that tool_choice asks for
        if isinstance(turn, list):  # tool calls
            generated = replace(self._generated(model, prompt, limit), text="", finish_reason=finish)
            if not body.get("stream"):
                self._json(shapes.chat_completion(replace(generated, tool_calls=turn)))
                return
            self.set_header("Content-Type", shapes.SSE_CONTENT_TYPE)
            stream = shapes.ChatStream(model, _tokens(prompt), self._usage_options(body))
            for chunk in [*stream.start(), *stream.tool_calls(turn, finish_reason=finish)]:
                if self.fake.word_interval:
                    await asyncio.sleep(self.fake.word_interval)
                await self._send(chunk)
            self.finish()
            return
        if turn is not None:
            self.reply_override = turn
        if not body.get("stream"):
            generated = replace(self._generated(model, prompt, limit), reasoning=self.fake.reasoning or None)
            self._json(shapes.chat_completion(generated))
            return
        stream = shapes.ChatStream(model, _tokens(prompt), self._usage_options(body))
        await self._stream(stream, limit, self.fake.reasoning)

    async def _completions(self) -> None:
        body = self._body()
        model = self._model(body)
        prompt = body.get("prompt")
        shapes.check_prompt(prompt)
        limit = body.get("max_tokens")
        shapes.check_max_tokens(limit, self.fake.max_model_len)
        prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        if not body.get("stream"):
            self._json(shapes.completion(self._generated(model, prompt_text, limit)))
            return
        stream = shapes.CompletionStream(model, _tokens(prompt_text), self._usage_options(body))
        await self._stream(stream, limit)

    async def _responses(self) -> None:
        body = self._body()
        model = self._model(body)
        given = body.get("input")
        if isinstance(given, list):
            prompt = " ".join(shapes.text_of(m.get("content")) for m in given if isinstance(m, dict))
        else:
            prompt = shapes.text_of(given)
        limit = body.get("max_output_tokens")
        if not body.get("stream"):
            self._json(shapes.response(body, self._generated(model, prompt, limit), self.fake.max_model_len))
            return
        await self._stream(
            shapes.ResponsesStream(model, _tokens(prompt), body, self.fake.max_model_len), limit
        )

    async def _embeddings(self) -> None:
        body = self._body()
        model = self._model(body)
        inputs = body["input"]
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            raise shapes.ApiError(400, "input: Input should be a valid string or list", param="input")
        vectors = [[round(((hash(str(text)) >> k) % 1000) / 1000.0, 3) for k in range(8)] for text in inputs]
        tokens = sum(_tokens(str(t)) for t in inputs)
        self._json(shapes.embeddings(model, vectors, body.get("encoding_format") or "float", tokens))

    # --- Anthropic ---------------------------------------------------------------------------

    def _anthropic_prompt(self, body: dict[str, Any]) -> str:
        messages = body.get("messages")
        shapes.check_messages(messages)
        return " ".join(shapes.text_of(m.get("content")) for m in messages if isinstance(m, dict))

    async def _messages(self) -> None:
        body = self._body()
        model = self._model(body)
        prompt = self._anthropic_prompt(body)
        limit = body.get("max_tokens")
        if not body.get("stream"):
            self._json(shapes.message(self._generated(model, prompt, limit)))
            return
        await self._stream(shapes.MessagesStream(model, _tokens(prompt)), limit)

    async def _count_tokens(self) -> None:
        body = self._body()
        self._model(body)
        self._json(shapes.count_tokens(_tokens(self._anthropic_prompt(body))))


class _Arrival(tornado.httputil.HTTPMessageDelegate):
    """Passes a request on, telling the fake when its headers arrived (the connection is busy)."""

    def __init__(self, inner: tornado.httputil.HTTPMessageDelegate, fake: FakeUpstream, stream: IOStream):
        self.inner, self.fake, self.stream = inner, fake, stream

    def headers_received(self, start_line: Any, headers: tornado.httputil.HTTPHeaders) -> Any:
        self.fake._busy(self.stream)
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        self.inner.finish()

    def on_connection_close(self) -> None:
        self.inner.on_connection_close()


class _Server(tornado.httpserver.HTTPServer):
    """Tornado's HTTP server with uvicorn's keep-alive rule and a record of how connections end.

    Tornado's own `idle_connection_timeout` would also time out a fresh connection that has not
    sent its first request, which uvicorn does not: the timer here starts when a response ends.
    """

    def initialize(self, *args: Any, fake: FakeUpstream, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(*args, **kwargs)
        self.fake = fake

    def start_request(self, server_conn: Any, request_conn: Any) -> tornado.httputil.HTTPMessageDelegate:
        self.fake._connected(server_conn.stream, server_conn.context.address[1])
        return _Arrival(super().start_request(server_conn, request_conn), self.fake, server_conn.stream)

    def on_close(self, server_conn: Any) -> None:
        super().on_close(server_conn)
        self.fake._ended(server_conn.stream)


@dataclass
class _Connection:
    """The fake's state of one connection (touched on the fake's IOLoop only)."""

    peer: int
    requests: int = 0
    timer: Any = None  # the keep-alive timer, while idle after a response
    timed_out: bool = False


class FakeUpstream:
    """The fake vLLM server. `url` is its origin once started."""

    endless_interval = 0.05
    max_model_len = 512

    def __init__(self, *, api_key: str | None = None, models: tuple[str, ...] = (MODEL,)) -> None:
        self.api_key = api_key
        self.models = models
        self.port = 0
        self._lock = threading.Lock()
        self._requests: list[Received] = []
        self._closes: list[Closed] = []
        self._ends: list[ConnectionEnd] = []
        self.flushed = 0  # bytes of streamed answers flushed (a write the client's side took)
        self._connections: dict[IOStream, _Connection] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[tornado.httpserver.HTTPServer] = []
        self._listening: tornado.httpserver.HTTPServer | None = None
        self._stopping = threading.Event()
        self._done: asyncio.Event | None = None
        self.reset()

    # --- knobs and records -------------------------------------------------------------------

    def reset(self) -> None:
        self.first_chunk_pause = 0.0
        self.hold_after_first: threading.Event | None = None
        self.word_interval = 0.0
        self.reasoning = ""
        self.endless = False
        self.fail: tuple[int, bytes, str] | None = None
        self.hang_up = False
        self.break_midway = False
        self.engine_dies = False
        self.keep_alive = shapes.KEEP_ALIVE_S
        self.extra_headers: dict[str, str] = {}
        self.reply = "Hello from the fake upstream"
        self.script: list[str | list[shapes.ToolCall]] = []
        with self._lock:
            self._requests.clear()
            self._closes.clear()
            self._ends.clear()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    @property
    def closes(self) -> list[Closed]:
        with self._lock:
            return list(self._closes)

    @property
    def connection_ends(self) -> list[ConnectionEnd]:
        with self._lock:
            return list(self._ends)

    def received(self, request_id: str) -> list[Received]:
        """The requests that came with this X-Request-ID (the gateway forwards its request id)."""
        return [r for r in self.requests if r.header("X-Request-ID") == request_id]

    def _next_turn(self) -> str | list[shapes.ToolCall] | None:
        """The scripted answer of this chat request, or None once the script is spent."""
        with self._lock:
            return self.script.pop(0) if self.script else None

    def _record(self, request: Received) -> None:
        with self._lock:
            self._requests.append(request)

    def _record_close(self, closed: Closed) -> None:
        with self._lock:
            self._closes.append(closed)

    # --- keep-alive (on the fake's IOLoop) ------------------------------------------------------

    def _connected(self, stream: IOStream, peer: int) -> None:
        self._connections.setdefault(stream, _Connection(peer))

    def _busy(self, stream: IOStream) -> None:
        connection = self._connections.get(stream)
        if connection is not None:
            connection.requests += 1
            if connection.timer is not None:
                connection.timer.cancel()
                connection.timer = None

    def _response_ended(self, stream: IOStream) -> None:
        connection = self._connections.get(stream)
        if connection is None or stream.closed():
            return
        assert self._loop is not None
        connection.timer = self._loop.call_later(
            self.keep_alive, self._keep_alive_expired, stream, connection.requests
        )

    def _keep_alive_expired(self, stream: IOStream, requests: int) -> None:
        connection = self._connections.get(stream)
        if connection is None or connection.requests != requests or stream.closed():
            return  # a request came in meanwhile, or the connection is gone
        connection.timer = None
        connection.timed_out = True
        stream.close()

    def _ended(self, stream: IOStream) -> None:
        connection = self._connections.pop(stream, None)
        if connection is None:
            return
        if connection.timer is not None:
            connection.timer.cancel()
        with self._lock:
            self._ends.append(ConnectionEnd(connection.peer, time.monotonic(), connection.timed_out))

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> FakeUpstream:
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="fake-upstream", daemon=True)
        self._thread.start()
        started.result(timeout=10)
        return self

    def _run(self, started: Future[None]) -> None:
        async def main() -> None:
            try:
                self._loop = asyncio.get_running_loop()
                self._done = asyncio.Event()
                self._listen()
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(None)
            await self._done.wait()
            self._unlisten()
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(s.close_all_connections() for s in self._servers)), 1.0
                )
            except TimeoutError:
                pass

        asyncio.run(main())

    def _app(self) -> tornado.web.Application:
        return tornado.web.Application([(r"/.*", _Handler, {"fake": self})])

    def _listen(self) -> None:
        sockets = tornado.netutil.bind_sockets(self.port, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        server = _Server(self._app(), fake=self, max_body_size=_MAX_BODY)
        server.add_sockets(sockets)
        self._listening = server
        self._servers.append(server)

    def _unlisten(self) -> None:
        if self._listening is not None:
            self._listening.stop()
            self._listening = None

    def _call(self, fn: Any) -> None:
        assert self._loop is not None
        done: Future[None] = Future()

        def run() -> None:
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        done.result(timeout=10)

    def down(self) -> None:
        """Go down like a dead process: new connections are refused and open ones are closed
        (the gateway's idle keep-alive connections included)."""
        self._call(self._down)

    def _down(self) -> None:
        self._unlisten()
        for server in self._servers:
            for connection in list(server._connections):  # HTTP1ServerConnection
                connection.stream.close()

    def up(self) -> None:
        """Listen again, on the same port."""
        self._call(self._listen)

    def stop(self) -> None:
        self._stopping.set()
        self.endless = False
        if self._loop is not None and self._done is not None:
            self._loop.call_soon_threadsafe(self._done.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "the fake upstream did not stop"


def running(**kwargs: Any) -> Iterator[FakeUpstream]:
    """For fixtures: a started fake, stopped afterwards."""
    fake = FakeUpstream(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()

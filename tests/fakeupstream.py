"""A small, faithful fake of a vLLM OpenAI/Anthropic HTTP server (`vllm serve`), for gateway tests.

It runs a Tornado app on ``127.0.0.1`` in a background thread with its own IOLoop, and records what
it receives: every request (method, path with query, headers in arrival order, raw body bytes,
arrival time) and every connection close it observes while answering (time). It serves the shapes
vLLM 0.32 sends:

    GET  /v1/models                     {"object":"list","data":[{"id":…,"object":"model",…}]}
    POST /v1/chat/completions           chat.completion, or SSE chat.completion.chunk … data: [DONE]
    POST /v1/completions                text_completion, or SSE chunks … data: [DONE]
    POST /v1/responses                  response JSON, or SSE with ``event: response.created`` …
                                        ``event: response.completed`` lines (no [DONE], like vLLM)
    POST /v1/embeddings                 list of embeddings (``encoding_format`` float or base64)
    POST /v1/messages                   Anthropic message, or SSE ``event: message_start`` …
                                        ``event: message_stop``
    POST /v1/messages/count_tokens      {"input_tokens": n}

Like vLLM: an unknown model is 404 ``The model `x` does not exist.``; a body that is not JSON is 400;
with ``api_key`` set (``vllm serve --api-key``) a request without exactly that Bearer is 401
``{"error": "Unauthorized"}``. Errors use vLLM's OpenAI shape, or the Anthropic shape on
``/v1/messages*``.

Knobs (set from the test thread; read by the handlers as they run):

    first_chunk_pause   seconds between a stream's first chunk and the rest (0: none)
    word_interval       seconds between the streamed words of a chat completion (0: none)
    reasoning           a streamed chat completion first sends this, word by word, as
                        ``delta.reasoning_content`` (as vLLM with a reasoning parser), then the
                        reply as ``delta.content`` ("": no reasoning)
    endless             streams never end: one more delta every ``endless_interval`` s
    fail                (status, body, content type): every request answers that, as is
    hang_up             close the connection once the request is read, without answering (a crash)
    break_midway        close the connection 0.1 s after a stream's first chunk, mid-body (a crash)
    extra_headers       added to every answer (e.g. cache headers the gateway must replace)
    reply               the generated text
    down() / up()       stop listening (connections refused) / listen again on the same port

``reset()`` clears the records and the knobs. ``stop()`` ends endless streams and closes every open
connection within a second.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web
from tornado.iostream import StreamClosedError

MODEL = "tiny"
_MAX_BODY = 64 * 1024 * 1024


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


class _ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


class _Gone(Exception):
    """The client closed the connection; stop answering."""


def _sse(payload: Any, event: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def _split_words(text: str) -> list[str]:
    """`text` in pieces that join back to it: each word after the first with its leading space."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


def _text_of(content: Any) -> str:
    """The text of an OpenAI/Anthropic message content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


class _Handler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self._closed_recorded = False

    def set_default_headers(self) -> None:
        # uvicorn's own headers; Tornado adds Date.
        self.set_header("Server", "uvicorn")
        self.clear_header("Content-Type")

    def prepare(self) -> None:
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
        self._note_closed()

    def _note_closed(self) -> None:
        if not self._closed_recorded:
            self._closed_recorded = True
            self.fake._record_close(
                Closed(self.request.path, self.request.headers.get("X-Request-ID"), time.monotonic())
            )

    # --- dispatch ----------------------------------------------------------------------------

    async def get(self, path: str) -> None:
        await self._answer("GET", path)

    async def post(self, path: str) -> None:
        await self._answer("POST", path)

    async def _answer(self, method: str, path: str) -> None:
        anthropic = path.startswith("messages")
        try:
            if self.fake.hang_up:
                self._hang_up()
            if self.fake.fail is not None:
                status, body, content_type = self.fake.fail
                self.set_status(status)
                self.set_header("Content-Type", content_type)
                self.finish(body)
                return
            self._check_auth()
            route = {
                ("GET", "models"): self._models,
                ("POST", "chat/completions"): self._chat,
                ("POST", "completions"): self._completions,
                ("POST", "responses"): self._responses,
                ("POST", "embeddings"): self._embeddings,
                ("POST", "messages"): self._messages,
                ("POST", "messages/count_tokens"): self._count_tokens,
            }.get((method, path))
            if route is None:
                if any(p == path for _, p in self._routes()):
                    raise _ApiError(405, "Method Not Allowed", "MethodNotAllowed")
                raise _ApiError(404, "Not Found", "NotFoundError")
            await route()
        except _ApiError as exc:
            self._error(exc, anthropic)
        except _Gone:
            self._note_closed()

    @staticmethod
    def _routes() -> list[tuple[str, str]]:
        return [
            ("GET", "models"),
            ("POST", "chat/completions"),
            ("POST", "completions"),
            ("POST", "responses"),
            ("POST", "embeddings"),
            ("POST", "messages"),
            ("POST", "messages/count_tokens"),
        ]

    def _hang_up(self) -> None:
        """Close the connection now, as a crashing server does: no answer, or half of one."""
        self._closed_recorded = True  # our own close, not one we observed
        self.request.connection.close()
        self._finished = True  # nothing more to send; Tornado must not try
        raise _Gone()

    def _check_auth(self) -> None:
        if self.fake.api_key is None:
            return
        values = self.request.headers.get_list("Authorization")
        if values != [f"Bearer {self.fake.api_key}"]:
            self.set_status(401)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"error": "Unauthorized"}))
            raise _Gone()

    def _error(self, exc: _ApiError, anthropic: bool) -> None:
        self.set_status(exc.status)
        self.set_header("Content-Type", "application/json")
        if anthropic:
            kind = {400: "invalid_request_error", 404: "not_found_error"}.get(exc.status, "api_error")
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": exc.message}}
        else:
            payload = {
                "error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}
            }
        self.finish(json.dumps(payload))

    def _body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body)
        except ValueError as exc:
            raise _ApiError(400, f"JSON decode error: {exc}") from None
        if not isinstance(body, dict):
            raise _ApiError(400, "Input should be a valid dictionary or object")
        model = body.get("model")
        if model not in self.fake.models:
            raise _ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return body

    # --- plain JSON and SSE --------------------------------------------------------------------

    def _json(self, payload: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    async def _send(self, chunk: bytes) -> None:
        if self.fake._stopping.is_set():
            raise _Gone()
        self.write(chunk)
        try:
            await self.flush()
        except StreamClosedError:
            raise _Gone() from None

    async def _stream(
        self, first: list[bytes], rest: list[bytes], more: Any, done: list[bytes], interval: float = 0.0
    ) -> None:
        """first chunk, the pause, the rest (`interval` s apart); `more(i)` gives the endless stream's
        i-th chunk."""
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        await self._send(b"".join(first))
        if self.fake.break_midway:
            await asyncio.sleep(0.1)  # the first chunk is relayed before the crash
            self._hang_up()
        if self.fake.first_chunk_pause:
            await asyncio.sleep(self.fake.first_chunk_pause)
        for n, chunk in enumerate(rest):
            if interval and n:
                await asyncio.sleep(interval)
            await self._send(chunk)
        i = 0
        while self.fake.endless:
            await asyncio.sleep(self.fake.endless_interval)
            await self._send(more(i))
            i += 1
        for chunk in done:
            await self._send(chunk)
        self.finish()

    def _words(self) -> list[str]:
        return _split_words(self.fake.reply)

    # --- OpenAI ------------------------------------------------------------------------------

    async def _models(self) -> None:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": f"/models/{name}",
                "parent": None,
                "max_model_len": 512,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.fake.models
        ]
        self._json({"object": "list", "data": data})

    def _usage(self, prompt: str) -> dict[str, Any]:
        p, c = _tokens(prompt), len(self._words())
        return {
            "prompt_tokens": p,
            "total_tokens": p + c,
            "completion_tokens": c,
            "prompt_tokens_details": None,
        }

    async def _chat(self) -> None:
        body = self._body()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _ApiError(400, "messages: Field required")
        prompt = " ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body["model"]
        if not body.get("stream"):
            self._json(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": self.fake.reply,
                                "refusal": None,
                                "annotations": None,
                                "audio": None,
                                "function_call": None,
                                "tool_calls": [],
                                "reasoning_content": self.fake.reasoning or None,
                            },
                            "logprobs": None,
                            "finish_reason": "stop",
                            "stop_reason": None,
                        }
                    ],
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": self._usage(prompt),
                    "prompt_logprobs": None,
                    "kv_transfer_params": None,
                }
            )
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish:
                choice["stop_reason"] = None
            return _sse(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
            )

        first = [chunk({"role": "assistant", "content": ""})]
        thinking = _split_words(self.fake.reasoning) if self.fake.reasoning else []
        rest = [chunk({"reasoning_content": w}) for w in thinking]
        rest += [chunk({"content": w}) for w in self._words()]
        done = [chunk({"content": ""}, "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            done.append(
                _sse(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": self._usage(prompt),
                    }
                )
            )
        done.append(_sse("[DONE]"))
        await self._stream(
            first, rest, lambda i: chunk({"content": f" more{i}"}), done, self.fake.word_interval
        )

    async def _completions(self) -> None:
        body = self._body()
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise _ApiError(400, "prompt: Field required")
        prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        cid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), body["model"]
        if not body.get("stream"):
            self._json(
                {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "text": self.fake.reply,
                            "logprobs": None,
                            "finish_reason": "length",
                            "stop_reason": None,
                            "prompt_logprobs": None,
                        }
                    ],
                    "service_tier": None,
                    "system_fingerprint": None,
                    "usage": self._usage(prompt_text),
                    "kv_transfer_params": None,
                }
            )
            return

        def chunk(text: str, finish: str | None = None) -> bytes:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return _sse(
                {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
            )

        words = self._words()
        await self._stream(
            [chunk(words[0])],
            [chunk(w) for w in words[1:]],
            lambda i: chunk(f" more{i}"),
            [chunk("", "length"), _sse("[DONE]")],
        )

    async def _responses(self) -> None:
        body = self._body()
        prompt = _text_of(body.get("input")) if not isinstance(body.get("input"), list) else ""
        if isinstance(body.get("input"), list):
            prompt = " ".join(_text_of(m.get("content")) for m in body["input"] if isinstance(m, dict))
        rid, mid, model = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", body["model"]
        created = int(time.time())
        p, c = _tokens(prompt), len(self._words())

        def response(status: str, text: str | None) -> dict[str, Any]:
            output = []
            if text is not None:
                part = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
                output = [
                    {
                        "id": mid,
                        "content": [part],
                        "role": "assistant",
                        "status": "completed",
                        "type": "message",
                    }
                ]
            return {
                "id": rid,
                "created_at": created,
                "incomplete_details": None,
                "instructions": body.get("instructions"),
                "metadata": None,
                "model": model,
                "object": "response",
                "output": output,
                "parallel_tool_calls": True,
                "temperature": 1.0,
                "tool_choice": "auto",
                "tools": [],
                "top_p": 1.0,
                "background": False,
                "max_output_tokens": body.get("max_output_tokens") or 496,
                "max_tool_calls": None,
                "previous_response_id": None,
                "prompt": None,
                "reasoning": None,
                "service_tier": "auto",
                "status": status,
                "text": None,
                "top_logprobs": None,
                "truncation": "disabled",
                "usage": {
                    "input_tokens": p,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": c if status == "completed" else 0,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": p + (c if status == "completed" else 0),
                }
                if status == "completed"
                else None,
                "user": None,
            }

        if not body.get("stream"):
            self._json(response("completed", self.fake.reply))
            return
        seq = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            return _sse({**fields, "sequence_number": next(seq), "type": kind}, event=kind)

        item = {"id": mid, "content": [], "role": "assistant", "status": "in_progress", "type": "message"}
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": None}
        first = [
            event("response.created", response=response("in_progress", None)),
            event("response.in_progress", response=response("in_progress", None)),
            event("response.output_item.added", item=item, output_index=0),
            event("response.content_part.added", content_index=0, item_id=mid, output_index=0, part=part),
        ]

        def delta(text: str) -> bytes:
            return event(
                "response.output_text.delta",
                content_index=0,
                delta=text,
                item_id=mid,
                logprobs=[],
                output_index=0,
            )

        final_part = {**part, "text": self.fake.reply}
        done = [
            event(
                "response.output_text.done",
                content_index=0,
                item_id=mid,
                logprobs=[],
                output_index=0,
                text=self.fake.reply,
            ),
            event(
                "response.content_part.done", content_index=0, item_id=mid, output_index=0, part=final_part
            ),
            event(
                "response.output_item.done",
                item={**item, "content": [final_part], "status": "completed"},
                output_index=0,
            ),
            event("response.completed", response=response("completed", self.fake.reply)),
        ]
        await self._stream(first, [delta(w) for w in self._words()], lambda i: delta(f" more{i}"), done)

    async def _embeddings(self) -> None:
        body = self._body()
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            raise _ApiError(400, "input: Field required")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise _ApiError(400, "encoding_format: Input should be 'float' or 'base64'")
        data = []
        for i, text in enumerate(inputs):
            vector = [round(((hash(str(text)) >> k) % 1000) / 1000.0, 3) for k in range(8)]
            embedding: Any = vector
            if fmt == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"index": i, "object": "embedding", "embedding": embedding})
        p = sum(_tokens(str(t)) for t in inputs)
        self._json(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": body["model"],
                "data": data,
                "usage": {
                    "prompt_tokens": p,
                    "total_tokens": p,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
        )

    # --- Anthropic ---------------------------------------------------------------------------

    def _anthropic_prompt(self, body: dict[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _ApiError(400, "messages: Field required")
        return " ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))

    async def _messages(self) -> None:
        body = self._body()
        prompt = self._anthropic_prompt(body)
        if not isinstance(body.get("max_tokens"), int):
            raise _ApiError(400, "max_tokens: Field required")
        mid, model = f"msg_{uuid.uuid4().hex}", body["model"]
        p, c = _tokens(prompt), len(self._words())
        if not body.get("stream"):
            self._json(
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "text", "text": self.fake.reply}],
                    "model": model,
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": p, "output_tokens": c},
                }
            )
            return

        def ev(kind: str, **fields: Any) -> bytes:
            return _sse({"type": kind, **fields}, event=kind)

        def delta(text: str) -> bytes:
            return ev("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": p, "output_tokens": 0},
        }
        first = [
            ev("message_start", message=message),
            ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("ping"),
        ]
        done = [
            ev("content_block_stop", index=0),
            ev(
                "message_delta",
                delta={"stop_reason": "end_turn", "stop_sequence": None},
                usage={"input_tokens": p, "output_tokens": c},
            ),
            ev("message_stop"),
        ]
        await self._stream(first, [delta(w) for w in self._words()], lambda i: delta(f" more{i}"), done)

    async def _count_tokens(self) -> None:
        body = self._body()
        self._json({"input_tokens": _tokens(self._anthropic_prompt(body))})


class FakeUpstream:
    """The fake vLLM server. `url` is its origin once started."""

    endless_interval = 0.05

    def __init__(self, *, api_key: str | None = None, models: tuple[str, ...] = (MODEL,)) -> None:
        self.api_key = api_key
        self.models = models
        self.port = 0
        self._lock = threading.Lock()
        self._requests: list[Received] = []
        self._closes: list[Closed] = []
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
        self.word_interval = 0.0
        self.reasoning = ""
        self.endless = False
        self.fail: tuple[int, bytes, str] | None = None
        self.hang_up = False
        self.break_midway = False
        self.extra_headers: dict[str, str] = {}
        self.reply = "Hello from the fake upstream"
        with self._lock:
            self._requests.clear()
            self._closes.clear()

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

    def received(self, request_id: str) -> list[Received]:
        """The requests that came with this X-Request-ID (the gateway forwards its request id)."""
        return [r for r in self.requests if r.header("X-Request-ID") == request_id]

    def _record(self, request: Received) -> None:
        with self._lock:
            self._requests.append(request)

    def _record_close(self, closed: Closed) -> None:
        with self._lock:
            self._closes.append(closed)

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
        return tornado.web.Application([(r"/v1/(.*)", _Handler, {"fake": self})])

    def _listen(self) -> None:
        sockets = tornado.netutil.bind_sockets(self.port, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        server = tornado.httpserver.HTTPServer(self._app(), max_body_size=_MAX_BODY)
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

"""What vLLM 0.32's HTTP server answers: the one home of the shapes both fakes of it serve.

`tests/fakes/vllm.py` (the fake `vllm` executable for the supervisor's tests) and
`tests/fakes/upstream.py` (the in-process upstream for the gateway's tests) parse requests and build
every body, SSE event and error here; each decides only what its "engine" generates and how it
sends the bytes. Stdlib only and no I/O: `vllm.py` runs as a bare executable and imports this
file from its own directory (as `shapes`), the tests import it as `tests.fakes.shapes`.

Measured on the real vLLM 0.32.0+cpu serving a tiny Llama (docs/vllm-facts.md), and
compared again, request for request, by tests/test_fakes_match_vllm.py:

- **Model.** A request without `model` (or `""`, or null) is served by the first served model name;
  an unknown one is 404 ``The model `x` does not exist. Valid aliases: a, b.`` (`param` "model").
  `/v1/messages*` require `model` (a 400 validation error without it).
- **Errors.** `{"error": {"message", "type", "param", "code"}}`. Request validation (FastAPI: a
  media type other than `application/json`, a body that is not JSON or not an object, a missing
  field) is `type` "Bad Request", in this shape on `/v1/messages*` too; the serving layer's errors
  there are `{"type": "error", "error": {"type": <the same type, e.g. NotFoundError>, "message"}}`.
  Unknown path: 404 `{"detail": "Not Found"}`; wrong method: 405 `{"detail": "Method Not
  Allowed"}` with `Allow`. A body that is not UTF-8: 400 `{"detail": "There was an error parsing
  the body"}`. `/v1/embeddings` exists only for a pooling model (404 for a generative one).
- **Key.** Started with `--api-key` (or VLLM_API_KEY), every path under `/v1` (routed or not)
  needs the *first* `Authorization` header to be `Bearer <key>` (scheme in any case), else 401
  `{"error": "Unauthorized"}`; `/health` and `/version` stay open. Started without, nothing is
  checked.
- **Streams** (`text/event-stream; charset=utf-8`, chunked): see `ChatStream`, `CompletionStream`,
  `ResponsesStream`, `MessagesStream`. Events are compact JSON (no spaces, non-ASCII as is).
- **Engine death mid-stream** (its EngineCore process killed): the answer already started stays
  HTTP 200 and says so in-band: chat and completions `data: {"error": {... "type":
  "InternalServerError", "code": 500}}` (with spaces: plain `json.dumps`) then `data: [DONE]` and
  a clean end; `/v1/messages` one `event: error` and a clean end (no `message_stop`);
  `/v1/responses` nothing: the connection closes without the last chunk. Then the whole server
  shuts down and exits 0.
- **Keep-alive.** uvicorn closes a connection `KEEP_ALIVE_S` (5 s) after its last response ends
  (observed as EOF on a raw socket, 5.0 s each time); a connection that has not sent a request yet
  is not timed out.
"""

from __future__ import annotations

import base64
import hmac
import json
import struct
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

KEEP_ALIVE_S = 5.0  # uvicorn's timeout_keep_alive, as vLLM starts it
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # what --api-key guards
UNAUTHORIZED: dict[str, Any] = {"error": "Unauthorized"}
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
SYSTEM_FINGERPRINT = "vllm-0.32.0-fakefake"  # the real one: vllm-<version>-<8 hex digits>
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# /v1/messages converts the chat stream; the chat stream's in-band error is no chunk it can parse.
MESSAGES_ENGINE_DEAD = (
    "2 validation errors for ChatCompletionStreamResponse\nmodel\n  Field required [type=missing, "
    "input_value={'error': {'message': 'En...am': None, 'code': 500}}, input_type=dict]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/missing\nchoices\n"
    "  Field required [type=missing, input_value={'error': {'message': 'En...am': None, 'code': 500}}, "
    "input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.14/v/missing"
)
# Fields FastAPI requires before the serving layer sees the request.
_REQUIRED = {
    "/v1/chat/completions": ("messages",),
    "/v1/responses": ("input",),
    "/v1/embeddings": ("input",),
    "/v1/messages": ("model", "messages", "max_tokens"),
    "/v1/messages/count_tokens": ("model", "messages"),
}


# ---------------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answer: `status` and the body vLLM sends for it on `path` (`body(path)`)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "BadRequestError",
        param: str | None = None,
        *,
        validation: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.validation = validation  # FastAPI's: the OpenAI shape on every path

    def body(self, path: str) -> dict[str, Any]:
        if path.startswith("/v1/messages") and not self.validation:
            return {"type": "error", "error": {"type": self.kind, "message": self.message}}
        return {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }


class DetailError(ApiError):
    """Starlette's own answers (no route, wrong method, unreadable body): `{"detail": message}`."""

    def __init__(self, status: int, message: str, allow: str | None = None) -> None:
        super().__init__(status, message)
        self.allow = allow

    def body(self, path: str) -> dict[str, Any]:
        return {"detail": self.message}


def _summary(value: Any) -> str:
    """A validation error's `input` as vLLM shortens it."""
    if isinstance(value, list | tuple | dict | set):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def _validation(*errors: dict[str, Any] | str) -> ApiError:
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    first = errors[0]
    param = first.get("loc") if isinstance(first, dict) else None
    return ApiError(400, message.rstrip(), "Bad Request", param, validation=True)


def check_route(path: str, method: str, routes: Mapping[str, Collection[str]]) -> None:
    """Starlette's 404/405 (as `DetailError`) for a path or method the fake does not route."""
    methods = routes.get(path)
    if methods is None:
        raise DetailError(404, "Not Found")
    if method not in methods and not (method == "HEAD" and "GET" in methods):  # Starlette adds HEAD
        raise DetailError(405, "Method Not Allowed", allow=", ".join(sorted(methods)))


def authorized(path: str, authorization: str | None, api_key: str | None) -> bool:
    """vLLM's AuthenticationMiddleware: `authorization` is the first Authorization header."""
    if not api_key or not path.startswith(GUARDED_PREFIXES):
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), api_key.encode())


# ---------------------------------------------------------------------------------------- requests


def parse_body(path: str, content_type: str | None, raw: bytes) -> dict[str, Any]:
    """The JSON object of a POST, or the `ApiError` vLLM answers instead."""
    if (content_type or "").lower().split(";", 1)[0] != "application/json":
        raise _validation("Unsupported Media Type: Only 'application/json' is allowed")
    if not raw:
        raise _validation({"type": "missing", "loc": "body", "msg": "Field required", "input": "None"})
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": f"body.{exc.pos}", "msg": "JSON decode error"}
        raise _validation({**error, "input": "<dict of 0 items>", "ctx": {"error": exc.msg}}) from None
    except ValueError:  # not UTF-8
        raise DetailError(400, "There was an error parsing the body") from None
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        raise _validation(
            {"type": "model_attributes_type", "loc": "body", "msg": msg, "input": _summary(body)}
        )
    missing = [name for name in _REQUIRED.get(path, ()) if name not in body]
    if missing:
        raise _validation(
            *(
                {"type": "missing", "loc": f"body.{name}", "msg": "Field required", "input": _summary(body)}
                for name in missing
            )
        )
    return body


def served_model(body: dict[str, Any], served: list[str]) -> str:
    """The model that answers: the one asked for, or the first served name when none is."""
    model = body.get("model")
    if not model:
        return served[0]
    if model not in served:
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}."
        raise ApiError(404, message, "NotFoundError", "model")
    return str(model)


def check_max_tokens(limit: Any, max_model_len: int) -> None:
    """vLLM's checks of `max_tokens`; a limit that fits is cut to the room the prompt leaves."""
    if limit is None:
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ApiError(
            400,
            f"max_tokens must be at least 1, got {limit}. (parameter=max_tokens, value={limit})",
            param="max_tokens",
        )
    if limit > max_model_len:
        raise ApiError(
            400,
            f"max_tokens={limit} cannot be greater than max_model_len={max_model_len}. Please request "
            f"fewer output tokens. (parameter=max_tokens, value={limit})",
            param="max_tokens",
        )


def check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400, "Cannot apply chat template to an empty conversation. Provide at least one message."
        )


def check_prompt(prompt: Any) -> None:
    if not prompt:
        raise ApiError(
            400,
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
            param="prompt",
        )


def text_of(content: Any) -> str:
    """The text of an OpenAI/Anthropic message content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# ---------------------------------------------------------------------------------------- encoding


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:16]


def dumps(payload: Any) -> str:
    """pydantic's and Starlette's JSON: compact, non-ASCII as is."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def json_bytes(payload: Any) -> bytes:
    return dumps(payload).encode()


def sse(payload: Any, event: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else dumps(payload)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def _engine_dead_event() -> bytes:
    payload = {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500}}
    return f"data: {json.dumps(payload)}\n\n".encode()  # the one event vLLM writes with plain json.dumps


# ---------------------------------------------------------------------------------------- bodies


@dataclass(frozen=True)
class Generated:
    """What the engine made of one request (the fakes choose the text)."""

    model: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"  # or "length", or "tool_calls" (with `tool_calls`)
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made (vLLM with `--enable-auto-tool-choice --tool-call-parser …`):
    `arguments` is the JSON text of the arguments; vLLM's ids are `chatcmpl-tool-<hex>`."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: new_id("chatcmpl-tool-"))

    def message(self) -> dict[str, Any]:
        """As `message.tool_calls[i]` of a chat.completion."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def forced_tool_call(body: dict[str, Any]) -> tuple[list[ToolCall], str] | None:
    """The call vLLM makes whatever the model would say, and its finish reason: with `tools`, a
    `tool_choice` of "required" calls the first tool ("tool_calls"), one naming a function calls
    that one ("stop", as vLLM 0.32 ends a named call). The fake's arguments are `{}`. None when
    the request forces no call."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or not tools:
        return None
    if choice == "required":
        first = tools[0].get("function") if isinstance(tools[0], dict) else None
        name = first.get("name") if isinstance(first, dict) else None
        return ([ToolCall(name, "{}")], "tool_calls") if isinstance(name, str) else None
    named = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(named, dict) and isinstance(named.get("name"), str):
        return [ToolCall(named["name"], "{}")], "stop"
    return None


def models(names: list[str], root: str, max_model_len: int) -> dict[str, Any]:
    created = int(time.time())
    permission = {
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
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [{"id": new_id("modelperm-"), **permission}],
        }
        for name in names
    ]
    return {"object": "list", "data": data}


def _usage(prompt: int, completion: int, details: bool = True) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        usage |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    return usage


def chat_completion(g: Generated) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": g.text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": g.reasoning,
    }  # no `tool_calls` key when there are none
    if g.tool_calls:
        message["content"] = g.text or None
        message["tool_calls"] = [call.message() for call in g.tool_calls]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": g.finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": g.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(g.prompt_tokens, g.completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion(g: Generated) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": g.text,
        "logprobs": None,
        "finish_reason": g.finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }
    return {
        "id": new_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": g.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(g.prompt_tokens, g.completion_tokens),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _output_part(text: str, logprobs: Any = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _output_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "content": parts,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def response(
    body: dict[str, Any],
    g: Generated,
    max_model_len: int,
    *,
    response_id: str | None = None,
    created: int | None = None,
    output: list[dict[str, Any]] | None = None,
    done: bool = True,
) -> dict[str, Any]:
    """A Responses API object: finished (`done`) or still in progress (no output, no usage)."""
    incomplete = done and g.finish_reason == "length"
    usage = None
    if done:
        usage = {
            "input_tokens": g.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": 0,
                "cache_write_tokens": 0,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": g.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": g.prompt_tokens + g.completion_tokens,
        }
    if output is None:
        output = [_output_item(new_id("msg_"), [_output_part(g.text)], "completed")] if done else []
    return {
        "id": response_id or new_id("resp_"),
        "created_at": created or int(time.time()),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "metadata": None,
        "model": g.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": _float(body.get("temperature"), 1.0),
        "tool_choice": body.get("tool_choice", "none"),
        "tools": [],
        "top_p": _float(body.get("top_p"), 1.0),
        "background": False,
        "max_output_tokens": body.get("max_output_tokens") or max_model_len - g.prompt_tokens,
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
        "text": None,
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _float(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def message(g: Generated) -> dict[str, Any]:
    """An Anthropic message (vLLM leaves out what is null: no `stop_sequence`)."""
    return {
        "id": new_id("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": g.text}],
        "model": g.model,
        "stop_reason": _STOP_REASONS.get(g.finish_reason, g.finish_reason),
        "usage": {"input_tokens": g.prompt_tokens, "output_tokens": g.completion_tokens},
    }


def count_tokens(n: int) -> dict[str, Any]:
    return {"input_tokens": n, "context_management": {"original_input_tokens": n}}


def embeddings(
    model: str, vectors: list[list[float]], encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    """Not measured (a generative model has no /v1/embeddings): vLLM's EmbeddingResponse model."""
    if encoding_format not in ("float", "base64"):
        raise ApiError(400, "encoding_format: Input should be 'float' or 'base64'", param="encoding_format")
    data = []
    for i, vector in enumerate(vectors):
        embedding: Any = vector
        if encoding_format == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": i, "object": "embedding", "embedding": embedding})
    return {
        "id": new_id("embd-"),
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": _usage(prompt_tokens, 0, details=False) | {"prompt_tokens_details": None},
    }


# ---------------------------------------------------------------------------------------- streams


class Stream:
    """One streamed answer, event by event: `start()`, then `piece(text)` for each generated piece
    but the last, then `end(last, finish_reason)`; or `engine_died()` at any point instead of the
    end. Each returns the SSE bytes to send, in order."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        self.tokens = 0  # generated so far
        self.text = ""

    def _count(self, text: str) -> None:
        self.tokens += 1
        self.text += text

    def start(self) -> list[bytes]:
        return []

    def piece(self, text: str) -> bytes:
        raise NotImplementedError

    def end(self, last: str, finish_reason: str = "stop") -> list[bytes]:
        raise NotImplementedError

    def engine_died(self) -> tuple[list[bytes], bool]:
        """The in-band events, and whether the body then ends cleanly (False: the connection is cut)."""
        return [_engine_dead_event(), sse("[DONE]")], True


class ChatStream(Stream):
    """`chat.completion.chunk`s: a role chunk, one chunk per piece (the last with `finish_reason`
    and, without usage, `system_fingerprint`), a usage chunk with `stream_options.include_usage`,
    then `data: [DONE]`."""

    def __init__(self, model: str, prompt_tokens: int, include_usage: bool = False) -> None:
        super().__init__(model, prompt_tokens)
        self.id = new_id("chatcmpl-")
        self.include_usage = include_usage

    def _chunk(self, choice: dict[str, Any] | None, **extra: Any) -> bytes:
        head = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        return sse({**head, "choices": [choice] if choice else [], **extra})

    def start(self) -> list[bytes]:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return [self._chunk(choice, prompt_token_ids=None, prompt_text=None)]

    def reasoning(self, text: str) -> bytes:
        """A piece of reasoning (vLLM with a reasoning parser), before the content."""
        self.tokens += 1
        choice = {
            "index": 0,
            "delta": {"reasoning": text},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
        return self._chunk(choice)

    def piece(self, text: str) -> bytes:
        self._count(text)
        choice = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
        return self._chunk(choice)

    def tool_calls(
        self, calls: list[ToolCall], fragment: int = 8, finish_reason: str = "tool_calls"
    ) -> list[bytes]:
        """The chunks of tool calls, as vLLM 0.32's tool parser streams them (compared with the real
        one in tests/test_fakes_match_vllm.py): each delta is `{"content": null, "tool_calls": [one]}`;
        per call a first one with its id, type, index and name (no arguments key), then its
        arguments in fragments of `fragment` characters (at least 2, at most 16 fragments: shorter
        ones for short arguments, longer ones for long arguments); the last chunk has `finish_reason` ("tool_calls"; "stop" for a named
        tool_choice). Then the end as `end` has it (usage, [DONE])."""
        deltas: list[dict[str, Any]] = []
        for index, call in enumerate(calls):
            deltas.append(
                {"id": call.id, "type": "function", "index": index, "function": {"name": call.name}}
            )
            # 2 to 16 fragments, as a model's tokens come (a last one carries the finish reason)
            step = max(1, min(max(fragment, -(-len(call.arguments) // 16)), -(-len(call.arguments) // 2)))
            for at in range(0, len(call.arguments), step):
                deltas.append({"index": index, "function": {"arguments": call.arguments[at : at + step]}})
        chunks: list[bytes] = []
        for n, delta in enumerate(deltas):
            self.tokens += 1
            last = n == len(deltas) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": None, "tool_calls": [delta]},
                "logprobs": None,
                "finish_reason": finish_reason if last else None,
            }
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            if not last:
                chunks.append(self._chunk(choice))
            elif self.include_usage:
                usage = _usage(self.prompt_tokens, self.tokens, details=False)
                chunks += [
                    self._chunk(choice),
                    self._chunk(None, usage=usage, system_fingerprint=SYSTEM_FINGERPRINT),
                ]
            else:
                chunks.append(self._chunk(choice, system_fingerprint=SYSTEM_FINGERPRINT))
        return [*chunks, sse("[DONE]")]

    def end(self, last: str, finish_reason: str = "stop") -> list[bytes]:
        self._count(last)
        choice = {
            "index": 0,
            "delta": {"content": last},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": None,
        }
        if not self.include_usage:
            return [self._chunk(choice, system_fingerprint=SYSTEM_FINGERPRINT), sse("[DONE]")]
        usage = _usage(self.prompt_tokens, self.tokens, details=False)
        return [
            self._chunk(choice),
            self._chunk(None, usage=usage, system_fingerprint=SYSTEM_FINGERPRINT),
            sse("[DONE]"),
        ]


class CompletionStream(Stream):
    """`text_completion` chunks: one per piece (the last with `finish_reason`), a usage chunk with
    `stream_options.include_usage`, then `data: [DONE]`."""

    def __init__(self, model: str, prompt_tokens: int, include_usage: bool = False) -> None:
        super().__init__(model, prompt_tokens)
        self.id = new_id("cmpl-")
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        head = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}
        return sse({**head, "choices": choices, **extra})

    def _choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }

    def piece(self, text: str) -> bytes:
        self._count(text)
        return self._chunk([self._choice(text, None)])

    def end(self, last: str, finish_reason: str = "stop") -> list[bytes]:
        self._count(last)
        final = self._choice(last, finish_reason)
        if not self.include_usage:
            return [self._chunk([final], system_fingerprint=SYSTEM_FINGERPRINT), sse("[DONE]")]
        usage = _usage(self.prompt_tokens, self.tokens, details=False)
        return [
            self._chunk([final]),
            self._chunk([], usage=usage, system_fingerprint=SYSTEM_FINGERPRINT),
            sse("[DONE]"),
        ]


class ResponsesStream(Stream):
    """Responses API events, each with its `event:` line and a `sequence_number`: created,
    in_progress, output_item.added, content_part.added, one output_text.delta per piece,
    output_text.done, content_part.done, output_item.done, completed. No `[DONE]`."""

    def __init__(self, model: str, prompt_tokens: int, body: dict[str, Any], max_model_len: int) -> None:
        super().__init__(model, prompt_tokens)
        self.body = body
        self.max_model_len = max_model_len
        self.id = new_id("resp_")
        self.item_id = new_id("msg_")
        self.sequence = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = dict(sorted({**fields, "sequence_number": self.sequence, "type": kind}.items()))
        self.sequence += 1
        return sse(payload, event=kind)

    def _response(
        self, finish_reason: str | None, output: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        g = Generated(self.model, self.text, self.prompt_tokens, self.tokens, finish_reason or "stop")
        return response(
            self.body,
            g,
            self.max_model_len,
            response_id=self.id,
            created=self.created,
            output=output,
            done=finish_reason is not None,
        )

    def start(self) -> list[bytes]:
        item = _output_item(self.item_id, [], "in_progress")
        return [
            self._event("response.created", response=self._response(None)),
            self._event("response.in_progress", response=self._response(None)),
            self._event("response.output_item.added", item=item, output_index=0),
            self._event(
                "response.content_part.added",
                content_index=0,
                item_id=self.item_id,
                output_index=0,
                part=_output_part("", []),
            ),
        ]

    def piece(self, text: str) -> bytes:
        self._count(text)
        return self._event(
            "response.output_text.delta",
            content_index=0,
            delta=text,
            item_id=self.item_id,
            logprobs=[],
            output_index=0,
        )

    def end(self, last: str, finish_reason: str = "stop") -> list[bytes]:
        events = [self.piece(last)] if last else []
        part = _output_part(self.text)
        item = _output_item(self.item_id, [part], "completed")
        return [
            *events,
            self._event(
                "response.output_text.done",
                content_index=0,
                item_id=self.item_id,
                logprobs=[],
                output_index=0,
                text=self.text,
            ),
            self._event(
                "response.content_part.done", content_index=0, item_id=self.item_id, output_index=0, part=part
            ),
            self._event("response.output_item.done", item=item, output_index=0),
            self._event("response.completed", response=self._response(finish_reason, [item])),
        ]

    def engine_died(self) -> tuple[list[bytes], bool]:
        return [], False  # the exception escapes the generator: uvicorn drops the connection


class MessagesStream(Stream):
    """Anthropic events, each with its `event:` line: message_start, content_block_start, one
    content_block_delta per piece, content_block_stop, message_delta, message_stop (no ping)."""

    def __init__(self, model: str, prompt_tokens: int) -> None:
        super().__init__(model, prompt_tokens)
        self.id = new_id("chatcmpl-")

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, event=kind)

    def start(self) -> list[bytes]:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [
            self._event("message_start", message=message),
            self._event("content_block_start", content_block={"type": "text", "text": ""}, index=0),
        ]

    def piece(self, text: str) -> bytes:
        self._count(text)
        return self._event("content_block_delta", delta={"type": "text_delta", "text": text}, index=0)

    def end(self, last: str, finish_reason: str = "stop") -> list[bytes]:
        events = [self.piece(last)] if last else []
        delta = {"stop_reason": _STOP_REASONS.get(finish_reason, finish_reason), "stop_sequence": None}
        return [
            *events,
            self._event("content_block_stop", index=0),
            self._event(
                "message_delta",
                delta=delta,
                usage={"input_tokens": self.prompt_tokens, "output_tokens": self.tokens},
            ),
            self._event("message_stop"),
        ]

    def engine_died(self) -> tuple[list[bytes], bool]:
        error = {"type": "error", "error": {"type": "internal_error", "message": MESSAGES_ENGINE_DEAD}}
        return [sse(error, event="error")], True

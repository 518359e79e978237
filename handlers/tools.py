"""`GET /tools` and `POST /tools` (docs/tools.md): the enabled tools, and one call of one of them.

Off by default: without `--tools` or `--tools-mcp-config` both answer a JSON 404, for everyone.
On, a caller needs a key with the `tools` scope (Surface.TOOLS): another scope, or the admin
token, is no credential here (401, counted by surface, never audited). Every error is
`{"error": "…"}`. A POST's body, at most `BODY_LIMIT` bytes, is `{"tool": str, "params": object,
"stream"?: bool}`; `params` at most `PARAMS_MAX_BYTES` as compact JSON.

A call that reached a known tool is audited once, with its outcome as the status (200 ok, 422 the
tool answered an error, 504 its time limit, 499 the client left, 400/404/429 refused), its key and
duration: never its arguments or its output. A client that leaves stops the call (its task is
cancelled: exec_shell_command's process group is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import tornado.web
from tornado.iostream import StreamClosedError

from handlers.base import JsonHandler
from vllm_use.errors import InvalidArguments, NotFound, Unauthenticated, VllmUseError
from vllm_use.gateway.audit import new_audit_id, request_id_or
from vllm_use.scopes import Identity, Surface
from vllm_use.tools.base import PARAMS_MAX_BYTES, Result, Tool, ToolError
from vllm_use.tools.toolbox import Toolbox

log = logging.getLogger(__name__)

BODY_LIMIT = 128 * 1024
FIELDS = {"tool": str, "params": dict, "stream": bool}
# The audit status of each outcome (docs/tools.md).
OK, TOOL_ERROR, TIMED_OUT, CLIENT_GONE, FAILED = 200, 422, 504, 499, 500


def parse_call(body: bytes) -> tuple[str, dict[str, Any], bool]:
    """The call in a POST body, or InvalidArguments naming the field (`check_params` follows)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArguments("the body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidArguments("the body must be a JSON object")
    for name in doc:
        if name not in FIELDS:
            raise InvalidArguments(f"{name}: unknown field (tool, params, stream)", errors=[{"loc": [name]}])
    for name, kind in FIELDS.items():
        if name == "stream" and name not in doc:
            continue
        if not isinstance(doc.get(name), kind):
            what = {"tool": "a string", "params": "a JSON object", "stream": "true or false"}[name]
            raise InvalidArguments(f"{name}: must be {what}", errors=[{"loc": [name]}])
    return doc["tool"], doc["params"], bool(doc.get("stream", False))


def check_params(params: dict[str, Any]) -> None:
    """At most `PARAMS_MAX_BYTES` as compact UTF-8 JSON, else InvalidArguments."""
    size = len(json.dumps(params, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace"))
    if size > PARAMS_MAX_BYTES:
        raise InvalidArguments(
            f"params: larger than {PARAMS_MAX_BYTES} bytes as compact JSON", errors=[{"loc": ["params"]}]
        )


@tornado.web.stream_request_body
class ToolsHandler(JsonHandler):
    surface = Surface.TOOLS
    body_limit = BODY_LIMIT

    def initialize(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.toolbox: Toolbox | None = self.app.tools
        self.started = time.perf_counter()
        self.audit_id = new_audit_id()
        self.tool: Tool | None = None  # once the call names a known tool: audited
        self.streamed = False
        self.outcome: int | None = None
        self._task: asyncio.Future[Any] | None = None
        self._client_gone = False

    async def before_body(self) -> None:
        if self.toolbox is None:
            raise NotFound("the tools API is off (docs/tools.md: --tools)")
        await super().before_body()

    async def authenticate(self) -> Identity:
        identity = await super().authenticate()  # counts a refusal under Surface.TOOLS
        if identity.key_id is None:  # the admin token is valid on /api only; fail closed anyway
            self.app.auth.failures.record(self.surface)
            raise Unauthenticated("this credential is not valid here")
        return identity

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Replaces JsonHandler's: /tools answers `{"error": message}`, the shape a tool message takes.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.error_headers(exc)
        if status_code == 405:
            self.set_header("Allow", "GET, POST")
        message = exc.message if isinstance(exc, VllmUseError) else (self._reason or "error")
        if status_code >= 500 and not isinstance(exc, VllmUseError):
            message = "internal error (see the server log)"
        self.finish(json.dumps({"error": message}, ensure_ascii=False))

    async def get(self) -> None:
        assert self.toolbox is not None
        self.write_json([tool.listing() for tool in await self.toolbox.tools()])

    async def post(self) -> None:
        assert self.toolbox is not None and self.identity is not None and self.identity.key_id is not None
        try:
            name, params, stream = parse_call(self.body)
            tool = await self.toolbox.find(name)
            if tool is None:
                raise NotFound(f"no tool {name[:100]!r} is enabled here (GET /tools lists them)")
            self.tool, self.streamed = tool, stream
            check_params(params)
            if not tool.available:
                raise NotFound(
                    f"the tool {name} is not available now: {tool.extra.get('error', 'its server is down')}"
                )
            if stream and tool.stream is None:
                raise NotFound(f"the tool {name} cannot stream; call it without stream")
            with self.toolbox.admit(self.identity.key_id):
                self._task = asyncio.ensure_future(
                    self._run_stream(tool, params) if stream else self._run(tool, params)
                )
                await self._task
        except VllmUseError as exc:
            self.outcome = exc.http_status
            self.fail(exc)
        except asyncio.CancelledError:
            self.outcome = CLIENT_GONE  # on_connection_close cancelled the call
            if not self._finished:
                self.finish()

    async def _run(self, tool: Tool, params: dict[str, Any]) -> None:
        assert self.toolbox is not None
        limit = self.toolbox.time_limit(tool)
        try:
            async with asyncio.timeout(limit):
                result: Result = await self.toolbox.call(tool, params)
        except ToolError as exc:
            self.outcome = TOOL_ERROR
            self.write_json({"error": exc.message})
            return
        except TimeoutError:
            self.outcome = TIMED_OUT
            self.write_json({"error": f"the tool did not finish within its time limit ({limit:g} s)"})
            return
        except Exception:
            log.exception("tool %s failed", tool.name)
            self.outcome = FAILED
            self.write_json({"error": "the tool failed (see the server log)"})
            return
        self.outcome = OK
        self.write_json({"plain_text_response": result} if isinstance(result, str) else result)

    async def _run_stream(self, tool: Tool, params: dict[str, Any]) -> None:
        assert self.toolbox is not None
        limit = self.toolbox.time_limit(tool)
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        end: dict[str, Any] = {"done": True}
        try:
            # aclosing: the tool stops (its group killed) here, even when the flush was what failed
            async with (
                asyncio.timeout(limit),
                contextlib.aclosing(self.toolbox.stream(tool, params)) as chunks,
            ):
                async for chunk in chunks:
                    await self._event({"chunk": chunk})
            self.outcome = OK
        except ToolError as exc:
            self.outcome, end["error"] = TOOL_ERROR, exc.message
        except TimeoutError:
            self.outcome, end["error"] = (
                TIMED_OUT,
                f"the tool did not finish within its time limit ({limit:g} s)",
            )
        except StreamClosedError:
            self.outcome = CLIENT_GONE
            return
        except Exception:
            log.exception("tool %s failed", tool.name)
            self.outcome, end["error"] = FAILED, "the tool failed (see the server log)"
        self.finish(self._frame(end))

    @staticmethod
    def _frame(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

    async def _event(self, payload: dict[str, Any]) -> None:
        """Write one event and wait for the flush (backpressure: the tool's next chunk waits)."""
        self.write(self._frame(payload))
        await self.flush()

    def on_connection_close(self) -> None:
        super().on_connection_close()  # fails a body read still pending
        self._client_gone = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def on_finish(self) -> None:
        """Audit a call that reached a known tool (docs/tools.md): never its params or output."""
        super().on_finish()
        if self.tool is None or self.identity is None:
            return
        status = CLIENT_GONE if self._client_gone and self.outcome in (None, OK) else self.outcome
        self.app.audit.record(
            audit_id=self.audit_id,
            request_id=request_id_or(self.request.headers.get("X-Request-ID"), self.audit_id),
            key_id=self.identity.key_id,
            method="POST",
            path=f"/tools/{self.tool.name}",
            model=None,
            status=status or self.get_status(),
            duration_ms=(time.perf_counter() - self.started) * 1000,
            stream=self.streamed,
        )


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/tools", ToolsHandler, common)]

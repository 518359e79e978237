"""The base handler of the JSON surfaces (/api, /mcp): headers, body cap, auth, errors.

- Every response, errors included, carries `Cache-Control: no-store` and
  `Pragma: no-cache` (`set_default_headers` also runs again after `clear()`).
- Bodies are streamed in and capped at `BODY_LIMIT` whatever the
  Content-Type (413), counted as they arrive and never buffered past the cap.
  A `Content-Length` that is not ASCII digits is a 400.
- `prepare()` authenticates before any body is read, fail closed: only a route
  marked `public` skips it (and nothing under /api or /mcp is).
- A request refused before its body is read (401, 403, 413, 400 …) is answered
  at once and never drained: with a body coming, the answer carries
  `Connection: close` and the connection closes lingering (handlers/server.py),
  so a client that already sent a small body still reads it; without one, the
  answer goes out as the verb's and the connection stays open for the next
  request. A body that passes the cap while it streams in is refused the same way.
- `write_error` maps the error tree (vllm_use.errors) to HTTP once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import tornado.web
from tornado.log import access_log

from handlers.connection import RequestConnection
from vllm_use.context import AppContext
from vllm_use.errors import (
    InvalidArguments,
    PayloadTooLarge,
    PermissionDenied,
    TooManyRequests,
    Unauthenticated,
    VllmUseError,
)
from vllm_use.executor import Executor
from vllm_use.keys.authenticator import parse_bearer
from vllm_use.scopes import Identity, MethodScope, Surface

log = logging.getLogger(__name__)

BODY_LIMIT = 1024 * 1024  # /api and /mcp; the gateway has its own 16 MiB cap
_DECIMAL = re.compile(r"[0-9]{1,18}")  # str.isdigit() also takes "²" or "٣", which int() refuses


def _forget_traceback(future: asyncio.Future[None]) -> None:
    error = future.exception()
    if error is not None:
        error.__traceback__ = None


@tornado.web.stream_request_body
class JsonHandler(tornado.web.RequestHandler):
    """Base of every /api, /mcp and /v1 handler. Subclasses set `surface`."""

    surface: Surface = Surface.API
    public = False
    body_limit = BODY_LIMIT
    # The scope a handler requires of every caller, checked here after authentication (403 when
    # missing). None: the handler's calls go through the executor, which checks each method's own.
    required: MethodScope | None = None

    def _too_large_error(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body is larger than {self.body_limit} bytes", limit=self.body_limit)

    def initialize(self, app: AppContext, executor: Executor, **kwargs: Any) -> None:
        super().initialize()
        self.app = app
        self.executor = executor
        self.identity: Identity | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._discard = False

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")
        self.set_header("Pragma", "no-cache")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Type", "application/json; charset=utf-8")

    # --- body --------------------------------------------------------------------------------

    def check_body_size(self) -> None:
        """413 for a declared length over the cap; 400 for one that is not a decimal number."""
        declared = self.request.headers.get_list("Content-Length")
        if not declared:
            return
        if len(declared) != 1 or not _DECIMAL.fullmatch(declared[0]):
            raise InvalidArguments(
                "Content-Length must be one decimal number of bytes", errors=[{"loc": ["Content-Length"]}]
            )
        if int(declared[0]) > self.body_limit:
            raise self._too_large_error()

    def data_received(self, chunk: bytes) -> None:
        # Replaces the base, which raises NotImplementedError (it is the streaming hook).
        if self._discard:
            return
        self._size += len(chunk)
        if self._size > self.body_limit:  # a chunked body, or one longer than it said
            self._chunks.clear()
            self.refuse(self._too_large_error())
            return
        self._chunks.append(chunk)

    def on_connection_close(self) -> None:
        # A request cut mid-body never reaches `finish()`, where Tornado breaks the handler's
        # reference cycles, and makes one more: the body read fails with an exception whose
        # traceback holds `_execute`'s frame, which holds the handler. Both are broken here, so the
        # handler and the body it held are freed at once, not at the next full garbage collection
        # (tests/test_http_hardening.py). The JSON surfaces render no templates: `ui` is not used.
        super().on_connection_close()  # fails the pending body read
        self.ui = None
        body = getattr(self.request, "_body_future", None)
        if body is not None and body.done() and not body.cancelled() and body.exception() is not None:
            # After `_execute` has taken the failure (its wake-up was queued first).
            asyncio.get_running_loop().call_soon(_forget_traceback, body)

    @property
    def body(self) -> bytes:
        if self._size > self.body_limit:
            raise self._too_large_error()
        return b"".join(self._chunks)

    def _body_expected(self) -> bool:
        headers = self.request.headers
        return "Transfer-Encoding" in headers or headers.get("Content-Length", "0") != "0"

    # --- auth --------------------------------------------------------------------------------

    async def authenticate(self) -> Identity:
        """The caller's identity on this surface, or Unauthenticated (401) / AuthBusy (429).

        Every refusal is counted by surface (`Authenticator.failures`), never written as a
        record: a flood of bad credentials must not evict real audit records (docs/auth.md).
        """
        try:
            token = parse_bearer(self.request.headers.get_list("Authorization"))
            identity = await self.app.auth.authenticate(token)
            if not identity.valid_on(self.surface):
                raise Unauthenticated("this credential is not valid here")
        except (Unauthenticated, TooManyRequests):
            self.app.auth.failures.record(self.surface)
            raise
        return identity

    async def prepare(self) -> None:
        """Runs once the headers are in. A refusal with a body coming is answered at once
        (`refuse`); without one it becomes the verb's answer, keeping the connection."""
        base = super().prepare()
        if base is not None:
            await base
        try:
            await self.before_body()
        except VllmUseError as exc:
            if self._body_expected():
                self.refuse(exc)
            else:
                self.answer_after_body(exc)

    async def before_body(self) -> None:
        """Checks that run once the headers are in, before the body is read: size cap, then auth."""
        self.check_body_size()
        if not self.public:
            self.identity = await self.authenticate()
            if self.required is not None and not self.identity.may_call(self.required, self.surface):
                raise PermissionDenied(f"{self.required.for_surface(self.surface)} is required")

    def refuse(self, exc: VllmUseError) -> None:
        """Answer `exc` now, whatever of the body is still coming, and close the connection.

        The answer is complete (Content-Length) and says `Connection: close`; Tornado sends no
        `100 Continue` after it, drops what arrives and closes the connection once the answer is
        written. The close lingers (handlers/server.py): a client still sending the small body it
        announced reads the answer instead of a reset.
        """
        connection = self.request.connection
        if isinstance(connection, RequestConnection):  # another server (a test's) closes plainly
            connection.linger_after_close()
        self._discard = True
        self._chunks.clear()
        self.clear()
        self.set_status(exc.http_status)
        self.set_header("Connection", "close")
        self.write_error(exc.http_status, exc_info=(type(exc), exc, None))
        if not self._finished:
            self.finish()

    def answer_after_body(self, exc: VllmUseError) -> None:
        """Answer `exc` instead of running the verb method, for a request without a body.

        Finishing inside prepare() makes Tornado close the connection (it cannot know no body
        follows), which a keep-alive client is about to reuse. So the verb method is swapped
        for this answer, which runs at once: there is no body to wait for.
        """
        self._discard = True
        verb = (self.request.method or "get").lower()

        def answer(*args: object, **kwargs: object) -> None:
            self.fail(exc)

        setattr(self, verb, answer)

    def fail(self, exc: VllmUseError) -> None:
        """Answer with `exc` now (from prepare or a verb method)."""
        self.send_error(exc.http_status, exc_info=(type(exc), exc, None))

    # --- responses ---------------------------------------------------------------------------

    def write_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))

    def allowed_verbs(self) -> list[str]:
        """The verbs this path serves, for the `Allow` header of a 405."""
        return [v for v in ("GET", "POST", "PUT", "PATCH", "DELETE") if type(self).__dict__.get(v.lower())]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Replaces the base, which writes an HTML page: every error here is the JSON document.
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_verbs()))
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.error_headers(exc)
        if isinstance(exc, VllmUseError):
            payload = exc.to_json()
        elif isinstance(exc, tornado.web.HTTPError) or exc is None:
            reason = self._reason or "error"
            code = (
                "method_not_allowed"
                if status_code == 405
                else "not_found"
                if status_code == 404
                else "http_error"
            )
            payload = {"error": {"code": code, "message": reason}}
        else:
            payload = {"error": {"code": "internal_error", "message": "internal error (see the server log)"}}
        self.finish(json.dumps(payload, separators=(",", ":")))

    def error_headers(self, exc: BaseException | None) -> None:
        """Headers an error answer carries whatever its body's shape (call from `write_error`:
        headers set before `send_error` are cleared). A refusal that says when to retry (429, 503)
        gets `Retry-After`; a missing credential gets `WWW-Authenticate`."""
        if isinstance(exc, Unauthenticated):
            self.set_header("WWW-Authenticate", 'Bearer realm="vllm-use"')
        retry = exc.details.get("retry_after_s") if isinstance(exc, VllmUseError) else None
        if isinstance(retry, int) and retry > 0:
            self.set_header("Retry-After", str(retry))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # Client errors are warnings without tracebacks (the base would log a traceback for each);
        # server errors get the base's.
        if isinstance(value, VllmUseError) and value.http_status < 500:
            log.warning(
                "%s %s -> %s %s", self.request.method, self.request.path, value.http_status, value.code
            )
        else:
            super().log_exception(typ, value, tb)


@tornado.web.stream_request_body
class NotFoundJson(JsonHandler):
    """An unknown path under /api, /mcp or /v1: a JSON 404, never the SPA."""

    public = True

    def _missing(self, *args: Any) -> None:
        self.set_status(404)
        self.finish(json.dumps({"error": {"code": "not_found", "message": f"no route {self.request.path}"}}))

    get = post = put = delete = patch = head = options = _missing


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The Application's `log_function` under `--log-format json`: Tornado's access line, the same
    text at the same levels, with the fields the JSON line carries (vllm_use/jsonlog.py): the request
    id and the status the audit records on /v1 (`GatewaySurface.final_status`), the key, the outcome
    and the time. (The text format keeps Tornado's own `log_request`.)"""
    sent = handler.get_status()
    final = getattr(handler, "final_status", None)
    status = final() if final is not None else sent
    identity = getattr(handler, "identity", None)
    request = handler.request
    ms = 1000.0 * request.request_time()
    outcome = "ok" if status < 400 else "client_gone" if status == 499 else f"http_{status}"
    fields = {
        "request_id": getattr(handler, "request_id", None),
        "method": request.method,
        "path": request.path,
        "status": status,
        "key_id": identity.label if identity is not None else None,
        "outcome": outcome,
        "ms": round(ms, 2),
    }
    level = logging.INFO if sent < 400 else logging.WARNING if sent < 500 else logging.ERROR
    summary = f"{request.method} {request.uri} ({request.remote_ip})"
    access_log.log(level, "%d %s %.2fms", sent, summary, ms, extra=fields)

"""The base handler of the JSON surfaces (/api, /mcp): headers, body cap, auth, errors.

- Every response, errors included, carries `Cache-Control: no-store` and
  `Pragma: no-cache` (`set_default_headers` also runs again after `clear()`).
- Bodies are streamed in and capped at `BODY_LIMIT` whatever the
  Content-Type (413). What passes the cap is dropped as it arrives, never
  buffered; the answer is sent once the client has finished sending, so it
  reads the 413 instead of a connection reset. The server-wide
  `max_body_size` (app.py) bounds how much is drained.
- `prepare()` authenticates before any body is read, fail closed: only a route
  marked `public` skips it (and nothing under /api or /mcp is).
- `write_error` maps the error tree (vllm_use.errors) to HTTP once.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.web

from vllm_use.auth import parse_bearer
from vllm_use.context import AppContext
from vllm_use.errors import PayloadTooLarge, Unauthenticated, VllmUseError
from vllm_use.executor import Executor
from vllm_use.scopes import Identity, Surface

log = logging.getLogger(__name__)

BODY_LIMIT = 1024 * 1024  # /api and /mcp; the gateway has its own 16 MiB cap


class JsonHandler(tornado.web.RequestHandler):
    """Base of every /api and /mcp handler. Subclasses set `surface`."""

    surface: Surface = Surface.API
    public = False
    body_limit = BODY_LIMIT

    def _too_large_error(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body is larger than {self.body_limit} bytes", limit=self.body_limit)

    def initialize(self, app: AppContext, executor: Executor, **kwargs: Any) -> None:
        self.app = app
        self.executor = executor
        self.identity: Identity | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._discard = False

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("Pragma", "no-cache")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Type", "application/json; charset=utf-8")

    # --- body --------------------------------------------------------------------------------

    def check_body_size(self) -> None:
        declared = self.request.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > self.body_limit:
            raise self._too_large_error()

    def data_received(self, chunk: bytes) -> None:
        if self._too_large or self._discard:
            return
        self._size += len(chunk)
        if self._size > self.body_limit:
            self._too_large = True
            self._chunks.clear()
            return
        self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        if self._too_large:
            raise self._too_large_error()
        return b"".join(self._chunks)

    # --- auth --------------------------------------------------------------------------------

    async def authenticate(self) -> Identity:
        """The caller's identity on this surface, or Unauthenticated (401)."""
        token = parse_bearer(self.request.headers.get_list("Authorization"))
        identity = await self.app.auth.authenticate(token)
        if not identity.valid_on(self.surface):
            raise Unauthenticated("this credential is not valid here")
        return identity

    async def prepare(self) -> None:
        try:
            await self.before_body()
        except VllmUseError as exc:
            self.answer_after_body(exc)

    async def before_body(self) -> None:
        """Checks that run once the headers are in, before the body is read: size cap, then auth.

        A body over the cap is still read (and dropped) up to the server's max_body_size:
        closing while the client is still sending makes the kernel reset the connection, and
        the client would never see the 413.
        """
        self.check_body_size()
        if not self.public:
            self.identity = await self.authenticate()

    def answer_after_body(self, exc: VllmUseError) -> None:
        """Answer `exc` instead of running the verb method, once the (discarded) body is read.

        Finishing inside prepare() would leave the body unread, and Tornado would then close a
        keep-alive connection the client is about to reuse. So the verb method is swapped for
        this answer, and data_received drops what arrives meanwhile.
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
        return [v for v in ("GET", "POST", "PUT", "DELETE") if type(self).__dict__.get(v.lower())]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_verbs()))
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, VllmUseError):
            if isinstance(exc, Unauthenticated):
                self.set_header("WWW-Authenticate", 'Bearer realm="vllm-use"')
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

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # Client errors are warnings without tracebacks; server errors get them.
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

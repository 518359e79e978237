"""The inference gateway `/v1/*` (docs/gateway.md): authenticated, streaming, cancellable, audited.

Per request: auth (one Bearer key with `inference`; on `/v1/messages*` one
`X-API-Key` instead) before the body is read → the body, capped at 16 MiB
whatever its Content-Type → the `model` alias rewritten in place (and a stream's
usage event asked for) → the upstream request (no environment proxy, no
redirects, client credentials dropped, our upstream key injected) → status and
headers relayed with cache headers replaced → each chunk written as it arrives,
the rest of a stream from the upstream connection's callback (backpressure: the
upstream is not read while our client's writes wait), its token
counts read by the usage tap (docs/observability.md). A client that goes away aborts the upstream request
at once, unless the request is attached to a resumable stream (X-Conversation-Id).
Errors use the OpenAI shape, or the Anthropic shape on `/v1/messages*`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import tornado.web
from tornado.iostream import StreamClosedError

from handlers.base import JsonHandler
from handlers.connection import RequestConnection
from vllm_use.errors import (
    Conflict,
    InvalidArguments,
    ModelNotFound,
    NotFound,
    OffsetGone,
    PayloadTooLarge,
    RateLimited,
    RuntimeFailed,
    StreamArgumentError,
    TooManyRequests,
    Unauthenticated,
    UpstreamError,
    UpstreamUnavailable,
    VllmUseError,
)
from vllm_use.gateway import streams
from vllm_use.gateway.aliases import Usage, prepare_async
from vllm_use.gateway.audit import new_audit_id, request_id_or
from vllm_use.gateway.headers import RESPONSE_DROP, forward_headers
from vllm_use.gateway.streams import StreamSession
from vllm_use.gateway.upstream import Exchange
from vllm_use.keys.authenticator import parse_bearer
from vllm_use.scopes import Identity, Surface
from vllm_use.usage.tap import Tap, tap_for

log = logging.getLogger(__name__)

BODY_LIMIT = 16 * 1024 * 1024
POST_PATHS = (
    "chat/completions",
    "completions",
    "responses",
    "embeddings",
    "messages",
    "messages/count_tokens",
)
# The streams whose usage event vLLM sends only when asked: the gateway asks (docs/observability.md).
USAGE_ASKED = ("chat/completions", "completions")
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    502: "api_error",
    500: "api_error",
    400: "invalid_request_error",
}


class _ClientLeft(Exception):
    """Raised by `RelayHandler._piece` to end a relay whose client went away (nothing attached)."""


def _content_type(upstream: Exchange) -> str:
    return next((value for name, value in upstream.headers if name.lower() == "content-type"), "")


def _upstream_lost_event(anthropic: bool) -> bytes:
    """The last event of a stream the upstream cut (docs/gateway.md): the OpenAI SDKs raise on a
    `data: {"error": …}` event, Anthropic's on `event: error`. It starts with a blank line, so that
    it stands alone even if the upstream broke off inside an event (SSE parsers skip blank lines)."""
    message = "upstream connection lost"
    if anthropic:
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"\n\nevent: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    error = {"message": message, "type": "api_error", "param": None, "code": UpstreamUnavailable.code}
    return b"\n\ndata: " + json.dumps({"error": error}).encode() + b"\n\n"


class GatewaySurface(JsonHandler):
    """What every `/v1` handler shares: an `inference` key (registered in `app.live` while the
    request runs), the request id, the OpenAI or Anthropic error shape, and one audit record per
    authenticated request. `RelayHandler` and `StreamHandler` are its two kinds of request."""

    surface = Surface.GATEWAY
    body_limit = BODY_LIMIT

    def initialize(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.started = time.perf_counter()
        self.audit_id = new_audit_id()
        self.request_id = request_id_or(self.request.headers.get("X-Request-ID"), self.audit_id)
        self.model_sent: str | None = None
        self.streamed = False
        self._client_gone = False
        self._upstream_broke = False
        self._stopped = False  # canceled by DELETE /v1/stream
        # What the observers read in on_finish (docs/observability.md): the deployment that served
        # the request (router mode), the tokens of the response's usage (None: not known) and when
        # its first byte went out (perf_counter).
        self.deployment: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.first_byte_at: float | None = None
        # A key with a policy (vllm_use/keys/limits.py): its x-ratelimit-* headers, and whether this
        # request holds one of its slots (given back in on_finish).
        self._limit_headers: list[tuple[str, str]] = []
        self._holds_slot = False
        # set_default_headers ran in __init__, before request_id existed (it runs again after clear()).
        self.set_header("X-Request-ID", self.request_id)

    @property
    def anthropic(self) -> bool:
        return self.request.path.startswith("/v1/messages")

    def set_default_headers(self) -> None:
        super().set_default_headers()
        if hasattr(self, "request_id"):  # not yet in __init__: initialize sets it
            self.set_header("X-Request-ID", self.request_id)

    # --- before the body: the size cap is JsonHandler's, with body_limit = 16 MiB -------------

    async def authenticate(self) -> Identity:
        """One `inference` key, or Unauthenticated (401) / AuthBusy (429).

        A refusal is counted by surface (`Authenticator.failures`), never audited: only
        authenticated requests become audit records, so a flood cannot evict them. An accepted
        request is registered in `app.live` (removed in `on_finish`), so disabling or deleting its
        key closes it; nothing awaits between the verification and the registration.
        """
        try:
            bearer = self.request.headers.get_list("Authorization")
            api_key = self.request.headers.get_list("X-API-Key")
            if bearer and api_key:
                raise Unauthenticated("send either Authorization: Bearer or X-API-Key, not both")
            if api_key:
                if not self.anthropic or len(api_key) != 1:
                    raise Unauthenticated("X-API-Key is accepted once, on /v1/messages only")
                token = parse_bearer([f"Bearer {api_key[0]}"])
            else:
                token = parse_bearer(bearer)
            identity = await self.app.auth.authenticate(token)
            if not identity.valid_on(Surface.GATEWAY) or identity.key_id is None:
                raise Unauthenticated("this credential is not an inference key")
        except (Unauthenticated, TooManyRequests):
            self.app.auth.failures.record(Surface.GATEWAY)
            raise
        connection = self.request.connection
        if isinstance(connection, RequestConnection):
            closed = connection.closed
        else:  # Tornado's own HTTP1Connection (a test's server)
            stream = getattr(connection, "stream", None)

            def closed() -> bool:
                return stream is not None and stream.closed()

        self._live_token = self.app.live.add(identity.key_id, connection.close, closed)
        return identity

    # --- errors --------------------------------------------------------------------------------

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Replaces JsonHandler's: the OpenAI or Anthropic error shape, not ours.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.message if isinstance(exc, VllmUseError) else (self._reason or "error")
        self.error_headers(exc)
        if status_code == 405:
            self.set_header("Allow", "POST" if self.request.path != "/v1/models" else "GET")
        if self.anthropic:
            kind = _ANTHROPIC_TYPES.get(status_code, "api_error")
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            code = exc.code if isinstance(exc, VllmUseError) else "error"
            kind = "invalid_request_error" if status_code < 500 else "api_error"
            if isinstance(exc, RateLimited):  # as OpenAI's: which kind of limit was reached
                kind = "tokens" if exc.limit == "tokens" else "requests"
            payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self.finish(json.dumps(payload))

    def error_headers(self, exc: BaseException | None) -> None:
        super().error_headers(exc)
        if isinstance(exc, RateLimited):
            for name, value in exc.headers:
                self.set_header(name, value)

    # --- the end -------------------------------------------------------------------------------

    def on_connection_close(self) -> None:
        # The base fails a body read still pending: without it, a client that hangs up mid-body
        # leaves this handler (and the body so far) waiting forever.
        super().on_connection_close()
        if self._upstream_broke or self._stopped:
            return  # we closed it
        self._client_gone = True

    def final_status(self) -> int:
        """The status the audit and the access line record: 502 when the upstream broke off, 499
        when the client went away (or DELETE /v1/stream stopped it), else the one sent."""
        return (
            502 if self._upstream_broke else 499 if self._client_gone or self._stopped else self.get_status()
        )

    def on_finish(self) -> None:
        """Tornado runs this once the response is done (or the connection closed under it):
        count it in the metrics, forget it in `app.live` and audit it. A request refused before a
        key was recognised is counted but not audited: `authenticate` counted the refusal
        (docs/gateway.md, docs/observability.md)."""
        super().on_finish()
        status = self.final_status()
        duration_ms = (time.perf_counter() - self.started) * 1000
        first_byte = self.first_byte_at
        self.app.metrics.request_ended(
            self.request.path,
            self.deployment,
            status,
            duration_ms / 1000,
            None if first_byte is None else first_byte - self.started,
            self.prompt_tokens,
            self.completion_tokens,
        )
        identity = self.identity
        if identity is None or identity.key_id is None:
            return
        self.app.live.remove(identity.key_id, getattr(self, "_live_token", 0))
        if self._holds_slot:
            self.app.limits.release(identity.key_id)
        self.app.audit.record(
            audit_id=self.audit_id,
            request_id=self.request_id,
            key_id=identity.key_id,
            method=self.request.method or "",
            path=self.request.path,
            model=self.model_sent,
            status=status,
            duration_ms=duration_ms,
            stream=self.streamed,
            deployment=self.deployment,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
        )
        self.app.usage.add(identity.key_id, (self.prompt_tokens or 0) + (self.completion_tokens or 0))


@tornado.web.stream_request_body
class RelayHandler(GatewaySurface):
    """One `/v1` exchange relayed to the upstream: the inference routes and `/v1/models`."""

    def initialize(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self._upstream: Exchange | None = None
        self._headers_sent = False
        self.session: StreamSession | None = None
        self._usage: Usage = "none"
        self._tap: Tap | None = None  # reads the answer's token counts (vllm_use/usage/tap.py)
        self._flushed = False  # the head and a first piece were written and flushed

    async def post(self, path: str) -> None:
        if path == "models":
            raise tornado.web.HTTPError(405)
        try:
            raw = self.body
            # Off the IOLoop for big bodies: scanning 16 MiB takes a while (vllm_use/gateway/aliases.py).
            body, self.model_sent, self.streamed, self._usage = await prepare_async(
                raw, self.app.instances.aliases, add_usage=path in USAGE_ASKED
            )
        except (PayloadTooLarge, InvalidArguments) as exc:
            self.fail(exc)  # nothing was sent upstream
            return
        if self._client_gone:
            return
        assert self.identity is not None and self.identity.key_id is not None
        if self.identity.policy is not None:  # a model list or limits (docs/observability.md)
            try:
                self._limit_headers = self.app.limits.admit(
                    self.identity.key_id, self.identity.policy, self.model_sent
                )
            except (ModelNotFound, RateLimited) as exc:
                self.fail(exc)  # nothing was sent upstream
                return
            self._holds_slot = True
        conversation = self.request.headers.get_list(streams.HEADER)
        if conversation and path == "chat/completions":
            try:
                if len(conversation) != 1:
                    raise StreamArgumentError("send one X-Conversation-Id header", loc=["X-Conversation-Id"])
                conv_id, model = streams.parse_conversation_id(conversation[0])
                instances = self.app.instances
                named, sent = instances.deployment_of(model), instances.deployment_of(self.model_sent)
                if named is not None and named != sent:
                    # The stream would be kept under one deployment and generated by another.
                    raise StreamArgumentError(
                        f"X-Conversation-Id names the model {model}, the body {self.model_sent}: "
                        "they must be the same deployment",
                        loc=["X-Conversation-Id"],
                    )
                self.session = self.app.streams.create(conv_id, self.identity.key_id, model)
            except VllmUseError as exc:
                self.fail(exc)
                return
        try:
            await self._relay("POST", body)
        finally:
            if self.session is not None:
                self.session.finish()

    async def get(self, path: str) -> None:
        if path != "models":
            raise tornado.web.HTTPError(405)
        deployments = self.app.instances.listing()
        if not deployments:
            await self._relay("GET", None, rewrite=self._with_aliases)
            return
        # vllm-use answers, also while no vLLM runs: every deployment and alias, then the models of
        # the runtime (or --upstream) when it answers; a name listed twice is the deployment's.
        listed = {entry["id"] for entry in deployments}
        others = [entry for entry in await self._upstream_models() if entry.get("id") not in listed]
        self.set_header("Cache-Control", "no-store")
        self.write_json({"object": "list", "data": self._allowed(deployments + others)})

    def _allowed(self, entries: list[Any]) -> list[Any]:
        """The listed models a key with a model list may use: the others do not exist for it
        (docs/observability.md, "Key limits")."""
        policy = self.identity.policy if self.identity is not None else None
        if policy is None or policy.models is None:
            return entries
        allows = self.app.limits.allows
        return [e for e in entries if isinstance(e, dict) and allows(policy.models, str(e.get("id")))]

    async def _upstream_models(self) -> list[dict[str, Any]]:
        """The runtime's (or --upstream's) `/v1/models` entries with --model-aliases; [] when none
        answers (that is not an error here: the deployments are listed anyway)."""
        try:
            origin, key = self.app.upstream_target(None)
            headers = [("Accept", "application/json"), ("X-Request-ID", self.request_id)]
            if key:
                headers.append(("Authorization", f"Bearer {key}"))
            async with self.app.upstream_pool.stream("GET", origin + "/v1/models", headers) as upstream:
                payload = await upstream.read_all()
                ok = upstream.status == 200
        except (UpstreamUnavailable, UpstreamError) as exc:
            log.debug("no upstream models to list: %s", exc)
            return []
        try:
            entries = json.loads(self._with_aliases(payload))["data"] if ok else []
        except (ValueError, KeyError, TypeError, RecursionError):
            return []
        return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []

    def _with_aliases(self, payload: bytes) -> bytes:
        """`/v1/models` lists the aliases too, next to the upstream's own names."""
        try:
            listing = json.loads(payload)
            names = {m.get("id") for m in listing.get("data", [])}
        except (ValueError, AttributeError, RecursionError):  # not a listing: relayed as it came
            return payload
        for alias, target in self.app.config.model_aliases.items():
            if target in names and alias not in names:
                listing["data"].append(
                    {"id": alias, "object": "model", "owned_by": "vllm-use", "root": target}
                )
        listing["data"] = self._allowed(listing["data"])
        return json.dumps(listing).encode()

    async def _relay(self, method: str, body: bytes | None, rewrite: Any = None) -> None:
        deployment = self.deployment = self.app.instances.deployment_of(self.model_sent)
        loading = deployment is not None and self.app.instances.target(deployment) is None
        if deployment is not None and loading and not self.app.config.no_autoload:
            # Not a byte is sent until the instance is ready, so a failed load is still an error status.
            try:
                await self.app.instances.ensure_ready(deployment)
            except RuntimeFailed as exc:  # its last lines are the operator's, not the client's
                log.warning("deployment %s failed to load for a /v1 request: %s", deployment, exc.message)
                self.fail(UpstreamUnavailable(f"the model {self.model_sent} failed to load"))
                return
            except VllmUseError as exc:  # still loading, too many waiting, unloaded meanwhile
                self.fail(exc)
                return
            if self._client_gone and self.session is None:
                return  # an attached session goes on: its page comes back for the answer
        try:
            origin, upstream_key = self.app.upstream_target(self.model_sent)
        except (UpstreamUnavailable, Conflict, ModelNotFound) as exc:
            self.fail(exc)  # nothing was sent upstream
            return
        # A deployment's instance counts this request in flight: it is not idle until it ends.
        if deployment is not None:
            self.app.instances.begin(deployment)
        try:
            await self._relay_to(origin, upstream_key, method, body, rewrite)
        finally:
            if deployment is not None:
                self.app.instances.end(deployment)

    async def _relay_to(
        self, origin: str, upstream_key: str | None, method: str, body: bytes | None, rewrite: Any
    ) -> None:
        headers = forward_headers(list(self.request.headers.get_all()), upstream_key, self.request_id)
        upstream = self.app.upstream_pool.stream(method, origin + self.request.uri, headers.items(), body)
        self._upstream = upstream
        if self.session is not None:
            self.session.set_canceller(upstream.abort)
        try:
            async with upstream:
                if rewrite is not None:
                    payload = rewrite(await upstream.read_all())
                    if self._client_gone:
                        return
                    self._send_headers(upstream)
                    self.write(payload)
                else:
                    tap = self._tap = tap_for(
                        self.path_args[0], upstream.status, _content_type(upstream), self._usage
                    )
                    async for chunk in upstream:
                        if tap is not None and not (chunk := tap.feed(chunk)):
                            continue  # held back by the tap until its event is whole
                        if not await self._relay_chunk(upstream, chunk):
                            return  # the client left: leaving the block closes the upstream connection
                        if self._flushed:
                            break  # the head is out: the rest goes through `_piece`
                    if self._flushed:
                        try:
                            await upstream.pipe(self._piece)
                        except _ClientLeft:
                            return  # as above
                    if tap is not None:
                        if (rest := tap.end()) and not await self._relay_chunk(upstream, rest):
                            return
                        await tap.settle()
                        self.prompt_tokens, self.completion_tokens = tap.prompt_tokens, tap.completion_tokens
        except UpstreamError as exc:
            stopped = self.session is not None and self.session.is_cancelled
            if self._client_gone and (self.session is None or stopped or not self._headers_sent):
                return  # we cut it ourselves (the client left, or the owner stopped it), or nothing came
            if stopped:
                # DELETE /v1/stream stopped it: the owner canceled, the upstream did not fail.
                self._stopped = True
                self.request.connection.close()
                return
            if not self._headers_sent:
                # The client learns that much; where the upstream is and why it failed is ours.
                log.warning("upstream %s is not answering: %s", origin, exc)
                self.fail(UpstreamUnavailable("upstream unavailable"))
                return
            # Part of the body is out: cut the client's connection too, so it sees an incomplete
            # response, never a clean end of a truncated stream. An event stream first gets one
            # error event (SDKs raise it; a bare cut often reads as a stream that just stopped),
            # and so does an attached session, whether or not its client is still here: a replay
            # of it ends the same way.
            log.warning("upstream connection broke mid-response: %s", exc)
            self._upstream_broke = True
            if self._tap is not None and (rest := self._tap.end()):
                # What the tap held back came before the break: it goes out as it came.
                if self.session is not None:
                    self.session.append(rest)
                if not self._client_gone:
                    self.write(rest)
            event = _upstream_lost_event(self.anthropic) if self._event_stream() else None
            if self.session is not None:
                self.session.interrupted = True  # streams.lookup says so
                if event is not None:
                    self.session.append(event)
            if self._client_gone:
                return
            if event is not None:
                try:
                    self.write(event)
                    await self.flush()
                except StreamClosedError:
                    pass
            self.request.connection.close()
            return
        if self._client_gone:
            return
        if not self._headers_sent:
            self._send_headers(upstream)
        self.finish()

    def _event_stream(self) -> bool:
        """Whether the response relayed so far is an SSE stream (the upstream's Content-Type)."""
        return self._headers.get("Content-Type", "").startswith("text/event-stream")

    def _send_headers(self, upstream: Exchange) -> None:
        self.set_status(upstream.status, upstream.reason or None)
        self.clear_header("Content-Type")  # the upstream's, not our JSON default
        for name, value in upstream.headers:
            if name.lower() not in RESPONSE_DROP and name.lower() != "x-request-id":
                self.add_header(name, value)
        # Cache-Control: no-store and Pragma: no-cache are the defaults (JsonHandler), and the
        # upstream's own are dropped (RESPONSE_DROP).
        self.set_header("X-Accel-Buffering", "no")
        for name, value in self._limit_headers:
            self.set_header(name, value)
        self._headers_sent = True
        self.first_byte_at = time.perf_counter()

    async def _relay_chunk(self, upstream: Exchange, chunk: bytes) -> bool:
        """Write one piece of the body to the client and wait for the flush (backpressure: the next
        upstream read waits for it). False: the client is gone and nothing else wants the rest."""
        try:
            if not self._for_client(chunk):
                return True
        except _ClientLeft:
            return False
        if not self._headers_sent:
            self._send_headers(upstream)
        self.write(chunk)
        if upstream.complete:
            # The upstream's whole answer is here: `finish` sends what is still buffered in one
            # write, with a Content-Length when nothing was flushed yet (docs/gateway.md).
            return True
        try:
            await self.flush()
            self._flushed = True
        except StreamClosedError:
            # The client left while the flush was pending; on_connection_close may not have run yet,
            # so it is marked gone here (audited as 499). An attached generation outlives its
            # client: the next pieces go to the session only.
            self._client_gone = True
            return self.session is not None
        return True

    def _piece(self, chunk: bytes) -> asyncio.Future[None] | None:
        """`_relay_chunk` for the pieces after the head (the sink of `Exchange.pipe`, called as the
        upstream's bytes arrive): each goes to the connection as it is, past the handler's buffer,
        and reading waits while the client is slow (the future returned)."""
        tap = self._tap
        if tap is not None and not (chunk := tap.feed(chunk)):
            return None  # held back by the tap until its event is whole
        if not self._for_client(chunk):
            return None
        assert self._upstream is not None
        if self._upstream.complete:
            self.write(chunk)  # the last piece: `finish` sends it
            return None
        sent = self.request.connection.write(chunk)
        if not sent.done():
            sent.add_done_callback(self._sent)
        elif sent.exception() is not None:
            self._client_gone = True  # as in `_relay_chunk`
            if self.session is None:
                raise _ClientLeft
        return sent

    def _for_client(self, chunk: bytes) -> bool:
        """Whether `chunk` goes on to the client. An attached session keeps every piece (generation
        goes on without the client); without one, a client that is gone ends the relay (`_ClientLeft`)."""
        if self.session is not None:
            self.session.append(chunk)
            return not self._client_gone
        if self._client_gone:
            raise _ClientLeft
        return True

    def _sent(self, sent: asyncio.Future[None]) -> None:
        if sent.cancelled() or sent.exception() is not None:
            self._client_gone = True  # the next piece goes to the session only, or ends the relay

    def on_connection_close(self) -> None:
        super().on_connection_close()  # marks the client gone unless we closed it ourselves
        if self._client_gone and self._upstream is not None and self.session is None:
            self._upstream.abort()  # no one waits for the answer: free vLLM's slot


@tornado.web.stream_request_body
class StreamHandler(GatewaySurface):
    """`GET /v1/stream?conv_id=&from=` (replay then follow), `DELETE /v1/stream?conv_id=` (stop),
    `POST /v1/streams/lookup {"conversation_ids": [...]}` (docs/gateway.md, "Resumable streams").
    Sessions belong to their key."""

    def _session_id(self) -> str:
        raw = self.get_query_argument("conv_id", None)
        if raw is None:
            raise StreamArgumentError("conv_id is required", loc=["conv_id"])
        return streams.parse_conversation_id(raw)[0]

    async def get(self, path: str) -> None:
        if path != "stream":
            raise tornado.web.HTTPError(405)
        try:
            conv_id = self._session_id()
            raw_from = self.get_query_argument("from", "0")
            # ASCII digits only: str.isdigit() also accepts "²" or "٣", which int() refuses.
            if not (raw_from.isascii() and raw_from.isdigit()) or len(raw_from) > 18:
                raise StreamArgumentError("from must be a byte offset", loc=["from"])
            assert self.identity is not None and self.identity.key_id is not None
            session = self.app.streams.get(conv_id, self.identity.key_id)
            if session is None:
                raise NotFound(f"no stream for conversation {conv_id}")
            reader = session.read_from(int(raw_from))
        except VllmUseError as exc:
            self.fail(exc)
            return
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        self.streamed = True
        # Written up to the end of the last whole event, the rest held back (≤ HOLD_MAX_BYTES):
        # should the replay fail, its error event then starts on an event boundary.
        held = b""
        try:
            async for chunk in reader:
                if self._client_gone:
                    break
                data = held + chunk
                cut = streams.whole_events(data)
                if not cut and len(data) <= streams.HOLD_MAX_BYTES:
                    held = data
                    continue
                cut = cut or len(data)  # one event larger than we hold: pass it through
                held = data[cut:]
                self.write(data[:cut])
                await self.flush()
            else:
                self.write(held)  # the stream ended: the rest as it is
        except StreamClosedError:
            return
        except OffsetGone as exc:
            # The reader fell more than the buffer behind: a clean end here would pass a stream
            # with a hole off as complete. Say so in the stream (the unfinished event held back
            # is dropped), then end it.
            log.warning("stream %s: a replay reader fell behind the buffer", conv_id)
            self.write(streams.error_event(exc))
        if not self._client_gone:
            self.finish()

    async def delete(self, path: str) -> None:
        if path != "stream":
            raise tornado.web.HTTPError(405)
        try:
            conv_id = self._session_id()
        except VllmUseError as exc:
            self.fail(exc)
            return
        assert self.identity is not None and self.identity.key_id is not None
        self.app.streams.delete(conv_id, self.identity.key_id)
        self.set_status(204)
        self.clear_header("Content-Type")
        self.finish()

    async def post(self, path: str) -> None:
        if path != "streams/lookup":
            raise tornado.web.HTTPError(405)
        try:
            try:
                payload = json.loads(self.body)
            except RecursionError:
                raise InvalidArguments("invalid JSON: nested too deep", errors=[{"loc": ["body"]}]) from None
            ids = payload.get("conversation_ids") if isinstance(payload, dict) else None
            if not isinstance(ids, list) or len(ids) > 1000 or not all(isinstance(i, str) for i in ids):
                raise StreamArgumentError(
                    "conversation_ids must be a list of at most 1000 strings", loc=["conversation_ids"]
                )
            parsed = [streams.parse_conversation_id(i)[0] for i in ids]
        except ValueError as exc:
            self.fail(exc if isinstance(exc, VllmUseError) else InvalidArguments(f"invalid JSON: {exc}"))
            return
        except VllmUseError as exc:
            self.fail(exc)
            return
        assert self.identity is not None and self.identity.key_id is not None
        self.write_json({"sessions": self.app.streams.lookup(parsed, self.identity.key_id)})


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    paths = "|".join(p.replace("/", r"\/") for p in (*POST_PATHS, "models"))
    return [
        (r"/v1/(stream|streams\/lookup)", StreamHandler, common),
        (rf"/v1/({paths})", RelayHandler, common),
    ]

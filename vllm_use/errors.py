"""The error tree every layer raises; adapters map it to HTTP or MCP exactly once.

    VllmUseError                      code            /api status   MCP
    ├── InvalidArguments              invalid_arguments      400    isError result
    │   └── StreamArgumentError       invalid_arguments      400    (a bad conv_id or offset; a ValueError too)
    │       └── OffsetGone            offset_gone            400    (the offset fell off the buffer)
    ├── Unauthenticated               unauthenticated        401    HTTP 401
    ├── PermissionDenied              permission_denied      403    "unknown tool" JSON-RPC error
    ├── NotFound                      not_found              404    isError result
    │   └── ModelNotFound             model_not_found        404    (/v1: no deployment or running model has that name)
    ├── Conflict                      conflict               409    isError result
    │   └── ModelNotLoaded            model_not_loaded       409    (/v1 with --no-autoload: load it first)
    ├── PayloadTooLarge               payload_too_large      413    HTTP 413
    ├── TooManyRequests               too_many_requests      429    HTTP 429 (auth) / isError result
    │   ├── TooManyStreams            too_many_streams       429    (a key's live resumable sessions)
    │   └── RateLimited               rate_limit_exceeded    429    (/v1: a key's rpm, max_concurrent, tokens_per_day)
    ├── TooManySessions               too_many_sessions      503    (the process's live sessions)
    ├── ModelLoading                  model_loading          503    (a deployment still loading, or too many waiting)
    │   └── NoRoom                    model_loading          503    (no room to load it: count or GPU memory)
    ├── UpstreamUnavailable           upstream_unavailable   502    isError result
    ├── RuntimeFailed                 runtime_failed         502    isError result
    │   └── StartRefused              start_refused          422    (vLLM refused its options or model files)
    ├── CorruptRecord                 corrupt_record         500    isError result
    ├── ExternalError                 external_error         500    isError result
    └── ConfigError                   (start-up only: names the option, exits 2)

    Outside the tree, each handled by one adapter, never shown to a client as they are:
    UpstreamError                     the gateway's talk with the upstream failed (connect, reset,
    └── UpstreamProtocolError         close, abort; broken HTTP framing): handlers/gateway.py logs it
                                      and answers 502 when nothing was relayed yet, else cuts the stream
    RpcError                          a JSON-RPC error answer of /mcp (handlers/mcp.py), with its code

Anything else that escapes an ability is an internal error: the client sees
"internal error", the log gets the traceback. No tornado import here on purpose.
A module may keep a private signal for its own control flow (`_Malformed` in
vllm_use/gateway/aliases.py: "pass this body through unchanged"); it never leaves the module.
"""

from __future__ import annotations

from typing import Any


class VllmUseError(Exception):
    """Base of every error we raise on purpose. `code` is stable; `message` is for people."""

    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class InvalidArguments(VllmUseError):
    """Bad input; `errors` lists each problem with its field path (`loc`)."""

    code = "invalid_arguments"
    http_status = 400


class Unauthenticated(VllmUseError):
    code = "unauthenticated"
    http_status = 401


class PermissionDenied(VllmUseError):
    code = "permission_denied"
    http_status = 403


class NotFound(VllmUseError):
    code = "not_found"
    http_status = 404


class ModelNotFound(NotFound):
    """A `/v1` request names a model that no deployment, alias or running model has (docs/router.md,
    "Instances: load, unload, and /v1 by name")."""

    code = "model_not_found"

    @classmethod
    def unknown(cls, model: str) -> ModelNotFound:
        """The answer to a name no deployment has, and to one outside a key's `models` (the same
        bytes, so a key cannot tell a model it may not use from one that does not exist)."""
        return cls(f"the model {model} does not exist: GET /v1/models lists the models served here")


class MethodNotAllowed(VllmUseError):
    code = "method_not_allowed"
    http_status = 405


class Conflict(VllmUseError):
    code = "conflict"
    http_status = 409


class PayloadTooLarge(VllmUseError):
    code = "payload_too_large"
    http_status = 413


class UpstreamUnavailable(VllmUseError):
    code = "upstream_unavailable"
    http_status = 502


class RuntimeFailed(VllmUseError):
    """The supervised vLLM did not come up: it exited, was never healthy in time, or another process
    holds its port. The child failed, not vllm-use; `last_lines` carries its last log lines."""

    code = "runtime_failed"
    http_status = 502


class StartRefused(RuntimeFailed):
    """vLLM exited at start because it refused what it was given: an argparse error, or its checks
    of the options and the model's files (vllm_use/runtime/failure.py). The operator's mistake, not
    a fault of vllm-use or of the machine: 422, with vLLM's reason in the message and `last_lines`.
    A RuntimeFailed still, so a `/v1` client waiting for the load gets its 502 (docs/router.md)."""

    code = "start_refused"
    http_status = 422


class CorruptRecord(VllmUseError):
    """A row read back from SQLite failed validation; the request fails closed."""

    code = "corrupt_record"
    http_status = 500


class ExternalError(VllmUseError):
    """A tool we depend on (NVML, a child process) failed in a way we can only report."""

    code = "external_error"
    http_status = 500


class ConfigError(Exception):
    """Invalid configuration or unsafe storage found at start-up; the message names the option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


class TooManyRequests(VllmUseError):
    """A bounded resource is full for now (a key's live streams, scrypt verifications waiting for
    one key prefix): refused at once, never queued without bound. `retry_after_s`, in the error
    document, says when a retry may succeed (the value for a `Retry-After` header)."""

    code = "too_many_requests"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int = 1, **details: Any) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **details)
        self.retry_after_s = retry_after_s


# --- resumable streams (vllm_use/gateway/streams.py) ---------------------------------------------


class StreamArgumentError(InvalidArguments, ValueError):
    """A bad conversation id or offset (400); also a ValueError for callers outside the API."""


class OffsetGone(StreamArgumentError):
    """The requested offset fell off the front of the buffer: a 400 (docs/gateway.md, "Resumable streams")."""

    code = "offset_gone"


class TooManySessions(VllmUseError):
    """The process is full of live sessions: `MAX_SESSIONS` of them (vllm_use/gateway/streams.py), or live
    buffers holding the whole `BYTE_BUDGET`, and no finished session left to drop for room."""

    code = "too_many_sessions"
    http_status = 503


class ModelNotLoaded(Conflict):
    """A `/v1` request names a deployment whose instance is not ready, and nothing loads it for the
    request (`--no-autoload`): load it with deployments.load (docs/router.md)."""

    code = "model_not_loaded"


class ModelLoading(VllmUseError):
    """A `/v1` request for a deployment that is not ready was not answered: it loaded for longer than
    `--load-wait-timeout`, or `--max-waiting` requests already wait (docs/router.md). 503 with
    `Retry-After`."""

    code = "model_loading"
    http_status = 503

    def __init__(self, message: str, *, retry_after_s: int = 5, **details: Any) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **details)
        self.retry_after_s = retry_after_s


class NoRoom(ModelLoading):
    """A deployment cannot be loaded now: `--max-loaded` instances hold GPUs, or its GPUs lack the
    memory (`--gpu-memory-budget`, NVML's free memory), and none is idle to make room (docs/router.md,
    "Capacity"). A `/v1` request waits for room; `deployments.load` answers 503 at once."""


class TooManyStreams(TooManyRequests):
    """The key already has `MAX_LIVE_PER_KEY` live resumable sessions (429): stop one, or wait for one to end."""

    code = "too_many_streams"


class RateLimited(TooManyRequests):
    """A `/v1` request over one of its key's limits (vllm_use/keys/limits.py): `limit` names it
    ("rpm", "concurrency", "tokens"); `headers` are the x-ratelimit-* headers the answer carries."""

    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, limit: str, retry_after_s: int, headers: list[tuple[str, str]]
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.limit = limit
        self.headers = headers


# --- outside the tree: adapter-level failures -----------------------------------------------------


class UpstreamError(Exception):
    """Talking to the upstream failed: it could not be reached, reset or closed the connection, or
    the exchange was aborted (vllm_use/gateway/upstream.py). The message is for the log only: it
    may name the upstream's address."""


class UpstreamProtocolError(UpstreamError):
    """The upstream broke HTTP/1.1 framing; the connection is dropped (never reused)."""


class RpcError(Exception):
    """A JSON-RPC error answer of /mcp; its HTTP status comes from handlers/mcp.py `ERROR_STATUS`."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

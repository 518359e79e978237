"""The MCP endpoint `POST /mcp` (docs/mcp.md): revision 2026-07-28, stateless Streamable HTTP, JSON
responses.

One POST carries one JSON-RPC request (or notification); there is no
`initialize` handshake and no session. Checks run in this order and the first
failure answers:

    prepare()  Host ........................... 403   (DNS rebinding)
               Origin / Sec-Fetch-Site ........ 403   (cross-site pages)
               verb other than POST ........... 405
               declared body size ............. 413
               Bearer credential for /mcp ..... 401 + WWW-Authenticate
    post()     JSON parse ..................... 400  -32700
               one JSON-RPC object ............ 400  -32600  (batches too)
               MCP-Protocol-Version ........... 400  -32020 missing/repeated, -32022 any other value
               Mcp-Method ..................... 400  -32020
               notification ................... 202, no body
               params._meta ................... 400  -32602 missing, -32020 version differs
               method ......................... 404  -32601
               params ......................... 400  -32602
               Mcp-Name (tools/call) .......... 400  -32020
               dispatch → result .............. 200

HTTP statuses for JSON-RPC errors follow the SDK's table (`error_status`), so
-32602 is a 400 wherever it comes from, "unknown tool" included. A tool that
is unknown and one the caller's scopes do not allow get the same answer, and
a registered tool's own failure is a `CallToolResult` with `isError: true`
(its error document in the text content, not in `structuredContent`, which
must match the tool's outputSchema).

Only the pure-pydantic `mcp_types` package is imported (at its first use, `mt`): the `mcp`
server package pulls in Starlette and routes a missing header to the 2025 handshake.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import tornado.web
from pydantic import BaseModel, ValidationError
from tornado.httputil import split_host_and_port

from handlers.base import JsonHandler
from vllm_use import __version__
from vllm_use.errors import (
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RpcError,
    VllmUseError,
)
from vllm_use.scopes import Surface

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "2026-07-28"
DISCOVER_TTL_MS = 300_000  # versions and capabilities only change with a new release
TOOLS_TTL_MS = 60_000  # the list depends on the key's scopes; "private" keeps it per caller
INSTRUCTIONS = (
    "vllm-use runs a local vLLM server: start with system.get or dashboard.get, manage models and "
    "downloads with models.* and downloads.*, run vLLM with runtime.*, and administer keys and "
    "settings with api_keys.* and settings.*; only the tools your key may call are listed."
)


class _McpTypes:
    """The `mcp_types` package (`mt.Tool`, `mt.PARSE_ERROR`, `mt.methods`…), imported at its first use,
    the first /mcp request, rather than at start: its pydantic models of two protocol versions cost
    ~0.8 s of CPU to import, which every start of vllm-use paid (most never see an MCP client)."""

    def __getattr__(self, name: str) -> Any:
        import mcp_types
        import mcp_types.methods

        return getattr(mcp_types, name)


mt: Any = _McpTypes()


@functools.cache
def server_info() -> dict[str, Any]:
    """Our serverInfo stamp on every result."""
    info = mt.Implementation(name="vllm-use", version=__version__)
    return info.model_dump(by_alias=True, mode="json", exclude_none=True)


@functools.cache
def error_status() -> dict[int, int]:
    """The HTTP status of each JSON-RPC error code (the SDK's table); any other code is a 200."""
    return {
        mt.PARSE_ERROR: 400,
        mt.INVALID_REQUEST: 400,
        mt.INVALID_PARAMS: 400,
        mt.HEADER_MISMATCH: 400,
        mt.UNSUPPORTED_PROTOCOL_VERSION: 400,
        mt.METHOD_NOT_FOUND: 404,
    }


_SENTINEL = re.compile(r"=\?base64\?(?P<payload>.*)\?=", re.DOTALL)
_HEADER_TEXT = re.compile(r"[\x20-\x7e]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_INTERNAL = "internal error (see the server log)"


def origin_key(value: str) -> str | None:
    """`scheme://host[:port]` lowercased with the default port dropped; None if not an http(s) origin."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme not in _DEFAULT_PORTS or not host or parts.path or parts.query or parts.fragment:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    host = f"[{host}]" if ":" in host else host
    return (
        f"{parts.scheme}://{host}"
        if port in (None, _DEFAULT_PORTS[parts.scheme])
        else f"{parts.scheme}://{host}:{port}"
    )


def _host_name(value: str) -> str | None:
    """The lowercased host of a `Host` value (`name[:port]`, `[v6]:port`), None if it is not one."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/\\@?#% \t"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not re.fullmatch(r":[0-9]{1,5}", value[end + 1 :])):
            return None
        return value[1:end]
    name, port = split_host_and_port(value)
    if port is None and ":" in value:
        return None  # "name:" or an IPv6 literal without brackets
    return name.removesuffix(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def allowed_hosts(listen_host: str, trusted_origins: tuple[str, ...]) -> frozenset[str]:
    """The host names /mcp answers to: the listening host, localhost and the trusted origins' hosts.

    Loopback addresses are always accepted, and on a wildcard listen address (0.0.0.0, ::) any IP
    literal is too (`host_allowed`): a rebinding attack needs a name the attacker's DNS resolves.
    """
    names = {"localhost", listen_host.strip("[]").lower()}
    for origin in trusted_origins:
        host = urlsplit(origin).hostname
        if host:
            names.add(host.lower())
    return frozenset(names)


def host_allowed(value: str, listen_host: str, allowed: frozenset[str]) -> bool:
    """Whether one `Host` header value may reach /mcp (see `allowed_hosts`)."""
    host = _host_name(value)
    if host is None:
        return False
    if host in allowed:
        return True
    if not _is_ip(host):
        return False
    wildcard = listen_host in ("", "0.0.0.0", "::", "[::]")  # noqa: S104 - comparing, not binding
    return wildcard or ipaddress.ip_address(host).is_loopback


def decode_header_value(value: str) -> str | None:
    """A plain visible-ASCII value as is, or the UTF-8 text inside `=?base64?…?=`.

    None for anything else (control or non-ASCII bytes, bad or non-canonical
    base64, bad UTF-8) so that a corrupt header can never match a body value.
    """
    match = _SENTINEL.fullmatch(value)
    if match is None:
        return value if _HEADER_TEXT.fullmatch(value) else None
    payload = match.group("payload")
    try:
        raw = base64.b64decode(payload, validate=True)
        if base64.b64encode(raw).decode("ascii") != payload:
            return None
        return raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def _result(model: BaseModel) -> dict[str, Any]:
    """Every result: `resultType: "complete"` (the models' default) and our serverInfo stamp."""
    data = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    data["resultType"] = "complete"
    data.setdefault("_meta", {})[mt.SERVER_INFO_META_KEY] = server_info()
    return data


def _tool_error(exc: VllmUseError) -> dict[str, Any]:
    """A tool execution error: `isError` with `code: message`, then the error document as JSON text.

    No `structuredContent`: it would have to match the tool's outputSchema, and
    strict clients (the TypeScript SDK behind the Inspector) reject one that does not.
    """
    return _result(
        mt.CallToolResult(
            content=[
                mt.TextContent(type="text", text=f"{exc.code}: {exc.message}"),
                mt.TextContent(type="text", text=json.dumps(exc.to_json(), ensure_ascii=False)),
            ],
            is_error=True,
        )
    )


def _validation_message(exc: ValidationError) -> str:
    """Field paths and pydantic's messages only: values sent by the client are never echoed."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "params"
    return f"Invalid params: {where}: {first['msg']}"


def _parse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@tornado.web.stream_request_body
class McpHandler(JsonHandler):
    """`POST /mcp`. Runs on the IOLoop; tool work goes through `Executor.call`."""

    surface = Surface.MCP

    async def before_body(self) -> None:
        """Host (403) → Origin (403) → verb (405) → declared size (413) → credential (401), before
        any body is read. The base handler answers a refusal at once (`JsonHandler.refuse`)."""
        if not self._host_allowed():
            raise PermissionDenied("this Host may not use /mcp (see --trusted-origins)")
        if not self._origin_allowed():
            raise PermissionDenied("this Origin may not use /mcp (see --trusted-origins)")
        if self.request.method != "POST":
            raise MethodNotAllowed("/mcp takes POST only (MCP 2026-07-28, stateless Streamable HTTP)")
        self.check_body_size()
        self.identity = await self.authenticate()

    def _host_allowed(self) -> bool:
        """Exactly one acceptable `Host` (none at all is HTTP/1.0: no browser, nothing to rebind)."""
        values = self.request.headers.get_list("Host")
        if not values:
            return True
        config = self.app.config
        allowed = allowed_hosts(config.host, config.trusted_origins)
        return len(values) == 1 and host_allowed(values[0], config.host, allowed)

    def _origin_allowed(self) -> bool:
        """No Origin and not `Sec-Fetch-Site: cross-site` → allowed; else our own or a trusted origin only."""
        origins = self.request.headers.get_list("Origin")
        cross_site = any(
            v.strip().lower() == "cross-site" for v in self.request.headers.get_list("Sec-Fetch-Site")
        )
        if not origins and not cross_site:
            return True
        if len(origins) != 1:
            return False
        origin = origin_key(origins[0])
        if origin is None:
            return False
        own = origin_key(f"{self.request.protocol}://{self.request.host}")
        trusted = {origin_key(o) for o in self.app.config.trusted_origins}
        return origin == own or origin in trusted

    def allowed_verbs(self) -> list[str]:
        return ["POST"]

    # --- the exchange ----------------------------------------------------------------------------

    async def post(self) -> None:
        try:
            body = self.body
        except PayloadTooLarge as exc:
            self.fail(exc)
            return
        request_id: Any = None
        try:
            message = self._message(body)
            request_id = message.get("id")
            self._check_routing_headers(message["method"])
            if "id" not in message:
                # 2026-07-28 defines no client-to-server notifications on HTTP: accept and drop.
                self.set_status(202)
                self.clear_header("Content-Type")
                self.finish()
                return
            result = await self._dispatch(message["method"], message.get("params"))
        except RpcError as err:
            self._write_rpc_error(request_id, err)
            return
        self.write_json({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _message(self, body: bytes) -> dict[str, Any]:
        """The one JSON-RPC request or notification in the body (-32700, -32600)."""
        try:
            decoded = json.loads(body, parse_constant=_parse_constant)
        except (ValueError, RecursionError):
            raise RpcError(mt.PARSE_ERROR, "Parse error: the body is not valid JSON") from None
        if not isinstance(decoded, dict):
            raise RpcError(
                mt.INVALID_REQUEST,
                "Invalid request: send one JSON-RPC object (batches are not supported)",
            )
        try:
            if "id" in decoded:
                mt.JSONRPCRequest.model_validate(decoded)
            else:
                mt.JSONRPCNotification.model_validate(decoded)
        except ValidationError:
            raise RpcError(
                mt.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 request or notification"
            ) from None
        return decoded

    def _one_header(self, name: str) -> str | None:
        values = self.request.headers.get_list(name)
        return values[0] if len(values) == 1 else None

    def _check_routing_headers(self, method: str) -> None:
        """Exactly one `MCP-Protocol-Version: 2026-07-28` and one `Mcp-Method` equal to the body's."""
        versions = self.request.headers.get_list("MCP-Protocol-Version")
        if len(versions) != 1:
            raise RpcError(
                mt.HEADER_MISMATCH,
                "Header mismatch: send exactly one MCP-Protocol-Version header; "
                f"this server speaks {PROTOCOL_VERSION}",
            )
        if versions[0] != PROTOCOL_VERSION:
            data = mt.UnsupportedProtocolVersionErrorData(supported=[PROTOCOL_VERSION], requested=versions[0])
            raise RpcError(
                mt.UNSUPPORTED_PROTOCOL_VERSION,
                f"Unsupported protocol version: this server supports only {PROTOCOL_VERSION}",
                data.model_dump(by_alias=True, mode="json"),
            )
        if self._one_header("Mcp-Method") != method:
            raise RpcError(
                mt.HEADER_MISMATCH,
                "Header mismatch: send exactly one Mcp-Method header equal to the method",
            )

    def _check_meta(self, params: Any) -> None:
        """`params._meta` carries the protocol version (equal to the header) and the client capabilities."""
        meta = params.get("_meta") if isinstance(params, dict) else None
        if (
            not isinstance(meta, dict)
            or not {mt.PROTOCOL_VERSION_META_KEY, mt.CLIENT_CAPABILITIES_META_KEY} <= meta.keys()
        ):
            raise RpcError(
                mt.INVALID_PARAMS,
                f"Invalid params: params._meta must be an object with {mt.PROTOCOL_VERSION_META_KEY!r} and "
                f"{mt.CLIENT_CAPABILITIES_META_KEY!r}",
            )
        if meta[mt.PROTOCOL_VERSION_META_KEY] != PROTOCOL_VERSION:
            raise RpcError(
                mt.HEADER_MISMATCH,
                f"Header mismatch: params._meta[{mt.PROTOCOL_VERSION_META_KEY!r}] "
                "differs from the MCP-Protocol-Version header",
            )

    async def _dispatch(self, method: str, params: Any) -> dict[str, Any]:
        self._check_meta(params)
        serve = self._METHODS.get(method)
        if serve is None:
            raise RpcError(mt.METHOD_NOT_FOUND, f"Method not found: {method[:100]}")
        try:
            request = mt.methods.parse_client_request(method, PROTOCOL_VERSION, params)
        except ValidationError as exc:
            raise RpcError(mt.INVALID_PARAMS, _validation_message(exc)) from None
        return await serve(self, request.params)

    # --- methods ---------------------------------------------------------------------------------

    async def _discover(self, params: Any) -> dict[str, Any]:
        return _result(
            mt.DiscoverResult(
                supported_versions=[PROTOCOL_VERSION],
                capabilities=mt.ServerCapabilities(tools=mt.ToolsCapability(list_changed=False)),
                instructions=INSTRUCTIONS,
                ttl_ms=DISCOVER_TTL_MS,
                cache_scope="private",
            )
        )

    async def _list_tools(self, params: Any) -> dict[str, Any]:
        if params is not None and params.cursor is not None:
            raise RpcError(mt.INVALID_PARAMS, "Invalid params: unknown cursor (the list has one page)")
        tools = [
            mt.Tool(
                name=m.name,
                description=m.description,
                input_schema=m.input_schema(),
                output_schema=m.output_schema(),
            )
            for m in self.executor.visible(self.identity, Surface.MCP)
        ]
        return _result(mt.ListToolsResult(tools=tools, ttl_ms=TOOLS_TTL_MS, cache_scope="private"))

    async def _call_tool(self, params: Any) -> dict[str, Any]:
        name: str = params.name
        mcp_name = self._one_header("Mcp-Name")
        if mcp_name is None or decode_header_value(mcp_name) != name:
            raise RpcError(
                mt.HEADER_MISMATCH,
                "Header mismatch: send exactly one Mcp-Name header equal to params.name",
            )
        unknown = RpcError(mt.INVALID_PARAMS, f"Unknown tool: {name[:200]}")
        try:
            result = await self.executor.call(name, params.arguments, self.identity, Surface.MCP)
        except PermissionDenied:
            raise unknown from None  # the same answer as an unknown tool: do not tell which
        except VllmUseError as exc:
            if isinstance(exc, NotFound) and self.executor.registry.get(name) is None:
                raise unknown from None
            return _tool_error(exc)
        except Exception:
            log.exception("tool %s failed", name)
            return _tool_error(VllmUseError(_INTERNAL))
        return _result(
            mt.CallToolResult(
                content=[mt.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
                structured_content=result,
            )
        )

    _METHODS: dict[str, Callable[[McpHandler, Any], Awaitable[dict[str, Any]]]] = {
        "server/discover": _discover,
        "tools/list": _list_tools,
        "tools/call": _call_tool,
    }

    # --- errors ----------------------------------------------------------------------------------

    def _write_rpc_error(self, request_id: Any, err: RpcError) -> None:
        error: dict[str, Any] = {"code": err.code, "message": err.message}
        if err.data is not None:
            error["data"] = err.data
        status = error_status().get(err.code, 200)
        log.warning("POST /mcp -> %d jsonrpc error %d", status, err.code)
        self.write_json({"jsonrpc": "2.0", "id": request_id, "error": error}, status)


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/mcp", McpHandler, common)]

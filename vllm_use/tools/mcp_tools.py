"""MCP servers' tools (docs/tools.md, "MCP tools"): vllm-use is a *client* of the streamable HTTP
MCP servers the operator names in `--tools-mcp-config`, and offers their tools at `/tools` as
`type: "mcp"`, named `<server>.<tool>`.

Constraints:
- The config file is read once at start-up (`McpServers.load`, sync, small) and kept only in
  memory: it is never copied into SQLite. Header values (tokens, often from `${VAR}`) go to their
  server and nowhere else: not into errors, logs, listings or child processes.
- A server that does not answer is listed as one unavailable entry (`<server>.*`), never fatal.
- Each listing or call opens its own session with the official `mcp` client (`Client` over
  `streamable_http_client`) and closes it; nothing stays connected between calls. The listing is
  cached for `CACHE_TTL_S`, so `GET /tools` does not hammer servers; a call always reaches the
  server.
- Connections go straight to the configured URL (`trust_env=False`): no proxy variable and no
  ~/.netrc can redirect a server's headers or add credentials of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from vllm_use import __version__
from vllm_use.errors import ConfigError
from vllm_use.fsafety import read_operator_file
from vllm_use.tools.base import NAME_CHARS, Result, Tool, ToolError

log = logging.getLogger(__name__)
# httpx2 logs every request's URL at INFO, and the SDK the endpoint at DEBUG: a URL may carry a
# token in its query, so theirs stay quiet; our own lines name the server only.
for _noisy in ("httpx2", "mcp"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)

OPTION = "--tools-mcp-config"
CONFIG_MAX_BYTES = 1024 * 1024
MAX_SERVERS = 16
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
TOOL_NAME_MAX = 64  # an MCP tool's own name; the id `<server>.<tool>` adds the server's
URL_MAX = 2048
LIST_TIMEOUT_S = 5.0  # connect, initialize and list one server's tools
CACHE_TTL_S = 10.0
LIST_PAGES_MAX = 10  # pages of tools/list read from one server; a server that pages on is cut there
REASON_MAX = 200  # a server's own error text, as repeated to the user
# What the transport sets itself, or what would change the request's framing: not the config's.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "accept"}
    | {"mcp-session-id", "mcp-protocol-version", "last-event-id"}
)
STDIO_KEYS = frozenset({"command", "args", "env", "cwd"})
HTTP_TYPES = frozenset({"http", "streamable-http", "streamableHttp"})
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class McpServer:
    """One server of the config: where it is and the headers it gets (values expanded, secret)."""

    name: str
    url: str = field(repr=False)  # may carry a token in its query
    headers: dict[str, str] = field(repr=False, default_factory=dict)


def _fail(message: str) -> ConfigError:
    return ConfigError(OPTION, message)


def _expand(value: str, server: str, header: str) -> str:
    """`${NAME}` in a header value from vllm-use's environment; a missing one names the variable."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        found = os.environ.get(name)
        if not found:
            raise _fail(
                f"server {server!r}, header {header!r}: environment variable {name} is not set or empty"
            )
        return found

    return _VARIABLE.sub(variable, value)


def _check_url(url: object, server: str) -> str:
    if not isinstance(url, str) or not url:
        raise _fail(f"server {server!r}: 'url' must be a non-empty string")
    if len(url) > URL_MAX:
        raise _fail(f"server {server!r}: 'url' is longer than {URL_MAX} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise _fail(f"server {server!r}: 'url' is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"server {server!r}: 'url' must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise _fail(f"server {server!r}: 'url' carries credentials; put them in 'headers' instead")
    if any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in url):
        raise _fail(f"server {server!r}: 'url' contains spaces or control characters")
    return url


def _check_headers(headers: object, server: str) -> dict[str, str]:
    if not isinstance(headers, dict):
        raise _fail(f"server {server!r}: 'headers' must be an object of strings")
    checked: dict[str, str] = {}
    for header, value in headers.items():
        if not _HEADER_NAME.fullmatch(header):
            raise _fail(f"server {server!r}: {header!r} is not a valid header name")
        if header.lower() in RESERVED_HEADERS:
            raise _fail(f"server {server!r}: header {header!r} is set by the MCP transport, not the config")
        if not isinstance(value, str):
            raise _fail(f"server {server!r}, header {header!r}: the value must be a string")
        expanded = _expand(value, server, header)
        # Checked after expansion: a variable must not smuggle a second header line in (CWE-113).
        if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in expanded):
            raise _fail(f"server {server!r}, header {header!r}: the value contains control characters")
        checked[header] = expanded
    return checked


def _check_server(name: object, entry: object) -> McpServer:
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise _fail(f"server name {str(name)[:40]!r} must match [A-Za-z0-9_-]{{1,32}}")
    if not isinstance(entry, dict):
        raise _fail(f"server {name!r} must be an object with a 'url'")
    if STDIO_KEYS & entry.keys():
        raise _fail(
            f"server {name!r} has a 'command': vllm-use does not start stdio MCP servers; "
            "run it behind a streamable HTTP endpoint and give its 'url'"
        )
    unknown = sorted(entry.keys() - {"url", "headers", "type"})
    if unknown:
        raise _fail(f"server {name!r}: unknown key {unknown[0]!r} (allowed: url, headers, type)")
    if "type" in entry and entry["type"] not in HTTP_TYPES:
        raise _fail(f"server {name!r}: 'type' must be 'http' (streamable HTTP), the only transport supported")
    url = _check_url(entry.get("url"), name)
    return McpServer(name=name, url=url, headers=_check_headers(entry.get("headers", {}), name))


def parse_config(data: bytes) -> list[McpServer]:
    """The servers of a config file's content, validated; `ConfigError` names the first problem."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        # The position only: the text around it may hold a header value.
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise _fail(f"the file is not valid UTF-8 JSON{where}") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise _fail('the file must be a JSON object {"mcpServers": {"<name>": {"url": …}}}')
    unknown = sorted(document.keys() - {"mcpServers"})
    if unknown:
        raise _fail(f"unknown top-level key {unknown[0]!r} (only 'mcpServers' is read)")
    entries = document["mcpServers"]
    if not entries:
        raise _fail("'mcpServers' names no server")
    if len(entries) > MAX_SERVERS:
        raise _fail(f"'mcpServers' names {len(entries)} servers; at most {MAX_SERVERS}")
    return [_check_server(name, entry) for name, entry in entries.items()]


def describe(content: list[Any]) -> str:
    """A result's contents as one text: texts joined with newlines, anything else named in words."""
    parts: list[str] = []
    for block in content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.mime_type} content omitted]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[{resource.mime_type or 'binary'} resource {resource.uri} omitted]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content omitted]")
    return "\n".join(parts)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the task groups' exception groups the SDK raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _Seen:
    """The last HTTP error status of one session: the SDK turns it into a generic JSON-RPC error,
    and "HTTP 401" says far more to the operator."""

    def __init__(self) -> None:
        self.status: int | None = None

    async def response(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.status = response.status_code


def reason(exc: BaseException, timeout_s: float, status: int | None = None) -> str:
    """A short reason for the user. Never `str()` of a transport error: it may quote the URL."""
    exc = _leaf(exc)
    if status in (401, 403):
        return f"HTTP {status}: the server refused the credentials (check the config's headers)"
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, httpx2.ConnectError):
        return "cannot connect"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, MCPError) and status is not None and exc.error.code == types.INTERNAL_ERROR:
        return f"HTTP {status}"  # the SDK's stand-in for an HTTP error without a JSON-RPC body
    if isinstance(exc, MCPError):
        return f"MCP error {exc.error.code}: {exc.error.message[:REASON_MAX]}"
    if isinstance(exc, httpx2.TransportError):
        return f"transport error ({type(exc).__name__})"
    return f"protocol error ({type(exc).__name__})"


class McpServers:
    """The configured servers; `tools()` lists their tools, each `Tool.call` reaches its server.

    Runs on the IOLoop (asyncio; the SDK runs on anyio's asyncio backend)."""

    def __init__(self, servers: list[McpServer], *, call_timeout_s: float = 60.0) -> None:
        self.servers = servers
        self.call_timeout_s = call_timeout_s
        self._cached: tuple[float, list[Tool]] | None = None
        self._lock = asyncio.Lock()  # one refresh at a time; the others wait and share it

    @classmethod
    def load(cls, path: Path, *, call_timeout_s: float = 60.0) -> McpServers:
        """Read and validate the config at start-up; `ConfigError` (exit 2) on any problem."""
        data = read_operator_file(path, option=OPTION, max_bytes=CONFIG_MAX_BYTES)
        return cls(parse_config(data), call_timeout_s=call_timeout_s)

    async def tools(self) -> list[Tool]:
        """Every server's tools (concurrently, each bounded by LIST_TIMEOUT_S), cached CACHE_TTL_S."""
        async with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < CACHE_TTL_S:
                return list(self._cached[1])
            listings = await asyncio.gather(*(self._list(server) for server in self.servers))
            tools = [tool for listing in listings for tool in listing]
            self._cached = (time.monotonic(), tools)
            return list(tools)

    async def close(self) -> None:
        """Forget the listing; sessions live only as long as one listing or call, so none is open."""
        self._cached = None

    @asynccontextmanager
    async def _client(self, server: McpServer, seen: _Seen) -> AsyncIterator[Client]:
        # Redirects: the SDK follows only same-origin ones itself, so headers never leave for elsewhere.
        timeout = httpx2.Timeout(LIST_TIMEOUT_S, read=self.call_timeout_s)
        hooks = {"response": [seen.response]}
        async with httpx2.AsyncClient(
            headers=server.headers, timeout=timeout, trust_env=False, event_hooks=hooks
        ) as http:
            transport = streamable_http_client(server.url, http_client=http)
            info = types.Implementation(name="vllm-use", version=__version__)
            async with Client(transport, client_info=info, cache=None) as client:
                yield client

    async def _list(self, server: McpServer) -> list[Tool]:
        seen = _Seen()
        try:
            with anyio.fail_after(LIST_TIMEOUT_S):
                async with self._client(server, seen) as client:
                    info = client.server_info
                    listed: list[types.Tool] = []
                    cursor: str | None = None
                    for _ in range(LIST_PAGES_MAX):
                        page = await client.list_tools(cursor=cursor)
                        listed += page.tools
                        cursor = page.next_cursor
                        if not cursor:
                            break
        except Exception as exc:  # any failure: the server is listed as unavailable, never fatal
            why = reason(exc, LIST_TIMEOUT_S, seen.status)
            log.warning("MCP server %s unavailable: %s", server.name, why)
            return [self._unavailable(server, why)]
        display = (info.title or info.name) if info is not None else server.name
        tools: dict[str, Tool] = {}
        for tool in listed:
            if len(tool.name) > TOOL_NAME_MAX or not set(tool.name) <= NAME_CHARS:
                log.warning(
                    "MCP server %s: skipped a tool whose name is not [A-Za-z0-9_.-]{1,64}", server.name
                )
                continue
            tools.setdefault(tool.name, self._tool(server, display, tool))  # a repeated name: the first
        return list(tools.values())

    def _tool(self, server: McpServer, display: str, tool: types.Tool) -> Tool:
        tool_id = f"{server.name}.{tool.name}"
        definition = {
            "type": "function",
            "function": {
                "name": tool_id,
                "description": tool.description or tool.title or "",
                "parameters": tool.input_schema,
            },
        }
        hints = tool.annotations
        return Tool(
            name=tool_id,
            display_name=display,
            type="mcp",
            write=not (hints is not None and hints.read_only_hint is True),  # no hint: write (fail-closed)
            definition=definition,
            call=self._caller(server, tool.name),
            timeout_s=self.call_timeout_s,
        )

    def _unavailable(self, server: McpServer, why: str) -> Tool:
        async def refuse(params: dict[str, Any]) -> Result:
            raise ToolError(f"MCP server {server.name} is unavailable: {why}")

        return Tool(
            name=f"{server.name}.*",
            display_name=server.name,
            type="mcp",
            write=True,
            definition=None,  # type: ignore[arg-type]  # GET /tools says null: nothing to offer a model
            call=refuse,
            timeout_s=self.call_timeout_s,
            available=False,
            extra={"error": why},
        )

    def _caller(self, server: McpServer, name: str) -> Callable[[dict[str, Any]], Awaitable[Result]]:
        async def call(params: dict[str, Any]) -> Result:
            seen = _Seen()
            try:
                with anyio.fail_after(self.call_timeout_s):
                    async with self._client(server, seen) as client:
                        result = await client.call_tool(name, params)
            except Exception as exc:
                why = reason(exc, self.call_timeout_s, seen.status)
                log.warning("MCP server %s: call of %s failed: %s", server.name, name, why)
                raise ToolError(f"MCP server {server.name}: {why}") from None
            text = describe(list(result.content))
            if not result.content and result.structured_content is not None:
                text = json.dumps(result.structured_content, ensure_ascii=False)
            if result.is_error:
                raise ToolError(text or f"{server.name}.{name} failed")
            return text

        return call

"""The enabled tools and the rules every call follows (docs/tools.md).

`Toolbox.build(config)` makes the set the operator asked for: the built-ins named by `--tools`
(none by default; exec_shell_command only when named) and the tools of the MCP servers in
`--tools-mcp-config`. Every call then goes through `admit` (at most `CALLS_PER_KEY` at once per
key, the next is refused with 429 at once, never queued), `time_limit` (the tool's own bound, never
above `--tools-timeout`) and the output cap (`OUTPUT_MAX_BYTES` of text, then `TRUNCATED`; a JSON
object over the cap becomes an error). Runs on the IOLoop.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_use.errors import TooManyRequests
from vllm_use.logbuffer import cut_utf8
from vllm_use.tools.base import CALLS_PER_KEY, OUTPUT_MAX_BYTES, TRUNCATED, Result, Tool, ToolError, function
from vllm_use.tools.files import FILE_TOOLS, file_tools

if TYPE_CHECKING:
    from vllm_use.config import Config

log = logging.getLogger(__name__)

SHELL = "exec_shell_command"
DATETIME = "get_datetime"
BUILTIN_TOOLS = (DATETIME, *sorted(FILE_TOOLS), SHELL)  # the names --tools accepts, in GET /tools order
ROOTED_TOOLS = frozenset({*FILE_TOOLS, SHELL})  # they need --tools-root


def datetime_tool() -> Tool:
    """get_datetime {}: the current time, local and UTC, in ISO 8601 with the UTC offset."""

    async def call(params: dict[str, Any]) -> str:
        if params:
            raise ToolError("get_datetime takes no arguments")
        now = datetime.datetime.now().astimezone()
        utc = now.astimezone(datetime.UTC)
        return f"local: {now.isoformat(timespec='seconds')}\nUTC: {utc.isoformat(timespec='seconds')}"

    return Tool(
        name=DATETIME,
        display_name="Current date and time",
        type="builtin",
        write=False,
        definition=function(DATETIME, "The current date and time, local and UTC (ISO 8601).", {}, []),
        call=call,
        timeout_s=5.0,
    )


def cap_text(text: str) -> str:
    """`text` within `OUTPUT_MAX_BYTES` of UTF-8, else cut there (on a character) + `TRUNCATED`."""
    data = text.encode("utf-8", "replace")
    if len(data) <= OUTPUT_MAX_BYTES:
        return text
    return cut_utf8(data, OUTPUT_MAX_BYTES).decode("utf-8", "ignore") + TRUNCATED


def cap_result(result: Result) -> Result:
    if isinstance(result, str):
        return cap_text(result)
    if not isinstance(result, dict):
        raise ToolError("the tool answered neither text nor a JSON object")
    size = len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace"))
    if size > OUTPUT_MAX_BYTES:
        raise ToolError(f"the tool's answer is larger than {OUTPUT_MAX_BYTES} bytes")
    return result


class Toolbox:
    """The enabled tools: built-ins by name, and the MCP servers' (asked at each listing and each
    call, their own cache keeps it cheap)."""

    def __init__(self, builtins: list[Tool], mcp: Any, timeout_s: float) -> None:
        self.builtins = {tool.name: tool for tool in builtins}
        self.mcp = mcp  # vllm_use.tools.mcp_tools.McpServers, or None
        self.timeout_s = timeout_s
        self._calls: dict[str, int] = {}

    @classmethod
    def build(cls, config: Config) -> Toolbox | None:
        """The configured tools, or None when /tools is off. Raises ConfigError (a bad MCP file)."""
        if not config.tools_enabled:
            return None
        names = set(config.tools)
        builtins: list[Tool] = []
        if DATETIME in names:
            builtins.append(datetime_tool())
        root: Path | None = config.tools_root
        if names & FILE_TOOLS:
            assert root is not None  # config made sure (--tools-root)
            builtins += file_tools(root, names & FILE_TOOLS, timeout_s=float(config.tools_timeout))
        if SHELL in names:
            assert root is not None
            from vllm_use.tools.shell import shell_tool

            builtins.append(shell_tool(root))
        mcp = None
        if config.tools_mcp_config is not None:
            from vllm_use.tools.mcp_tools import McpServers

            mcp = McpServers.load(config.tools_mcp_config, call_timeout_s=float(config.tools_timeout))
        order = {name: i for i, name in enumerate(BUILTIN_TOOLS)}
        builtins.sort(key=lambda tool: order.get(tool.name, len(order)))
        return cls(builtins, mcp, float(config.tools_timeout))

    async def tools(self) -> list[Tool]:
        """Every enabled tool, the built-ins first."""
        found = list(self.builtins.values())
        if self.mcp is not None:
            found += await self.mcp.tools()
        return found

    async def find(self, name: str) -> Tool | None:
        """The tool called `name`, or None. An MCP server's tools are only asked for a name with a
        `.` (`<server>.<tool>`)."""
        if name in self.builtins:
            return self.builtins[name]
        if self.mcp is None or "." not in name:
            return None
        for tool in await self.mcp.tools():
            if tool.name == name:
                return tool
        return None

    def time_limit(self, tool: Tool) -> float:
        return min(tool.timeout_s, self.timeout_s)

    @contextlib.contextmanager
    def admit(self, key_id: str) -> Iterator[None]:
        """Hold one of `key_id`'s `CALLS_PER_KEY` call slots for the block, or TooManyRequests."""
        if self._calls.get(key_id, 0) >= CALLS_PER_KEY:
            raise TooManyRequests(
                f"this key already has {CALLS_PER_KEY} tool calls running; retry when one ends",
                retry_after_s=1,
            )
        self._calls[key_id] = self._calls.get(key_id, 0) + 1
        try:
            yield
        finally:
            left = self._calls[key_id] - 1
            if left:
                self._calls[key_id] = left
            else:
                del self._calls[key_id]

    async def call(self, tool: Tool, params: dict[str, Any]) -> Result:
        """Run `tool` once; its answer within the cap. ToolError from the tool passes through."""
        return cap_result(await tool.call(params))

    async def stream(self, tool: Tool, params: dict[str, Any]) -> AsyncIterator[str]:
        """`tool`'s chunks, `OUTPUT_MAX_BYTES` of them together at most: past that the last part
        is cut, `TRUNCATED` follows and the tool is stopped (its generator closed)."""
        assert tool.stream is not None
        left = OUTPUT_MAX_BYTES
        chunks = tool.stream(params)
        try:
            async for chunk in chunks:
                data = chunk.encode("utf-8", "replace")
                if len(data) > left:
                    yield cut_utf8(data, left).decode("utf-8", "ignore") + TRUNCATED
                    return
                left -= len(data)
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        if self.mcp is not None:
            await self.mcp.close()

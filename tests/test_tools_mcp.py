"""MCP servers' tools (docs/tools.md, "MCP tools"): the config file's checks at start-up, and the
tools of a real MCP server (tests/support/mcp_server.py, a child on loopback) listed and called
through the official client."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_server import McpTestServer, start_mcp_server
from tests.support.server import free_port
from vllm_use.errors import ConfigError
from vllm_use.tools.base import Tool, ToolError
from vllm_use.tools.mcp_tools import CONFIG_MAX_BYTES, MAX_SERVERS, McpServers

TOKEN = "mcp-test-token-5f3a9c1e"
TOKEN_VAR = "VLLM_USE_TEST_MCP_TOKEN"


@pytest.fixture(scope="module")
def notes() -> Iterator[McpTestServer]:
    """One MCP server for the module; it refuses any request without `Bearer TOKEN`."""
    with start_mcp_server(title="Notes", required_auth=f"Bearer {TOKEN}") as server:
        yield server


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VAR, TOKEN)


def write_config(tmp_path: Path, document: Any, mode: int = 0o600) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    path.chmod(mode)
    return path


def load(tmp_path: Path, servers: dict[str, Any], **kwargs: Any) -> McpServers:
    return McpServers.load(write_config(tmp_path, {"mcpServers": servers}), **kwargs)


def authorized(server: McpTestServer) -> dict[str, Any]:
    return {"url": server.url, "headers": {"Authorization": f"Bearer ${{{TOKEN_VAR}}}"}}


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


def listing(servers: McpServers) -> dict[str, dict[str, Any]]:
    return {entry["tool"]: entry for entry in (t.listing() for t in asyncio.run(servers.tools()))}


# --- the config file ---------------------------------------------------------------------------


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        McpServers.load(path)
    assert caught.value.option == "--tools-mcp-config"
    return caught.value.message


URL = "http://127.0.0.1:9/mcp"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("{not json", "not valid UTF-8 JSON (line 1, column 2)"),
        ([], "must be a JSON object"),
        ({"servers": {}}, "must be a JSON object"),
        ({"mcpServers": {"a": {"url": URL}}, "extra": 1}, "unknown top-level key 'extra'"),
        ({"mcpServers": {}}, "names no server"),
        ({"mcpServers": {"a" * 33: {"url": URL}}}, "must match [A-Za-z0-9_-]{1,32}"),
        ({"mcpServers": {"a.b": {"url": URL}}}, "must match [A-Za-z0-9_-]{1,32}"),
        ({"mcpServers": {"fs": {"command": "npx", "args": ["server"]}}}, "does not start stdio MCP servers"),
        ({"mcpServers": {"a": {"url": URL, "timeout": 5}}}, "unknown key 'timeout'"),
        ({"mcpServers": {"a": {"url": URL, "type": "sse"}}}, "'type' must be 'http'"),
        ({"mcpServers": {"a": {}}}, "'url' must be a non-empty string"),
        ({"mcpServers": {"a": {"url": "file:///etc/passwd"}}}, "http:// or https://"),
        ({"mcpServers": {"a": {"url": "http:///mcp"}}}, "http:// or https://"),
        ({"mcpServers": {"a": {"url": "http://user:pw@127.0.0.1/mcp"}}}, "carries credentials"),
        ({"mcpServers": {"a": {"url": URL, "headers": ["x"]}}}, "'headers' must be an object"),
        ({"mcpServers": {"a": {"url": URL, "headers": {"Bad Name": "x"}}}}, "not a valid header name"),
        ({"mcpServers": {"a": {"url": URL, "headers": {"Host": "evil"}}}}, "set by the MCP transport"),
        ({"mcpServers": {"a": {"url": URL, "headers": {"X-Key": 5}}}}, "must be a string"),
        ({"mcpServers": {"a": {"url": URL, "headers": {"X-Key": "a\r\nHost: evil"}}}}, "control characters"),
    ],
)
def test_load_refuses_a_bad_config_naming_the_problem(tmp_path: Path, document: Any, problem: str) -> None:
    assert problem in refused(write_config(tmp_path, document))


def test_load_names_a_missing_variable_without_any_header_value(tmp_path: Path) -> None:
    servers = {
        "docs": {
            "url": URL,
            "headers": {"X-Api-Key": "literal-secret-1", "Authorization": "Bearer ${NO_SUCH_VAR_4Q}"},
        }
    }
    message = refused(write_config(tmp_path, {"mcpServers": servers}))
    assert "'docs'" in message and "'Authorization'" in message and "NO_SUCH_VAR_4Q" in message
    assert "literal-secret-1" not in message and "Bearer" not in message


def test_load_refuses_a_variable_that_smuggles_a_header_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_VAR, "x\r\nX-Admin: yes")
    message = refused(
        write_config(tmp_path, {"mcpServers": {"a": {"url": URL, "headers": {"X-Key": f"${{{TOKEN_VAR}}}"}}}})
    )
    assert "control characters" in message and "X-Admin" not in message


def test_load_takes_at_most_16_servers(tmp_path: Path) -> None:
    servers = {f"s{i}": {"url": URL} for i in range(MAX_SERVERS)}
    assert len(McpServers.load(write_config(tmp_path, {"mcpServers": servers})).servers) == MAX_SERVERS
    servers["one-more"] = {"url": URL}
    assert f"at most {MAX_SERVERS}" in refused(write_config(tmp_path, {"mcpServers": servers}))


def test_load_takes_a_32_character_name_and_the_http_type(tmp_path: Path) -> None:
    name = "N_-" + "x" * 29
    loaded = McpServers.load(write_config(tmp_path, {"mcpServers": {name: {"url": URL, "type": "http"}}}))
    assert [server.name for server in loaded.servers] == [name]


def test_load_reads_a_file_of_1_mib_but_not_one_byte_more(tmp_path: Path) -> None:
    document = json.dumps({"mcpServers": {"a": {"url": URL}}})
    padded = document + " " * (CONFIG_MAX_BYTES - len(document))
    assert len(McpServers.load(write_config(tmp_path, padded)).servers) == 1
    assert f"larger than {CONFIG_MAX_BYTES} bytes" in refused(write_config(tmp_path, padded + " "))


def test_load_refuses_a_missing_file(tmp_path: Path) -> None:
    assert "does not exist" in refused(tmp_path / "nope.json")


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_load_refuses_a_file_others_can_write(tmp_path: Path, mode: int) -> None:
    path = write_config(tmp_path, {"mcpServers": {"a": {"url": URL}}}, mode=mode)
    assert "writable by group or others" in refused(path)
    assert McpServers.load(write_config(tmp_path, {"mcpServers": {"a": {"url": URL}}}, mode=0o644)).servers


def test_load_refuses_a_symlink(tmp_path: Path) -> None:
    target = write_config(tmp_path, {"mcpServers": {"a": {"url": URL}}})
    link = tmp_path / "link.json"
    os.symlink(target, link)
    assert "symbolic link" in refused(link)


# --- a real server -----------------------------------------------------------------------------


def test_tools_lists_the_servers_tools_with_their_write_permission(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    entries = listing(load(tmp_path, {"notes": authorized(notes)}))
    # A tool named past [A-Za-z0-9_.-]{1,64} is left out: 64 `n`s are listed, 65 and a space are not.
    assert set(entries) == {
        f"notes.{name}" for name in ("echo", "add", "fail", "write_note", "picture", "wait", "n" * 64)
    }
    writes = {name: entry["permissions"]["write"] for name, entry in entries.items()}
    assert writes["notes.echo"] is writes["notes.add"] is writes["notes.picture"] is False
    # No read-only hint: a write tool, so the chat asks before calling it.
    assert writes["notes.write_note"] is writes["notes.fail"] is True
    echo = entries["notes.echo"]
    assert echo["type"] == "mcp" and echo["available"] is True and echo["stream"] is False
    assert echo["display_name"] == "Notes"
    function = echo["definition"]["function"]
    assert function["name"] == "notes.echo" and function["description"] == "Echo the text back."
    assert function["parameters"]["properties"] == {"text": {"title": "Text", "type": "string"}}


def test_calls_return_the_servers_text(tmp_path: Path, notes: McpTestServer, token_env: None) -> None:
    tools = by_name(asyncio.run(load(tmp_path, {"notes": authorized(notes)}).tools()))

    async def main() -> list[Any]:
        return [
            await tools["notes.echo"].call({"text": "hello, world"}),
            await tools["notes.add"].call({"a": 2, "b": 40}),
            await tools["notes.picture"].call({}),
        ]

    assert asyncio.run(main()) == ["hello, world", "42", "a dot\n[image/png content omitted]"]


def test_a_tool_error_becomes_a_tool_error_with_its_text(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    fail = by_name(asyncio.run(load(tmp_path, {"notes": authorized(notes)}).tools()))["notes.fail"]
    with pytest.raises(ToolError, match="failed on purpose: the disk is full"):
        asyncio.run(fail.call({"reason": "the disk is full"}))


def test_a_call_past_its_time_limit_fails(tmp_path: Path, notes: McpTestServer, token_env: None) -> None:
    patient = by_name(asyncio.run(load(tmp_path, {"notes": authorized(notes)}).tools()))["notes.wait"]
    assert asyncio.run(patient.call({"seconds": 0})) == "waited"
    servers = load(tmp_path, {"notes": authorized(notes)}, call_timeout_s=0.5)
    wait = by_name(asyncio.run(servers.tools()))["notes.wait"]
    assert wait.timeout_s == 0.5
    with pytest.raises(ToolError, match=r"MCP server notes: no answer within 0\.5 s"):
        asyncio.run(wait.call({"seconds": 60}))


def test_a_call_cancelled_by_its_caller_ends_and_the_next_one_works(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    """What the toolbox does past --tools-timeout or when the client leaves: asyncio cancellation
    reaches through the SDK's anyio task groups."""
    wait = by_name(asyncio.run(load(tmp_path, {"notes": authorized(notes)}).tools()))["notes.wait"]

    async def main() -> str:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await wait.call({"seconds": 60})
        return str(await wait.call({"seconds": 0}))

    assert asyncio.run(main()) == "waited"


def test_headers_name_variables_the_server_needs(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    entries = listing(load(tmp_path, {"with": authorized(notes), "without": {"url": notes.url}}))
    assert "with.echo" in entries
    assert entries["without.*"]["available"] is False
    assert entries["without.*"]["error"].startswith("HTTP 401")


def test_a_down_server_is_one_unavailable_entry_and_the_others_stay(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    servers = load(
        tmp_path, {"down": {"url": f"http://127.0.0.1:{free_port()}/mcp"}, "notes": authorized(notes)}
    )
    tools = asyncio.run(servers.tools())
    down = [tool for tool in tools if tool.name.startswith("down.")]
    assert [tool.listing() for tool in down] == [
        {
            "tool": "down.*",
            "display_name": "down",
            "type": "mcp",
            "permissions": {"write": True},
            "definition": None,
            "available": False,
            "stream": False,
            "error": "cannot connect",
        }
    ]
    assert "notes.echo" in by_name(tools)
    with pytest.raises(ToolError, match="MCP server down is unavailable: cannot connect"):
        asyncio.run(down[0].call({}))


def test_the_listing_is_cached_but_every_call_reaches_the_server(
    tmp_path: Path, notes: McpTestServer, token_env: None
) -> None:
    servers = load(tmp_path, {"notes": authorized(notes)})

    async def main() -> tuple[int, int, int]:
        first = await servers.tools()
        after_list = notes.requests()
        again = await servers.tools()
        assert [t.name for t in again] == [t.name for t in first]
        after_second_list = notes.requests()
        await by_name(again)["notes.write_note"].call({"note": "remember"})
        return after_list, after_second_list, notes.requests()

    after_list, after_second_list, after_call = asyncio.run(main())
    assert after_second_list == after_list
    assert after_call > after_list


def test_no_header_value_reaches_the_log_or_the_listing(
    tmp_path: Path, notes: McpTestServer, token_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    servers = load(
        tmp_path, {"notes": authorized(notes), "wrong": {"url": notes.url, "headers": {"X-Key": TOKEN}}}
    )
    tools = asyncio.run(servers.tools())
    with pytest.raises(ToolError):
        asyncio.run(by_name(tools)["notes.fail"].call({"reason": "no"}))
    shown = json.dumps([tool.listing() for tool in tools]) + repr(servers.servers) + caplog.text
    assert "MCP server wrong unavailable: HTTP 401" in caplog.text
    assert TOKEN not in shown

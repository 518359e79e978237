"""The MCP Inspector CLI (the TypeScript SDK's client) against a running server: interoperability
(docs/mcp.md).

The Inspector is pinned in `tools/package.json` + `tools/package-lock.json` and
installed with `npm ci --prefix tools --ignore-scripts`; these tests fail, not
skip, when it is missing. It runs with a private HOME so it never touches the
user's `~/.mcp-inspector`, and every call has a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO
from tests.support.server import Server
from vllm_use.abilities import build_registry
from vllm_use.scopes import Scope

INSPECTOR = REPO / "tools" / "node_modules" / ".bin" / "mcp-inspector"
INSTALL = "npm ci --prefix tools --ignore-scripts"
CALL_TIMEOUT_S = 90
READ_TOOLS = [m.name for m in build_registry() if m.public or m.scope.mcp is Scope.MCP_READ]


@pytest.fixture(scope="module")
def read_secret(shared_server: Server) -> str:
    return shared_server.create_key("mcp.read", name="inspector")[1]


@pytest.fixture(scope="module")
def inspector_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inspector-home")


def inspector(server: Server, secret: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert INSPECTOR.exists(), f"the MCP Inspector is not installed: run `{INSTALL}` in {REPO}"
    command = [
        str(INSPECTOR),
        "--cli",
        server.base_url + "/mcp",
        "--transport",
        "http",
        "--protocol-era",
        "modern",
        "--header",
        f"Authorization: Bearer {secret}",
        "--format",
        "json",
        *args,
    ]
    # No proxy (the tests' fence sets one, tests/conftest.py): the Inspector talks to loopback only,
    # and with a proxy set it insists on routing through it, with a library it cannot load.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_USE_", "MCP_")) and not k.lower().endswith("_proxy")
    }
    env.update(
        HOME=str(home),
        MCP_CATALOG_PATH=str(home / "mcp.json"),
        MCP_CLIENT_CONFIG_PATH=str(home / "client.json"),
        NO_COLOR="1",
    )
    return subprocess.run(
        command, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, env=env, cwd=home, check=False
    )


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.stdout, f"exit {done.returncode}, stderr: {done.stderr}"
    return json.loads(done.stdout)["result"]


def test_inspector_lists_exactly_the_tools_of_a_read_key(
    shared_server: Server, read_secret: str, inspector_home: Path
) -> None:
    done = inspector(shared_server, read_secret, inspector_home, "--method", "tools/list")
    assert done.returncode == 0, done.stderr
    tools = result_of(done)["tools"]
    assert [t["name"] for t in tools] == READ_TOOLS
    assert all(t["inputSchema"]["type"] == "object" for t in tools)


def test_inspector_calls_test_and_gets_structured_content(
    shared_server: Server, read_secret: str, inspector_home: Path
) -> None:
    args = ("--method", "tools/call", "--tool-name", "test", "--tool-arg", "message=hi")
    done = inspector(shared_server, read_secret, inspector_home, *args)
    assert done.returncode == 0, done.stderr
    result = result_of(done)
    assert result["isError"] is False
    assert result["structuredContent"] == {"ok": True, "message": "hi", "protocol": "mcp"}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "vllm-use"


def test_inspector_receives_a_tool_failure_as_is_error(
    shared_server: Server, read_secret: str, inspector_home: Path
) -> None:
    # The Inspector turns `message=123` into a number, which the strict input model refuses.
    args = ("--method", "tools/call", "--tool-name", "test", "--tool-arg", "message=123")
    done = inspector(shared_server, read_secret, inspector_home, *args)
    assert done.returncode != 0
    assert "tool_is_error" in done.stderr  # not a schema or protocol complaint
    result = result_of(done)
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("invalid_arguments: ")

"""A small MCP server for tests, written with the official `mcp` package (its `MCPServer`, ex
FastMCP), served over streamable HTTP on loopback by uvicorn in a child process.

Tools: `echo` and `add` (annotated read-only), `fail` (answers `isError`), `write_note` (no
read-only hint, so a write tool for vllm-use), `picture` (read-only; a text and a PNG content), `wait` (read-only; answers after `seconds`), and three tools named `n`×64, `n`×65 and
`not a name` (an MCP server may use names an OpenAI function cannot have).

When `MCP_TEST_REQUIRED_AUTH` is set, every request to /mcp must carry exactly that
`Authorization` header, else 401 (what a server behind a bearer token does). `GET /requests`
(never checked) answers how many requests reached /mcp, so a test can see whether vllm-use
connected again. Run: `python -m tests.support.mcp_server --port N [--title T]`;
`start_mcp_server` does that and stops it at the end.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support import REPO
from tests.support.server import eventually, free_port

# A 1×1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


def build_app(title: str | None, required_auth: str | None) -> Any:
    """The ASGI app: the MCP server at /mcp behind the header check, and the request counter."""
    import anyio
    from mcp.server.mcpserver import Image, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    server = MCPServer("notes", title=title, log_level="ERROR")
    read_only = ToolAnnotations(read_only_hint=True)
    notes: list[str] = []

    @server.tool(description="Echo the text back.", annotations=read_only)
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two integers.", annotations=read_only)
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Always fails with the given reason.")
    def fail(reason: str) -> str:
        raise ToolError(f"failed on purpose: {reason}")

    @server.tool(description="Keep a note; answers how many notes are kept.")
    def write_note(note: str) -> str:
        notes.append(note)
        return f"{len(notes)} notes"

    @server.tool(description="A caption and a picture.", annotations=read_only, structured_output=False)
    def picture() -> list[Any]:
        return ["a dot", Image(data=PNG, format="png")]

    @server.tool(description="Wait this many seconds, then answer.", annotations=read_only)
    async def wait(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "waited"

    # Names vllm-use cannot offer as a function name (it lists the first, skips the other two).
    for name in ("n" * 64, "n" * 65, "not a name"):
        server.add_tool(lambda: "named", name=name, description="A name at or past vllm-use's rules.")

    mcp_app = server.streamable_http_app(streamable_http_path="/mcp")
    counted = {"requests": 0}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/requests":
            body = str(counted["requests"]).encode()
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            counted["requests"] += 1
            headers = dict(scope["headers"])
            if required_auth is not None and headers.get(b"authorization", b"").decode() != required_auth:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await mcp_app(scope, receive, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--title")
    args = parser.parse_args()
    import uvicorn

    app = build_app(args.title, os.environ.get("MCP_TEST_REQUIRED_AUTH"))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


@dataclass
class McpTestServer:
    url: str  # the MCP endpoint
    base_url: str
    proc: subprocess.Popen[bytes]

    def requests(self) -> int:
        """How many requests reached /mcp so far."""
        return int(httpx.get(self.base_url + "/requests", timeout=10).text)


@contextmanager
def start_mcp_server(title: str | None = None, required_auth: str | None = None) -> Iterator[McpTestServer]:
    """Run the server in a child on a free port until the block ends; ready when it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MCP_TEST_REQUIRED_AUTH"}
    if required_auth is not None:
        env["MCP_TEST_REQUIRED_AUTH"] = required_auth
    cmd = [sys.executable, "-m", "tests.support.mcp_server", "--port", str(port)]
    if title:
        cmd += ["--title", title]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    base_url = f"http://127.0.0.1:{port}"
    server = McpTestServer(url=base_url + "/mcp", base_url=base_url, proc=proc)

    def ready() -> bool:
        assert proc.poll() is None, f"the MCP test server exited with {proc.returncode}"
        try:
            server.requests()
        except httpx.TransportError:
            return False
        return True

    try:
        eventually(ready, timeout=60)  # bounds a hang; a start takes ~1 s
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()

"""`exec_shell_command`: one `/bin/sh -c` command in the tools root (docs/tools.md).

Only offered when `--tools` names it: whoever holds a `tools` key then runs any command as the
vllm-use user, in `--tools-root` (docs/security.md). What the child gets is decided here, from
scratch, never inherited:

- its environment is `command_env(root)`: a fixed PATH, HOME = the tools root, LANG and TERM;
  no variable of ours (no credential, no `VLLM_USE_*`, no `HF_TOKEN`) reaches it;
- stdin is /dev/null, stderr is merged into stdout;
- it leads a new session (`start_new_session`), so its process group is everything it started:
  a time limit, a client that goes away, or output past the cap (`OUTPUT_MAX_BYTES`) kills the
  whole group with SIGKILL, and the shell is reaped before the call returns.

Output is read from an asyncio pipe as the process writes it (no thread per read). A streamed
call yields those chunks; a plain call answers the whole output then `[exit status N]`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vllm_use.tools.base import OUTPUT_MAX_BYTES, Tool, ToolError, function

NAME = "exec_shell_command"
READ_SIZE = 64 * 1024
PATH = "/usr/local/bin:/usr/bin:/bin"


def command_env(root: Path) -> dict[str, str]:
    """The child's whole environment: an allow-list built from nothing."""
    return {"PATH": PATH, "HOME": str(root), "LANG": "C.UTF-8", "TERM": "dumb"}


def _command(params: dict[str, Any]) -> str:
    command = params.get("command")
    if set(params) != {"command"} or not isinstance(command, str) or not command.strip():
        raise ToolError("exec_shell_command takes {command: a non-empty string}")
    if "\x00" in command:  # its length is bounded by params' (PARAMS_MAX_BYTES)
        raise ToolError("the command must not contain NUL")
    return command


class _Run:
    """One running command: `chunks()` yields its output; `close()` kills its group and reaps it
    (always called, by `run`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(READ_SIZE):
            yield chunk

    async def close(self) -> int:
        """SIGKILL the process group, then reap the shell. At EOF the shell has closed its output,
        so it is exiting (its status is kept) and what remains of the group is leftovers."""
        if self.closed:
            return await asyncio.shield(self.proc.wait())
        self.closed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        # Shielded: a cancelled call (time limit, client gone) still waits for the reap.
        return await asyncio.shield(self.proc.wait())


@contextlib.asynccontextmanager
async def run(root: Path, command: str) -> AsyncIterator[_Run]:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        cwd=root,
        env=command_env(root),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    running = _Run(proc)
    try:
        yield running
    finally:
        await running.close()


def shell_tool(root: Path) -> Tool:
    """The exec_shell_command tool, working in `root` (already validated: --tools-root)."""

    async def call(params: dict[str, Any]) -> str:
        command = _command(params)
        out = bytearray()
        async with run(root, command) as running:
            async for chunk in running.chunks():
                out += chunk
                if len(out) > OUTPUT_MAX_BYTES:  # enough to know it is cut: stop it (the toolbox cuts)
                    return out.decode("utf-8", "replace")
            # The output is complete: reaping now gives the shell's own status.
            status = await running.close()
        return out.decode("utf-8", "replace") + f"\n[exit status {status}]"

    async def stream(params: dict[str, Any]) -> AsyncIterator[str]:
        command = _command(params)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        async with run(root, command) as running:
            async for chunk in running.chunks():
                text = decoder.decode(chunk)
                if text:
                    yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail

    description = (
        "Run one command with /bin/sh -c in the tools directory and return what it printed "
        "(stdout and stderr together), then its exit status. No input; a time limit applies."
    )
    return Tool(
        name=NAME,
        display_name="Run a shell command",
        type="builtin",
        write=True,
        definition=function(
            NAME,
            description,
            {"command": {"type": "string", "description": "the shell command line"}},
            ["command"],
        ),
        call=call,
        stream=stream,
        timeout_s=3600.0,  # --tools-timeout decides
    )

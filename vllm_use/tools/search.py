"""grep_search: the search runs in a child process (`grep_child`) that is killed at the time limit
(docs/tools.md, "File tools").

Why a child: a regular expression can backtrack for longer than any time limit (`(a+)+$` on a long
line of "a"s), and a thread running `re` cannot be stopped. A process can. The child is Python
started with `-I -S`, an empty environment and no inherited descriptor; the request (root, path,
pattern, flags) goes through its stdin, not argv, so it is not visible in the process list. Its
answers are JSON lines: one per match, then the end (or an error). The parent stops reading after
GREP_MAX_MATCHES + 1 matches, and kills the child when it is done, at the time limit, or when the
call is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_use.tools.base import ToolError
from vllm_use.tools.grep_child import GREP_MAX_MATCHES

_OUTPUT_LINE_LIMIT = 1024 * 1024  # one JSON line from the child (a path can be 64 levels deep)

# The child imports this module from the same place the parent did, whatever sys.path it has.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_CHILD_CODE = (
    f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); from vllm_use.tools.grep_child import main; main()"
)


@dataclass
class Found:
    """What one search found: at most GREP_MAX_MATCHES lines, whether there were more, and how
    many files were skipped (over 1 MiB, or not text)."""

    matches: list[str]
    more: bool
    skipped: int


async def grep_search(root: Path, args: dict[str, Any], timeout_s: float) -> str:
    """grep_search with checked `args` (pattern, path, regex, case_sensitive); runs on the IOLoop."""
    if not args["pattern"]:
        raise ToolError("pattern is empty")
    found = await search(root, args, timeout_s)
    out = list(found.matches)
    if found.more:
        out.append(f"… more than {GREP_MAX_MATCHES} matches; narrow the pattern or the path")
    if found.skipped:
        out.append(f"({found.skipped} files skipped: larger than 1 MiB or not text)")
    if not found.matches:
        out.insert(0, f"no match for {args['pattern']!r} under {args['path']!r}")
    return "\n".join(out)


async def search(root: Path, args: dict[str, Any], timeout_s: float) -> Found:
    """Run the search in a child and collect what it finds; runs on the IOLoop.

    Raises ToolError when the path is refused, the pattern is invalid, a file named on purpose
    cannot be searched, or the search passes `timeout_s` (the child is killed). Cancelling the call
    kills the child too."""
    request = {
        "root": str(root),
        **{key: args[key] for key in ("path", "pattern", "regex", "case_sensitive")},
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            _CHILD_CODE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
            limit=_OUTPUT_LINE_LIMIT,
        )
    except OSError as exc:
        raise ToolError(f"the search could not start: {exc.strerror or 'unknown error'}") from None
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(request).encode("utf-8"))
        await proc.stdin.drain()
        proc.stdin.close()
        async with asyncio.timeout(timeout_s):
            return await _collect(proc.stdout)
    except (BrokenPipeError, ConnectionResetError):  # the child died before reading its request
        raise ToolError("the search ended unexpectedly") from None
    except TimeoutError:
        raise ToolError(
            f"the search took longer than the time limit ({timeout_s:g} s) and was stopped; "
            "narrow the path or simplify the pattern"
        ) from None
    finally:
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass  # it ended on its own just now
        await proc.wait()


async def _collect(stdout: asyncio.StreamReader) -> Found:
    matches: list[str] = []
    while True:
        line = await stdout.readline()
        if not line:
            raise ToolError("the search ended unexpectedly")
        message: dict[str, Any] = json.loads(line)
        if "match" in message:
            if len(matches) == GREP_MAX_MATCHES:
                return Found(matches, True, 0)
            matches.append(message["match"])
        elif "error" in message:
            raise ToolError(message["error"])
        else:
            return Found(matches, False, message["skipped"])

"""Probing external tools (`vllm`, `hf`, `nvidia-smi`) for `system.get` (S4.4).

Each probe resolves the executable on PATH and runs its version command as a
child with a scrubbed environment and a timeout. Results are cached for
`CACHE_S` per resolved path: importing vLLM to print its version takes seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any

from tornado.process import Subprocess

from vllm_use.config import child_env

CACHE_S = 60.0
TIMEOUT_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?")
_cache: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}


async def probe(name: str, command: str, version_args: tuple[str, ...]) -> dict[str, Any]:
    """`{name, status: available|missing|error, path, version, message}`. Runs on the IOLoop."""
    path = shutil.which(command)
    if path is None:
        return {"name": name, "status": "missing", "path": None, "version": None, "message": None}
    path = os.path.realpath(path)
    cached = _cache.get((name, path))
    if cached and time.monotonic() - cached[0] < CACHE_S:
        return cached[1]
    result = await _run_version(name, path, version_args)
    _cache[(name, path)] = (time.monotonic(), result)
    return result


async def _run_version(name: str, path: str, args: tuple[str, ...]) -> dict[str, Any]:
    base = {"name": name, "path": path}
    try:
        proc = Subprocess(
            [path, *args],
            stdout=Subprocess.STREAM,
            stderr=Subprocess.STREAM,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            start_new_session=True,
        )
    except OSError as exc:
        return {**base, "status": "error", "version": None, "message": f"cannot run: {exc.strerror}"}
    try:
        out, err, code = await asyncio.wait_for(
            asyncio.gather(
                proc.stdout.read_until_close(),
                proc.stderr.read_until_close(),
                proc.wait_for_exit(raise_error=False),
            ),
            TIMEOUT_S,
        )
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return {**base, "status": "error", "version": None, "message": f"no answer within {TIMEOUT_S:.0f} s"}
    text = _ANSI.sub("", (out + err).decode("utf-8", "replace"))
    if code != 0:
        last = text.strip().splitlines()[-1:] or [""]
        return {**base, "status": "error", "version": None, "message": f"exit {code}: {last[0][:500]}"}
    match = _VERSION.search(text)
    if not match:
        return {**base, "status": "error", "version": None, "message": "no version in its output"}
    return {**base, "status": "available", "version": match.group(0), "message": None}

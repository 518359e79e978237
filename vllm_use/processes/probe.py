"""Probing external tools (`vllm`, `hf`, `nvidia-smi`) for `system.get` (docs/architecture.md,
"Honest reports").

Each probe resolves the executable on PATH and runs its version command as a
child with the allow-listed environment (`config.child_env()`), `/` as its
working directory and a timeout. Results are cached for `CACHE_S` per resolved
path: importing vLLM to print its version takes seconds (~11 s and ~520 MB).
While the cache is cold, one probe per tool is in flight and every concurrent
caller awaits that one, so a burst of `system.get` calls can't fork a child each.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from typing import Any

from vllm_use.config import child_env
from vllm_use.processes import children

CACHE_S = 60.0
TIMEOUT_S = 30.0
# Printing a version needs no network: without these, `hf version` asks the hub (agent harnesses)
# and PyPI (a newer release) on every probe.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?")
_cache: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
_inflight: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}


async def probe(name: str, command: str, version_args: tuple[str, ...]) -> dict[str, Any]:
    """`{name, status: available|missing|error, path, version, message}`. Runs on the IOLoop."""
    path = shutil.which(command)
    if path is None:
        return {"name": name, "status": "missing", "path": None, "version": None, "message": None}
    key = (name, os.path.realpath(path))
    cached = _cache.get(key)
    if cached and time.monotonic() - cached[0] < CACHE_S:
        return cached[1]
    running = _inflight.get(key)
    if running is None:
        running = _inflight[key] = asyncio.ensure_future(_run_version(name, key[1], version_args))
        running.add_done_callback(lambda done: _settle(key, done))
    # shield: a caller that goes away must not cancel the probe the others are waiting for.
    return await asyncio.shield(running)


def _settle(key: tuple[str, str], done: asyncio.Future[dict[str, Any]]) -> None:
    _inflight.pop(key, None)
    if not done.cancelled() and done.exception() is None:
        _cache[key] = (time.monotonic(), done.result())


async def _run_version(name: str, path: str, args: tuple[str, ...]) -> dict[str, Any]:
    base = {"name": name, "path": path}
    try:
        # "/" as the working directory, never the server's: nothing there may shape what the tool
        # imports. It dies with us: a probe outliving vllm-use would be nobody's.
        proc = children.spawn([path, *args], child_env(OFFLINE), cwd="/", parent_death=True)
    except OSError as exc:
        return {**base, "status": "error", "version": None, "message": f"cannot run: {exc.strerror}"}
    assert proc.stdout is not None
    try:
        output, code = await asyncio.wait_for(
            asyncio.gather(proc.stdout.read_until_close(), children.exited(proc)),
            TIMEOUT_S,
        )
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await children.exited(proc)  # the wait above was cancelled: reap it now (SIGKILL ends it)
        return {**base, "status": "error", "version": None, "message": f"no answer within {TIMEOUT_S:.0f} s"}
    text = _ANSI.sub("", output.decode("utf-8", "replace"))
    if code != 0:
        last = text.strip().splitlines()[-1:] or [""]
        return {**base, "status": "error", "version": None, "message": f"exit {code}: {last[0][:500]}"}
    match = _VERSION.search(text)
    if not match:
        return {**base, "status": "error", "version": None, "message": "no version in its output"}
    return {**base, "status": "available", "version": match.group(0), "message": None}

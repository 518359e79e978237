"""The supervisor of one `vllm serve` (docs/runtime.md). Runs on the IOLoop.

The child is `python -I -m vllm_use.runtime.reaper` leading a new session with
`vllm serve` under it (see reaper.py: if vllm-use dies, the whole group dies),
isolated (`-I`: no working directory or PYTHON* variables on its `sys.path`) and
started in its private scratch directory with `config.child_env()`.
stdout and stderr are one pipe, drained into a bounded `RuntimeLog`; a terminal
state is published only after all output was read.

Starting is split in two so that no caller is held hostage by a load that takes
minutes: `spawn` (caller holds `Lifecycle.lock`) starts the child and a
readiness task, and returns at once; the readiness task polls
`http://127.0.0.1:<port>/health` (no proxies, no redirects; connection refused
means still loading) whether or not anyone waits, and a 200 counts only once the
port's listening socket is shown to belong to the child's process group
(`port_held_by_group`), so another local process that grabbed the port is never
taken for vLLM. The start *settles* when the state leaves `starting` (ready,
failed, or a stop canceled it); callers that want to block await that with
their own bound (`wait_settled`). Stop: SIGTERM to the group, SIGKILL after the
grace period (at once for a start still loading), then wait (bounded) until no
process of the group is left in /proc.

Every state change is published to subscribers (`subscribe`: the console's
event stream), and so is every new log line.

Each child gets a random API key in its environment (`VLLM_API_KEY`, never in
argv, status or logs): vLLM then refuses `/v1/*` without it, and the gateway
injects it (`AppContext.upstream_target`), so the loopback port is no open door.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError
from tornado.process import Subprocess

from vllm_use.config import Config, child_env
from vllm_use.errors import Conflict, ExternalError, RuntimeFailed, StartRefused
from vllm_use.logbuffer import LogBuffer
from vllm_use.processes import children
from vllm_use.runtime.failure import explain
from vllm_use.runtime.options import RuntimeOptions, build_argv
from vllm_use.runtime.procfs import child_in_group, group_members, port_held_by_group

log = logging.getLogger(__name__)

TERM_GRACE_S = 10.0
REAP_CAP_S = 15.0
POLL_S = 0.25
LAST_LINES = 20
REASON_LINES = 200  # how far back the reason of a failed start is looked for (failure.py)
CANCELED = "the start was canceled by a stop"


class RuntimeState(StrEnum):
    """What the runtime is doing (`runtime.status` → `state`).

        stopped, failed ──spawn──▶ starting ──/health 200 on a port of its own──▶ ready
        starting ──exit, start timeout, port taken──▶ failed ◀──exit── ready
        starting ──stop: SIGKILL at once──▶ stopping ◀──stop: SIGTERM, SIGKILL after the grace── ready
        stopping ──group gone──▶ stopped          stopping ──group not reaped──▶ failed

    `live` states have a process group of ours; only `starting` has a start to settle.
    """

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"

    @property
    def live(self) -> bool:
        return self in (RuntimeState.STARTING, RuntimeState.READY, RuntimeState.STOPPING)


Listener = Callable[[str, "dict[str, Any] | None"], None]


class RuntimeLog(LogBuffer):
    """vLLM's output: a `LogBuffer` that counts the lines it took (`seq`) and reports each one,
    so the event stream can send the new lines without copying the whole buffer."""

    def __init__(self, on_line: Callable[[], None]) -> None:
        super().__init__()
        self.seq = 0
        self._on_line = on_line

    def _push(self, line: bytes) -> None:
        super()._push(line)
        self.seq += 1
        self._on_line()

    def since(self, seq: int, limit: int) -> tuple[list[str], bool]:
        """The lines taken after line number `seq`, at most the newest `limit`; and whether some
        of them are not in the list (dropped from the buffer, or over the limit)."""
        new = max(self.seq - seq, 0)
        count = min(new, len(self._lines), limit)
        newest = list(itertools.islice(reversed(self._lines), count))
        return [line.decode("utf-8", "replace") for line in reversed(newest)], count < new


@dataclass
class Child:
    proc: Subprocess
    pgid: int
    argv: list[str]
    options: RuntimeOptions
    port: int
    model: str
    active_model_id: str | None
    model_path: Path | None
    scratch: Path
    api_key: str  # the child's VLLM_API_KEY: for the gateway only, never shown
    exited: asyncio.Future[int]
    drained: asyncio.Future[None]
    # The status at the moment the start left `starting` (ready, failed, or stopping: canceled).
    settled: asyncio.Future[dict[str, Any]]
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    stopping: bool = False  # we are killing it (stop or failure): its exit is no news
    refused: bool = False  # it exited because vLLM refused its options or model files (failure.py)
    tasks: list[asyncio.Future[None]] = field(
        default_factory=list
    )  # drain, watch, readiness: kept referenced


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = RuntimeState.STOPPED
        self.child: Child | None = None
        self.logs = RuntimeLog(self._log_line)
        self.exit_code: int | None = None
        self.error: str | None = None
        self.last_lines: list[str] = []
        self._listeners: set[Listener] = set()

    # --- views and events ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        child = self.child
        state = self.state
        starting = child is not None and state is RuntimeState.STARTING
        return {
            "state": state.value,
            "pid": self.vllm_pid() if child and state.live else None,
            "pgid": child.pgid if child else None,
            "port": child.port if child else None,
            "model": child.model if child else None,
            "active_model_id": child.active_model_id if child else None,
            "options": child.options.model_dump(mode="json", exclude_none=True) if child else None,
            "started_at": _iso(child.started_at) if child else None,
            "uptime_s": round(time.monotonic() - child.started_monotonic, 1)
            if child and state is RuntimeState.READY
            else None,
            "starting_for_s": round(time.monotonic() - child.started_monotonic, 1) if starting else None,
            "start_timeout_s": child.options.start_timeout_s if child else None,
            "last_line": self.logs.last_line() if starting else None,
            "exit_code": self.exit_code,
            "error": self.error,
            "last_lines": self.last_lines if state is RuntimeState.FAILED else [],
        }

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """`listener("state", status)` on each state change, `listener("log", None)` on each new log
        line (read them from `logs`). Called on the IOLoop; it must not block. Returns the
        unsubscribe function."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _publish(self, state: RuntimeState) -> None:
        """Enter `state` and tell the listeners; a start that leaves `starting` settles here."""
        self.state = state
        status = self.status()
        child = self.child
        if child is not None and state is not RuntimeState.STARTING and not child.settled.done():
            child.settled.set_result(status)
        for listener in list(self._listeners):
            listener("state", status)

    def _log_line(self) -> None:
        for listener in list(self._listeners):
            listener("log", None)

    def vllm_pid(self) -> int | None:
        """The `vllm serve` main process: the reaper's child."""
        if self.child is None:
            return None
        return child_in_group(self.child.pgid, self.child.proc.pid)

    def is_running(self, model_id: str, path: Path | None) -> bool:
        """For the lifecycle lock: is this model what runs (or starts, or stops) now?"""
        child = self.child
        if child is None or not self.state.live:
            return False
        if child.active_model_id == model_id:
            return True
        return path is not None and child.model_path is not None and child.model_path == path

    # --- start ---------------------------------------------------------------------------------

    def spawn(
        self,
        model: str,
        options: RuntimeOptions,
        *,
        active_model_id: str | None,
        model_path: Path | None,
        sleep_mode: bool = False,
    ) -> Child:
        """Start the child and its readiness task, and return at once (state `starting`).

        `sleep_mode`: vLLM's sleep mode (`--enable-sleep-mode`, and `VLLM_SERVER_DEV_MODE=1` in this
        child's environment alone, which adds /sleep, /wake_up and /is_sleeping to its routes; the
        gateway never relays those: docs/router.md, "Sleep").

        The caller holds the lifecycle lock and stopped any previous child. Raises Conflict while
        a child is live, ExternalError when the shim cannot be started.
        """
        if self.state.live:
            raise Conflict(f"the runtime is {self.state}; stop it first")
        port = options.port or self.config.runtime_port
        argv = build_argv(self.config.vllm_bin, model, options, port)
        if sleep_mode:
            argv.append("--enable-sleep-mode")
        # -I: a `vllm_use/` lying in some working directory, or PYTHONPATH, can't replace the shim.
        shim = [sys.executable, "-I", "-m", "vllm_use.runtime.reaper", str(os.getpid()), "--", *argv]
        # vLLM puts ZMQ sockets in TMPDIR, and their paths (TMPDIR + 37 characters) must fit in
        # 107: a private short directory per child, removed when its group is gone.
        # mkdtemp: a fresh 0700 directory with a random name, so a shared /tmp is safe here.
        short = "/tmp" if os.path.isdir("/tmp") else None  # noqa: S108
        scratch = tempfile.mkdtemp(prefix="vllm-use-", dir=short)
        api_key = secrets.token_urlsafe(32)
        extra = {
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": scratch,
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_API_KEY": api_key,  # the environment, not argv: /proc/<pid>/cmdline is world-readable
        }
        if sleep_mode:
            extra["VLLM_SERVER_DEV_MODE"] = "1"
        if options.gpu_ids is not None:
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in options.gpu_ids)
        try:
            # The shim handles the parent's death; its cwd is the scratch directory, ours alone.
            proc = children.spawn(shim, child_env(extra), cwd=scratch, parent_death=False)
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise ExternalError(f"cannot start the runtime: {exc.strerror}") from None
        loop = asyncio.get_running_loop()
        self.logs = RuntimeLog(self._log_line)
        self.exit_code, self.error, self.last_lines = None, None, []
        child = Child(
            proc=proc,
            pgid=proc.pid,
            argv=argv,
            options=options,
            port=port,
            model=model,
            active_model_id=active_model_id,
            model_path=model_path,
            scratch=Path(scratch),
            api_key=api_key,
            exited=asyncio.ensure_future(children.exited(proc)),
            drained=loop.create_future(),
            settled=loop.create_future(),
        )
        self.child = child
        self._publish(RuntimeState.STARTING)
        child.tasks = [
            asyncio.ensure_future(self._drain(child)),
            asyncio.ensure_future(self._watch(child)),
            asyncio.ensure_future(self._readiness(child)),
        ]
        log.info("runtime: started %s on port %d (pgid %d)", model, port, child.pgid)
        return child

    async def wait_settled(self, child: Child, timeout_s: float) -> dict[str, Any]:
        """Wait at most `timeout_s` (0: not at all) for `child`'s start to settle.

        Returns the status when it is ready, or while it is still starting when the time ran
        out; raises StartRefused (422) when vLLM refused its options or model files, RuntimeFailed
        (502) when it failed otherwise, both with the reason in the message and the last lines;
        Conflict (409) when a stop canceled it. Leaving early changes nothing: the readiness task goes on.
        """
        if timeout_s > 0 and not child.settled.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(child.settled), timeout_s)
        if not child.settled.done():
            return self.status()  # still starting: a child that is replaced has settled first
        status = child.settled.result()
        if status["state"] == RuntimeState.READY:
            return status
        if status["state"] == RuntimeState.FAILED:
            if child.refused:
                raise StartRefused(
                    status["error"] or "vLLM refused to start", last_lines=status["last_lines"]
                )
            raise RuntimeFailed(status["error"] or "vllm failed to start", last_lines=status["last_lines"])
        raise Conflict(status["error"] or CANCELED, state=status["state"])

    def _loading(self, child: Child) -> bool:
        return self.child is child and self.state is RuntimeState.STARTING and not child.stopping

    async def _readiness(self, child: Child) -> None:
        """The start's own task: until /health answers 200 on a port of the child's group, the
        child dies (`_watch`), `start_timeout_s` passes, or a stop ends the start."""
        try:
            await self._poll_health(child)
        except Exception:  # a bug here must not leave the start hanging in `starting`
            log.exception("runtime: readiness check of pgid %d failed", child.pgid)
            if self._loading(child):
                await self._fail(child, "internal error while waiting for vLLM (see the server log)")

    async def _poll_health(self, child: Child) -> None:
        deadline = child.started_monotonic + child.options.start_timeout_s
        client = AsyncHTTPClient()
        url = f"http://127.0.0.1:{child.port}/health"
        loop = asyncio.get_running_loop()
        while self._loading(child):
            try:
                request = HTTPRequest(url, follow_redirects=False, request_timeout=5, connect_timeout=2)
                response = await client.fetch(request, raise_error=False)
                healthy = response.code == 200
            except (OSError, HTTPClientError, StreamClosedError):
                healthy = False  # connection refused: still loading (vLLM opens its port only when ready)
            if healthy and self._loading(child):
                ours = await loop.run_in_executor(None, port_held_by_group, child.port, child.pgid)
                if not self._loading(child):
                    return  # stopped or failed meanwhile
                if not ours:
                    await self._fail(child, f"port {child.port} is held by another process")
                    return
                log.info("runtime: %s is ready on port %d", child.model, child.port)
                self._publish(RuntimeState.READY)
                return
            if time.monotonic() > deadline:
                if self._loading(child):
                    await self._fail(child, f"not healthy within {child.options.start_timeout_s} s")
                return
            await asyncio.sleep(POLL_S)

    # --- stop ----------------------------------------------------------------------------------

    async def stop(self, *, grace_s: float = TERM_GRACE_S) -> dict[str, Any]:
        """Stop the child (caller holds the lifecycle lock). A loading child is killed at once,
        and its start settles as canceled."""
        child = self.child
        if child is None or not self.state.live:
            if child is not None:
                await self._kill_group(child)  # a failed child's group is gone already; make sure
            return self.status()
        loading = self.state is RuntimeState.STARTING
        child.stopping = True
        self.error = CANCELED if loading else None
        self._publish(RuntimeState.STOPPING)
        try:
            await self._terminate(child, grace_s=0.0 if loading else grace_s)
        except ExternalError as exc:
            self.error = exc.message
            self._publish(RuntimeState.FAILED)
            raise
        self._publish(RuntimeState.STOPPED)
        log.info("runtime: stopped %s", child.model)
        return self.status()

    async def _terminate(self, child: Child, *, grace_s: float) -> None:
        if grace_s > 0:
            children.signal_group(child.pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(child.exited), grace_s)
            except TimeoutError:
                log.warning("runtime: pgid %d ignored SIGTERM for %.0f s; killing it", child.pgid, grace_s)
        await self._kill_group(child)

    async def _kill_group(self, child: Child) -> None:
        """SIGKILL what is left of the group and wait (bounded) until /proc shows none of it."""
        deadline = time.monotonic() + REAP_CAP_S
        while True:
            children.signal_group(child.pgid, signal.SIGKILL)
            left = await asyncio.get_running_loop().run_in_executor(None, group_members, child.pgid)
            if not left and child.exited.done():
                break
            if time.monotonic() > deadline:
                raise ExternalError(
                    f"processes {left} of the runtime's group {child.pgid} could not be reaped within "
                    f"{REAP_CAP_S:.0f} s"
                )
            await asyncio.sleep(0.1)
        await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, child.scratch, True)
        try:
            await asyncio.wait_for(asyncio.shield(child.drained), REAP_CAP_S)
        except TimeoutError:
            raise ExternalError(
                f"the runtime's output pipe stayed open {REAP_CAP_S:.0f} s after its group was killed"
            ) from None

    # --- background ----------------------------------------------------------------------------

    async def _drain(self, child: Child) -> None:
        await children.drain(child.proc, self.logs)
        child.drained.set_result(None)

    async def _watch(self, child: Child) -> None:
        """The child exited: unless we stopped it, that's a failure.

        The group is killed before the output is awaited: orphaned engine processes hold the
        pipe open, so end-of-output only comes once they are gone. `_fail` publishes the state
        after all output was read.
        """
        code = await child.exited
        if child.stopping or self.child is not child:
            return
        await self._fail(child, f"vllm exited with status {code}", code, exited=True)

    async def _fail(
        self, child: Child, reason: str, code: int | None = None, *, exited: bool = False
    ) -> None:
        child.stopping = True
        try:
            await self._kill_group(child)  # orphans (EngineCore, Worker) go too
        except ExternalError as exc:
            reason = f"{reason}; {exc.message}"
        if self.child is not child or self.state not in (RuntimeState.STARTING, RuntimeState.READY):
            return  # a stop took over while we killed: its outcome stands
        if code is None and child.exited.done():
            code = child.exited.result()
        # The reaper reports vLLM's signals as 128+N; a signal to the reaper itself reads the same.
        self.exit_code = 128 - code if code is not None and code < 0 else code
        self.last_lines = self.logs.lines(LAST_LINES)
        if exited:  # vLLM's own words, so the reason stands next to the button that started it
            why = explain(self.logs.lines(REASON_LINES), self.exit_code)
            child.refused = why.refused
            if why.reason:
                reason = f"{reason}: {why.reason}"
        self.error = reason
        log.warning("runtime: %s failed: %s", child.model, reason)
        self._publish(RuntimeState.FAILED)

    async def shutdown(self) -> None:
        if self.child is not None and self.state.live:
            await self.stop()


def _iso(seconds: float) -> str:
    from vllm_use.clock import iso

    return iso(int(seconds * 1000)) or ""

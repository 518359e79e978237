"""The supervisor of one `vllm serve` (S4.3). Runs on the IOLoop.

    stopped ──start/switch──▶ starting ──/health 200──▶ ready
       ▲                        │  │                      │
       │                        │  └─exit / timeout──▶ failed ◀──exit──┘
       └──────── stopping ◀─────┴──────stop─────────────────┘

The child is `python -I -m vllm_use.runtime.reaper` leading a new session with
`vllm serve` under it (see reaper.py: if vllm-use dies, the whole group dies),
isolated (`-I`: no working directory or PYTHON* variables on its `sys.path`) and
started in its private scratch directory with `config.child_env()`.
stdout and stderr are one pipe, drained into a bounded `LogBuffer`; a terminal
state is published only after all output was read. Readiness polls
`http://127.0.0.1:<port>/health` (no proxies, no redirects; connection refused
means still loading); a 200 counts only once the port's listening socket is
shown to belong to the child's process group (`port_held_by_group`), so another
local process that grabbed the port is never taken for vLLM. Stop: SIGTERM to
the group, SIGKILL after the grace period, then wait (bounded) until no process
of the group is left in /proc. Callers hold `Lifecycle.lock` around start/stop;
`wait_ready` runs outside it so a stop can cancel a start that is still loading.

Each child gets a random API key in its environment (`VLLM_API_KEY`, never in
argv, status or logs): vLLM then refuses `/v1/*` without it, and the gateway
injects it (`AppContext.upstream_target`), so the loopback port is no open door.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError
from tornado.process import Subprocess

from vllm_use import children
from vllm_use.config import Config, child_env
from vllm_use.errors import Conflict, ExternalError, RuntimeFailed
from vllm_use.logbuffer import LogBuffer
from vllm_use.runtime.options import RuntimeOptions, build_argv

log = logging.getLogger(__name__)

TERM_GRACE_S = 10.0
REAP_CAP_S = 15.0
POLL_S = 0.25
LAST_LINES = 20


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
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    stopping: bool = False
    tasks: list[asyncio.Future[None]] = field(default_factory=list)  # drain and watch, kept referenced


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is `pgid`, read from /proc (the main pid alone is not enough)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields after the last ")" are fixed.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


# /proc/net/tcp{,6} addresses (hex, in the kernel's byte order) that take connections to 127.0.0.1.
_LOOPBACK_LISTENERS = {
    "0100007F",  # 127.0.0.1
    "00000000",  # 0.0.0.0
    "00000000000000000000000000000000",  # :: (dual-stack)
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
_TCP_LISTEN = "0A"


def listening_inodes(port: int) -> set[int]:
    """Socket inodes LISTENing on `port` where a connection to 127.0.0.1 could land. Runs in the executor."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6 on this kernel
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and address in _LOOPBACK_LISTENERS:
                inodes.add(int(fields[9]))
    return inodes


def socket_inodes(pids: list[int]) -> set[int]:
    """Inodes of the sockets the processes `pids` hold open (`/proc/<pid>/fd` → `socket:[N]`)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def port_held_by_group(port: int, pgid: int) -> bool:
    """Whether every socket listening on 127.0.0.1:`port` is held by a process of group `pgid`.

    Fails closed: no listener found, or one we can't attribute to the group, is "not ours".
    Runs in the executor (it walks /proc).
    """
    listening = listening_inodes(port)
    return bool(listening) and listening <= socket_inodes(group_members(pgid))


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = "stopped"
        self.child: Child | None = None
        self.logs = LogBuffer()
        self.exit_code: int | None = None
        self.error: str | None = None
        self.last_lines: list[str] = []

    # --- views ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        child = self.child
        return {
            "state": self.state,
            "pid": self.vllm_pid() if child and self.state in ("starting", "ready", "stopping") else None,
            "pgid": child.pgid if child else None,
            "port": child.port if child else None,
            "model": child.model if child else None,
            "active_model_id": child.active_model_id if child else None,
            "options": child.options.model_dump(mode="json", exclude_none=True) if child else None,
            "started_at": _iso(child.started_at) if child else None,
            "uptime_s": round(time.monotonic() - child.started_monotonic, 1)
            if child and self.state == "ready"
            else None,
            "exit_code": self.exit_code,
            "error": self.error,
            "last_lines": self.last_lines if self.state == "failed" else [],
        }

    def vllm_pid(self) -> int | None:
        """The `vllm serve` main process: the reaper's child."""
        if self.child is None:
            return None
        shim = self.child.proc.pid
        for pid in group_members(self.child.pgid):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2 :].split()[1]) == shim:
                return pid
        return None

    def is_running(self, model_id: str, path: Path | None) -> bool:
        """For the lifecycle lock: is this model what runs (or starts, or stops) now?"""
        child = self.child
        if child is None or self.state not in ("starting", "ready", "stopping"):
            return False
        if child.active_model_id == model_id:
            return True
        return path is not None and child.model_path is not None and child.model_path == path

    # --- start ---------------------------------------------------------------------------------

    def spawn(
        self, model: str, options: RuntimeOptions, *, active_model_id: str | None, model_path: Path | None
    ) -> None:
        """Start the child (caller holds the lifecycle lock and stopped any previous one)."""
        if self.state in ("starting", "ready", "stopping"):
            raise Conflict(f"the runtime is {self.state}; stop it first")
        port = options.port or self.config.runtime_port
        argv = build_argv(self.config.vllm_bin, model, options, port)
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
        if options.gpu_ids is not None:
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in options.gpu_ids)
        self.logs = LogBuffer()
        self.exit_code, self.error, self.last_lines = None, None, []
        try:
            # The shim handles the parent's death; its cwd is the scratch directory, ours alone.
            proc = children.spawn(shim, child_env(extra), cwd=scratch, parent_death=False)
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise ExternalError(f"cannot start the runtime: {exc.strerror}") from None
        loop = asyncio.get_running_loop()
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
            exited=asyncio.ensure_future(proc.wait_for_exit(raise_error=False)),
            drained=loop.create_future(),
        )
        self.child = child
        self.state = "starting"
        child.tasks = [asyncio.ensure_future(self._drain(child)), asyncio.ensure_future(self._watch(child))]
        log.info("runtime: started %s on port %d (pgid %d)", model, port, child.pgid)

    async def wait_ready(self) -> dict[str, Any]:
        """Until /health answers 200, the child dies, the timeout passes, or a stop cancels us."""
        child = self.child
        assert child is not None
        deadline = time.monotonic() + child.options.start_timeout_s
        client = AsyncHTTPClient()
        url = f"http://127.0.0.1:{child.port}/health"
        while True:
            if self.child is not child or self.state != "starting":
                if self.state == "ready" and self.child is child:
                    return self.status()
                if self.state == "failed":
                    raise RuntimeFailed(self.error or "vllm failed to start", last_lines=self.last_lines)
                raise Conflict(self.error or f"the start was interrupted (runtime {self.state})")
            try:
                request = HTTPRequest(url, follow_redirects=False, request_timeout=5, connect_timeout=2)
                response = await client.fetch(request, raise_error=False)
                if response.code == 200 and self.state == "starting" and self.child is child:
                    ours = await asyncio.get_running_loop().run_in_executor(
                        None, port_held_by_group, child.port, child.pgid
                    )
                    if self.state == "starting" and self.child is child:
                        if not ours:
                            await self._fail(child, f"port {child.port} is held by another process")
                            raise RuntimeFailed(self.error or "port in use", last_lines=self.last_lines)
                        self.state = "ready"
                        log.info("runtime: %s is ready on port %d", child.model, child.port)
                        return self.status()
                    continue  # stopped or replaced meanwhile: the top of the loop says how
            except (OSError, HTTPClientError, StreamClosedError):
                pass  # connection refused: still loading (vLLM opens its port only when ready)
            if time.monotonic() > deadline:
                await self._fail(child, f"not healthy within {child.options.start_timeout_s} s")
                raise RuntimeFailed(self.error or "start timed out", last_lines=self.last_lines)
            await asyncio.sleep(POLL_S)

    # --- stop ----------------------------------------------------------------------------------

    async def stop(self, *, grace_s: float = TERM_GRACE_S) -> dict[str, Any]:
        """Stop the child (caller holds the lifecycle lock). A loading child is killed at once."""
        child = self.child
        if child is None or self.state in ("stopped", "failed"):
            if child is not None:
                await self._kill_group(child)
            self.state = "stopped" if self.state != "failed" else "failed"
            return self.status()
        loading = self.state == "starting"
        child.stopping = True
        self.state = "stopping"
        self.error = "the start was canceled" if loading else None  # wait_ready may wake before we end
        try:
            await self._terminate(child, grace_s=0.0 if loading else grace_s)
        except ExternalError as exc:
            self.state, self.error = "failed", exc.message
            raise
        self.state = "stopped"
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
        await self._fail(child, f"vllm exited with status {code}", code)

    async def _fail(self, child: Child, reason: str, code: int | None = None) -> None:
        child.stopping = True
        try:
            await self._kill_group(child)  # orphans (EngineCore, Worker) go too
        except ExternalError as exc:
            reason = f"{reason}; {exc.message}"
        if code is None and child.exited.done():
            code = child.exited.result()
        # The reaper reports vLLM's signals as 128+N; a signal to the reaper itself reads the same.
        self.exit_code = 128 - code if code is not None and code < 0 else code
        self.last_lines = self.logs.lines(LAST_LINES)
        self.error = reason
        self.state = "failed"
        log.warning("runtime: %s failed: %s", child.model, reason)

    async def shutdown(self) -> None:
        if self.child is not None and self.state in ("starting", "ready", "stopping"):
            await self.stop()


def _iso(seconds: float) -> str:
    from vllm_use.keys import iso

    return iso(int(seconds * 1000)) or ""

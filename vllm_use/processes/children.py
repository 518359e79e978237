"""Helpers for the children we supervise (`hf` downloads and `vllm serve`).

A child spawned with `parent_death=True` runs through the die_with_parent shim: on
Linux the kernel SIGKILLs it when vllm-use dies, even by SIGKILL (PR_SET_PDEATHSIG),
so a crash never leaves a download running unsupervised. No Python code runs
between `fork` and `exec` here (docs/architecture.md, "Children").

Every child gets an explicit working directory that vllm-use owns, never the
server's own (whatever lies there must not end up on a child's `sys.path`), and
the allow-listed environment of `config.child_env()` (docs/security.md).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
import sys
import threading

from tornado.iostream import PipeIOStream, StreamClosedError
from tornado.process import Subprocess

from vllm_use.logbuffer import LogBuffer

_SHIM = [sys.executable, "-I", "-m", "vllm_use.processes.die_with_parent"]


def spawn(
    argv: list[str], env: dict[str, str], *, cwd: str | os.PathLike[str], parent_death: bool
) -> Subprocess:
    """A supervised child in `cwd`: leader of a new session, stdout and stderr merged into one pipe
    (`proc.stdout`, a PipeIOStream).

    `parent_death` runs `argv` through the die_with_parent shim (for a child that starts no
    processes of its own; vLLM's tree gets the reaper shim instead, see runtime/reaper.py). The
    kernel ties that signal to the thread that forks: call this on the IOLoop's thread, never
    from an executor thread that may end. Raises OSError (FileNotFoundError when `argv[0]` is not
    an executable on the child's PATH, as a direct spawn would).

    The pipe is made here, not by tornado's `Subprocess.STREAM`: when the spawn fails (no such
    executable, a bad cwd), tornado closes the pipe's descriptors and then its half-built stream
    closes the read end again when it is collected — by then that number may be a client's socket.
    """
    if parent_death:
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        argv = [*_SHIM, str(os.getpid()), "--", *argv]
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        proc = Subprocess(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child holds its copy; ours would keep end-of-output from coming
    proc.stdout = PipeIOStream(read_fd)
    return proc


async def drain(proc: Subprocess, buffer: LogBuffer) -> None:
    """Read the child's pipe into `buffer` until every holder has closed it. Runs on the IOLoop."""
    assert proc.stdout is not None
    while True:
        try:
            chunk = await proc.stdout.read_bytes(65536, partial=True)
        except StreamClosedError:
            break
        buffer.feed(chunk)
    buffer.close()


async def exited(proc: Subprocess) -> int:
    """The child's exit status once it has ended (-N: killed by signal N), the child reaped.

    Works on any asyncio loop: Tornado's `wait_for_exit` needs a SIGCHLD handler, which uvloop
    keeps for itself (`--loop`, docs/architecture.md "Children"). On Linux a pidfd becomes
    readable when the child ends; elsewhere a thread of its own waits. Call it once per child and
    share the result (a second waiter after the reaping gets the status Popen kept). Cancelled, it
    stops waiting without reaping: whoever cancels it must wait again once the child is killed.
    """
    popen = proc.proc
    if popen.returncode is not None:
        return popen.returncode
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):  # no pidfd here (not Linux ≥ 5.3)

        def wait() -> None:
            popen.wait()
            loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))

        threading.Thread(target=wait, name=f"wait-{popen.pid}", daemon=True).start()
        await ended
        return popen.wait()
    loop.add_reader(pidfd, lambda: ended.done() or ended.set_result(None))
    try:
        await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return popen.wait()  # it has ended: this reaps it at once


def signal_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

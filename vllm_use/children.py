"""Helpers for the children we supervise (`hf` downloads and `vllm serve`).

`die_with_parent` is a `preexec_fn`: on Linux it asks the kernel to SIGKILL the
child when vllm-use dies, even by SIGKILL (PR_SET_PDEATHSIG), so a crash never
leaves a download or an engine running unsupervised. Elsewhere it does nothing.

Every child gets an explicit working directory that vllm-use owns, never the
server's own (whatever lies there must not end up on a child's `sys.path`), and
the allow-listed environment of `config.child_env()` (docs/security.md).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from tornado.iostream import PipeIOStream, StreamClosedError
from tornado.process import Subprocess

from vllm_use.logbuffer import LogBuffer

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_SERVER_PID = os.getpid()  # this module is imported by the server, never first in a child


def die_with_parent() -> None:
    """Runs in the forked child before exec: nothing here may allocate much or take locks."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != _SERVER_PID:  # the server died between fork and prctl
            os._exit(1)


def spawn(
    argv: list[str], env: dict[str, str], *, cwd: str | os.PathLike[str], parent_death: bool
) -> Subprocess:
    """A supervised child in `cwd`: leader of a new session, stdout and stderr merged into one pipe
    (`proc.stdout`, a PipeIOStream).

    `parent_death` adds `die_with_parent` (for a child that starts no processes of its own;
    vLLM's tree gets the reaper shim instead, see runtime/reaper.py). Raises OSError.

    The pipe is made here, not by tornado's `Subprocess.STREAM`: when the spawn fails (no such
    executable, a bad cwd), tornado closes the pipe's descriptors and then its half-built stream
    closes the read end again when it is collected — by then that number may be a client's socket.
    """
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
            preexec_fn=die_with_parent if parent_death else None,
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


def signal_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

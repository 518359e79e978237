"""Helpers for the children we supervise (`hf` downloads and `vllm serve`).

`die_with_parent` is a `preexec_fn`: on Linux it asks the kernel to SIGKILL the
child when vllm-use dies, even by SIGKILL (PR_SET_PDEATHSIG), so a crash never
leaves a download or an engine running unsupervised. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from tornado.iostream import StreamClosedError
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


def spawn(argv: list[str], env: dict[str, str], *, parent_death: bool) -> Subprocess:
    """A supervised child: leader of a new session, stdout and stderr merged into one pipe.

    `parent_death` adds `die_with_parent` (for a child that starts no processes of its own;
    vLLM's tree gets the reaper shim instead, see runtime/reaper.py). Raises OSError.
    """
    return Subprocess(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=Subprocess.STREAM,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        close_fds=True,
        preexec_fn=die_with_parent if parent_death else None,
    )


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

"""Helpers for the children we supervise (`hf` now, `vllm serve` later).

`die_with_parent` is a `preexec_fn`: on Linux it asks the kernel to SIGKILL the
child when vllm-use dies, even by SIGKILL (PR_SET_PDEATHSIG), so a crash never
leaves a download or an engine running unsupervised. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_SERVER_PID = os.getpid()  # this module is imported by the server, never first in a child


def die_with_parent() -> None:
    """Runs in the forked child before exec: nothing here may allocate much or take locks."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != _SERVER_PID:  # the server died between fork and prctl
            os._exit(1)

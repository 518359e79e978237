"""Supervised children (vllm_use/children.py): what a spawn leaves behind when it fails."""

from __future__ import annotations

import gc
import os

import pytest

from vllm_use import children


@pytest.mark.parametrize(
    ("argv", "cwd"), [(["/nonexistent/tool", "--version"], "/"), (["true"], "/nonexistent-dir")]
)
def test_a_failed_spawn_closes_its_pipe_exactly_once(argv: list[str], cwd: str) -> None:
    """The descriptor numbers a failed spawn freed are reused at once (here by `victims`, in the
    server by a client's socket): nothing may close them a second time when the failed spawn is
    collected."""
    with pytest.raises(OSError):  # the first one makes tornado's IOLoop (and its descriptors)
        children.spawn(argv, {"PATH": "/usr/bin:/bin"}, cwd=cwd, parent_death=False)
    for _ in range(10):
        gc.collect()  # what earlier tests left to the collector closes its descriptors now, not below
        before = set(os.listdir("/proc/self/fd"))
        kept: list[OSError] = []
        try:
            children.spawn(argv, {"PATH": "/usr/bin:/bin"}, cwd=cwd, parent_death=False)
        except OSError as exc:
            kept.append(exc)  # as a caller does while it reports the failure (its traceback lives on)
        assert kept
        victims = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]  # reuse the freed numbers
        kept.clear()
        gc.collect()
        try:
            for fd in victims:
                os.fstat(fd)  # EBADF if the failed spawn's stream closed this number again
        finally:
            for fd in victims:
                os.close(fd)
        assert set(os.listdir("/proc/self/fd")) == before  # and nothing leaked either

"""Supervised children (vllm_use/processes/children.py): what a spawn leaves behind when it fails."""

from __future__ import annotations

import _imp
import asyncio
import gc
import os
import signal
import sys
import threading

import pytest
import uvloop

from vllm_use.processes import children


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


def _run(argv: list[str], loop: str = "uvloop") -> tuple[bytes, int]:
    async def main() -> tuple[bytes, int]:
        proc = children.spawn(argv, {"PATH": "/usr/bin:/bin"}, cwd="/", parent_death=True)
        assert proc.stdout is not None
        output, code = await asyncio.gather(proc.stdout.read_until_close(), children.exited(proc))
        return output, code

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        return runner.run(main())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_childs_exit_status_is_read_on_either_loop(loop: str) -> None:
    """children.exited (docs/architecture.md, "Children"): the status as Popen gives it, a signal as
    its negative number, on uvloop (which keeps SIGCHLD for itself) as on asyncio's loop."""
    assert _run(["sh", "-c", "echo out; exit 3"], loop) == (b"out\n", 3)
    assert _run(["sh", "-c", "kill -9 $$"], loop) == (b"", -signal.SIGKILL)


def test_a_wait_given_up_leaves_nothing_behind_and_the_next_one_reaps() -> None:
    """The probes' way: a wait cancelled at its time limit leaves no descriptor open and no reader
    on the loop; once the child is killed, waiting again reaps it (no zombie stays)."""

    async def main() -> tuple[int, bool]:
        proc = children.spawn(["sleep", "600"], {"PATH": "/usr/bin:/bin"}, cwd="/", parent_death=True)
        assert proc.stdout is not None
        before = set(os.listdir("/proc/self/fd"))
        waiting = asyncio.ensure_future(children.exited(proc))
        await asyncio.sleep(0)  # it opens its pidfd and watches it
        assert len(set(os.listdir("/proc/self/fd")) - before) == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        after = set(os.listdir("/proc/self/fd"))
        os.killpg(proc.pid, signal.SIGKILL)
        code = await children.exited(proc)
        proc.stdout.close()
        return code, after == before and not os.path.exists(f"/proc/{proc.pid}")

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == (-signal.SIGKILL, True)


_PDEATHSIG = (
    "import ctypes, os; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
    "print(v.value, os.getsid(0) == os.getpid())"
)


def test_a_child_that_dies_with_us_is_the_command_itself_with_sigkill_as_its_parent_death_signal() -> None:
    output, code = _run([sys.executable, "-c", _PDEATHSIG])
    assert (output.decode().split(), code) == ([str(int(signal.SIGKILL)), "True"], 0)


def test_a_missing_executable_is_an_oserror_for_a_child_that_dies_with_us() -> None:
    with pytest.raises(FileNotFoundError):
        children.spawn(
            ["no-such-tool-here", "--version"], {"PATH": "/usr/bin:/bin"}, cwd="/", parent_death=True
        )


def test_a_spawn_runs_no_python_between_fork_and_exec() -> None:
    """A lock another thread holds at the fork must not stop a spawn: with Python code in the child
    before exec (a `preexec_fn`), a download once hung the server's event loop for good. Here
    another thread holds the import lock, which Python's fork for such code takes. It holds it until
    the spawn is over or a deadline long enough for any machine has passed."""
    assert _run(["echo", "warm"]) == (b"warm\n", 0)  # imports everything the spawn needs first
    held, done = threading.Event(), threading.Event()
    timed_out = threading.Event()

    def hold() -> None:
        _imp.acquire_lock()
        try:
            held.set()
            if not done.wait(60):
                timed_out.set()
        finally:
            _imp.release_lock()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait()
    try:
        result = _run(["echo", "spawned"])
    finally:
        done.set()
        holder.join()
    assert (result, timed_out.is_set()) == ((b"spawned\n", 0), False)

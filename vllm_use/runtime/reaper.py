"""A tiny shim between vllm-use and `vllm serve`, so nothing outlives vllm-use.

    python -I -m vllm_use.runtime.reaper PARENT_PID -- vllm serve …

`-I` (isolated): neither the working directory nor PYTHON* variables shape its
`sys.path`, so a `vllm_use/` lying where the server was started can't stand in
for this shim; the supervisor also starts it in the child's own scratch
directory, which vLLM inherits.

vLLM forks its engine (EngineCore, Worker) into the same process group, and a
SIGKILL of its main process orphans them (~1.3 GB on CPU). A parent-death
signal on the main process alone would do the same. So the supervisor starts
this shim as the leader of a new session: it asks the kernel for SIGUSR1 when
vllm-use dies (PR_SET_PDEATHSIG) and then SIGKILLs its whole process group.
A SIGTERM to the group (a normal stop) reaches vLLM directly; the shim just
waits and exits with vLLM's status (128+N for a signal), after saying so.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _kill_group(*_: object) -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -I -m vllm_use.runtime.reaper PARENT_PID -- COMMAND …", file=sys.stderr)
        return 2
    parent, command = int(argv[1]), argv[3:]
    signal.signal(signal.SIGUSR1, _kill_group)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() != parent:  # vllm-use died before we could ask
        _kill_group()
    signal.signal(signal.SIGTERM, lambda *_: None)  # the group got it too: wait for vLLM
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"[vllm-use] cannot start {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    code = child.wait()
    if code < 0:
        print(f"[vllm-use] vllm (pid {child.pid}) was killed by signal {-code}", file=sys.stderr, flush=True)
        return 128 - code
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

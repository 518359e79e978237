"""A shim that becomes the command it runs, after asking to die with vllm-use.

    python -I -m vllm_use.processes.die_with_parent PARENT_PID -- COMMAND …

It asks the kernel for SIGKILL when vllm-use dies (Linux `PR_SET_PDEATHSIG`; the request
survives `exec`), checks that vllm-use did not die already, and replaces itself with COMMAND (same
pid, same process group). `hf` downloads and the version probes run through it.

Why a shim and not a `preexec_fn`: Python code between `fork` and `exec` in a threaded server
can hang the child forever (a lock another thread held at the fork, `logging`'s among them), and
the server's event loop waits for that child's `exec` (docs/architecture.md, "Children").
Here the fork runs no Python at all; the shim is a fresh interpreter with one thread.

`-I` (isolated): neither the working directory nor PYTHON* variables shape its `sys.path`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(
            "usage: python -I -m vllm_use.processes.die_with_parent PARENT_PID -- COMMAND …", file=sys.stderr
        )
        return 2
    parent, command = int(argv[1]), argv[3:]
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # vllm-use died before we could ask
        return 137
    try:
        os.execvp(command[0], command)  # noqa: S606 - argv, never a shell
    except OSError as exc:
        print(f"[vllm-use] cannot start {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
    return 127


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

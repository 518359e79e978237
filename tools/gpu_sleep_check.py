"""Check vLLM's sleep mode on a GPU machine, as vllm-use uses it (docs/router.md, "Sleep").

    python tools/gpu_sleep_check.py MODEL [--vllm-bin vllm] [--gpu-memory-utilization 0.5]
        [--sleep-check 30]

It serves MODEL (a local directory or a Hub id vLLM can load) with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`, then: reads the GPU memory NVML shows held by vLLM's process group,
`POST /sleep?level=1`, waits for `/is_sleeping`, reads NVML again, `POST /wake_up`, waits, and asks
for one completion. It prints one JSON object (times in seconds, memory in MiB) and exits 0 when
asleep the group held less than 10 % of its memory awake (vllm-use's rule) and the completion came
back; 1 otherwise. `--sleep-check` is how long the memory may take to be given back after
`/is_sleeping` says true (vllm-use's 30 s; its tests shorten it). The server's output goes to a
log file named in the JSON. It never needs vllm-use; run it with the Python that has `pynvml`
(nvidia-ml-py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

SLEPT_SHARE = 0.10  # vllm-use's rule: asleep, the group holds less than this of its memory awake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def group_memory(pgid: int) -> int:
    """Bytes of GPU memory NVML shows held by the processes of group `pgid`, over all GPUs."""
    import pynvml

    pynvml.nvmlInit()
    try:
        total = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                try:
                    if os.getpgid(process.pid) == pgid:
                        total += process.usedGpuMemory or 0
                except OSError:
                    pass
        return total
    finally:
        pynvml.nvmlShutdown()


def wait_for(predicate: Any, timeout: float, what: str) -> float:
    """Seconds until `predicate()` is true; raises TimeoutError naming `what`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout:g} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--vllm-bin", default="vllm")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--sleep-check", type=float, default=30)
    args = parser.parse_args(argv)

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="gpu-sleep-check-", suffix=".log", delete=False)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    argv_ = [
        args.vllm_bin,
        "serve",
        args.model,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--served-model-name",
        "check",
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--enable-sleep-mode",
    ]
    proc = subprocess.Popen(argv_, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    report: dict[str, Any] = {"model": args.model, "log": log.name}
    ok = False
    try:
        report["start_s"] = round(
            wait_for(lambda: call(port, "GET", "/health") is None, args.start_timeout, "healthy"), 2
        )
        awake = group_memory(proc.pid)
        report["awake_mib"] = awake // 2**20
        started = time.monotonic()
        call(port, "POST", "/sleep?level=1", timeout=300)
        report["sleep_call_s"] = round(time.monotonic() - started, 2)
        wait_for(lambda: call(port, "GET", "/is_sleeping")["is_sleeping"] is True, 60, "/is_sleeping true")
        freed = wait_for(
            lambda: group_memory(proc.pid) < SLEPT_SHARE * awake, args.sleep_check, "memory given back"
        )
        report["asleep_mib"] = group_memory(proc.pid) // 2**20
        report["memory_freed_after_s"] = round(freed, 2)
        started = time.monotonic()
        call(port, "POST", "/wake_up", timeout=300)
        wait_for(lambda: call(port, "GET", "/is_sleeping")["is_sleeping"] is False, 120, "/is_sleeping false")
        report["wake_s"] = round(time.monotonic() - started, 2)
        report["woken_mib"] = group_memory(proc.pid) // 2**20
        body = {"model": "check", "prompt": "Hello", "max_tokens": 4}
        answer = call(port, "POST", "/v1/completions", body, timeout=120)
        report["completion"] = answer["choices"][0]["text"]
        ok = awake > 0 and report["asleep_mib"] * 2**20 < SLEPT_SHARE * awake
    except (TimeoutError, OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

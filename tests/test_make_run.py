"""The README's quick start: `make run` serves /healthz (here on a free port and a temp data dir)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.support import REPO
from tests.support.server import eventually, free_port, listens_only_in
from vllm_use.runtime.procfs import group_members


def test_make_run_answers_healthz(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    args = f"ARGS=--port {port} --data-dir {tmp_path / 'data'}"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run", args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False)
            except httpx.TransportError:
                return False
            ours = listens_only_in(port, group_members(proc.pid))  # not another process that took the port
            return r.status_code == 200 and r.json() == {"status": "ok"} and ours

        eventually(healthy, timeout=120, interval=0.2)
        token_file = tmp_path / "data" / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=15)[0].decode()
    assert str(token_file) in output
    assert token_file.read_text().strip() not in output

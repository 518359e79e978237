"""A machine with NVIDIA GPUs, faked (tests/fakes/nvml/pynvml.py): vllm-use imports the fake NVML, and
its deployments run the fake vLLM, which records in the same directory the GPU memory it holds (awake,
asleep, or not given back). Used where the GPU paths must run on this machine: the memory budget and
sleep (tests/test_capacity.py), Sleep and Wake in the console (tests/test_console_deployments.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import FAKE_NVML, fake_vllm_bin
from tests.support.server import Server, free_port, start_server

GIB = 2**30
TOTAL = 80 * GIB  # each fake GPU's memory


def gpus_file(nvml: Path, count: int = 1, external: int = 0) -> None:
    """Write the GPUs NVML shows: `count` of TOTAL bytes, each with `external` bytes held by another
    program. Rewriting it changes what a running server sees."""
    gpus = [
        {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-fake-{i}", "total": TOTAL, "external": external}
        for i in range(count)
    ]
    (nvml / "gpus.json").write_text(json.dumps({"driver": "560.35.03", "gpus": gpus}))


def nvml_env(nvml: Path) -> dict[str, str]:
    """What a process needs in its environment to import the fake NVML, its GPUs in `nvml`."""
    return {"PYTHONPATH": str(FAKE_NVML), "FAKE_NVML_DIR": str(nvml)}


def gpu_server(
    tmp_path: Path, *flags: str, external: int = 0, env: dict[str, str] | None = None, **knobs: object
) -> Server:
    """vllm-use on a machine with one 80 GiB GPU (the fake NVML, its files in tmp_path/nvml), its
    instances the fake vLLM with `knobs`; `env` adds to vllm-use's environment."""
    nvml = tmp_path / "nvml"
    nvml.mkdir()
    gpus_file(nvml, external=external)
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300, nvml_dir=str(nvml), **knobs)
    first = free_port()
    return start_server(
        tmp_path / "data",
        "--vllm-bin",
        str(vllm),
        "--runtime-ports",
        f"{first}-{first + 9}",
        *flags,
        env={**nvml_env(nvml), **(env or {})},
    )


def held(server: Server, pid: int) -> int:
    """The GPU memory NVML shows held by `pid` (gpu.list)."""
    gpus = server.fetch("/api/gpus").json()["gpus"]
    return sum(p["used_memory_bytes"] for gpu in gpus for p in gpu["processes"] if p["pid"] == pid)

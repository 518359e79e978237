"""gpu.list (docs/architecture.md, "Honest reports"): NVML missing → "missing"; another NVML failure →
an error; a GPU → its numbers.

This machine has no NVIDIA driver, so the GPU-present path uses a stand-in for the few NVML
calls we make (the real library is absent here), shaped like pynvml's own return values.
"""

from __future__ import annotations

import ctypes.util
from types import SimpleNamespace

import pynvml
import pytest

from vllm_use.abilities.gpu import query_gpus
from vllm_use.errors import ExternalError


def test_without_nvml_the_status_is_missing_and_the_list_empty() -> None:
    result = query_gpus()
    if ctypes.util.find_library("nvidia-ml") is None:  # CI and this machine: no NVIDIA driver
        assert result == {"status": "missing", "driver_version": None, "gpus": []}
    else:  # a machine with a driver: the honest answer is "available"
        assert result["status"] == "available"


def test_other_nvml_failures_are_errors_not_empty_lists(monkeypatch) -> None:
    def broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    with pytest.raises(ExternalError, match="NVML"):
        query_gpus()


def test_a_gpu_is_reported_with_memory_utilization_and_processes(monkeypatch) -> None:
    calls = []
    fake = {
        "nvmlInit": lambda: calls.append("init"),
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlSystemGetDriverVersion": lambda: "560.35.03",
        "nvmlDeviceGetHandleByIndex": lambda i: f"handle{i}",
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=37, memory=5),
        "nvmlDeviceGetTemperature": lambda h, sensor: 61,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=2**29)],
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: "GPU-1234",
    }
    for name, fn in fake.items():
        monkeypatch.setattr(pynvml, name, fn)
    result = query_gpus()
    assert result["status"] == "available"
    assert result["driver_version"] == "560.35.03"
    (gpu,) = result["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["memory_total_bytes"] == 80 * 2**30 and gpu["memory_used_bytes"] == 2**30
    assert gpu["utilization_percent"] == 37 and gpu["temperature_c"] == 61
    assert gpu["processes"] == [{"pid": 4242, "used_memory_bytes": 2**29}]
    assert calls == ["init", "shutdown"]

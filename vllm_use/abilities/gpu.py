"""`gpu.list` through NVML (docs/architecture.md, "Honest reports").

NVML library missing (no NVIDIA driver, as on CI) → `status: "missing"` and an
empty list, honestly. Any other NVML failure is an error, never invented data.
NVML calls block, so they run in an executor, one at a time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

from pydantic import BaseModel

from vllm_use.context import Call
from vllm_use.errors import ExternalError
from vllm_use.registry import NoArgs, Registry, Result
from vllm_use.scopes import READ

_nvml_lock = threading.Lock()


class GpuProcess(BaseModel):
    pid: int
    used_memory_bytes: int | None


class Gpu(BaseModel):
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    utilization_percent: int | None
    temperature_c: int | None
    processes: list[GpuProcess]


class GpuList(Result):
    status: Literal["available", "missing"]
    driver_version: str | None
    gpus: list[Gpu]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def query_gpus() -> dict[str, Any]:
    """Runs in an executor: one NVML session, init → query → shutdown."""
    import pynvml

    with _nvml_lock:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            return {"status": "missing", "driver_version": None, "gpus": []}
        except pynvml.NVMLError as exc:
            raise ExternalError(f"NVML failed to initialise: {exc}") from None
        try:
            gpus = [_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            return {"status": "available", "driver_version": driver, "gpus": gpus}
        except pynvml.NVMLError as exc:
            raise ExternalError(f"NVML query failed: {exc}") from None
        finally:
            pynvml.nvmlShutdown()


def gpu_count() -> int:
    """The GPUs NVML shows; 0 where NVML is missing or fails (start-up: `--max-loaded` 0)."""
    try:
        return len(query_gpus()["gpus"])
    except ExternalError:
        return 0


def _gpu(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization: int | None = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except nvml.NVMLError_NotSupported:
        utilization = None
    try:
        temperature: int | None = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    except nvml.NVMLError_NotSupported:
        temperature = None
    processes = [
        {"pid": p.pid, "used_memory_bytes": p.usedGpuMemory}
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_total_bytes": memory.total,
        "memory_used_bytes": memory.used,
        "memory_free_bytes": memory.free,
        "utilization_percent": utilization,
        "temperature_c": temperature,
        "processes": processes,
    }


async def list_gpus() -> dict[str, Any]:
    return await asyncio.get_running_loop().run_in_executor(None, query_gpus)


async def gpu_list(call: Call, args: NoArgs) -> dict[str, Any]:
    return await list_gpus()


def register(registry: Registry) -> None:
    registry.method(
        "gpu.list",
        "NVIDIA GPUs seen through NVML: memory, utilization, temperature, processes. "
        "status is 'missing' when no NVIDIA driver/NVML library is installed.",
        NoArgs,
        GpuList,
        READ,
    )(gpu_list)

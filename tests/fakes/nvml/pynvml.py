"""A stand-in for `pynvml` (nvidia-ml-py) on a machine without an NVIDIA driver: the few NVML calls
vllm-use makes, answered from files, so that the GPU paths (the memory budget, sleep's memory check)
run end to end against the fake vLLM.

Put this directory first on the server's PYTHONPATH and set FAKE_NVML_DIR; the fake vLLM, given
FAKE_VLLM_NVML_DIR (the same directory), records the memory it holds there, as the real one holds
GPU memory from its load until it exits or sleeps. The shapes are pynvml's (measured against
nvidia-ml-py 12: `nvmlDeviceGetMemoryInfo` → an object with `total`, `free`, `used`;
`nvmlDeviceGetComputeRunningProcesses` → objects with `pid` and `usedGpuMemory`; names and UUIDs as
`str`), and, as NVML does, only live processes are listed.

FAKE_NVML_DIR/gpus.json   {"driver": "560.35.03", "gpus": [{"name", "uuid", "total", "external"}]}
                          `external`: bytes used by something outside vllm-use (default 0)
FAKE_NVML_DIR/proc-PID.json  {"pid": PID, "used": {"0": bytes, …}}: a process's memory by GPU index
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_INVALID_ARGUMENT = 2


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


def _dir() -> Path:
    return Path(os.environ["FAKE_NVML_DIR"])


def _gpus() -> list[dict[str, Any]]:
    try:
        return json.loads((_dir() / "gpus.json").read_text())["gpus"]
    except (KeyError, FileNotFoundError) as exc:
        raise NVMLError_LibraryNotFound() from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: its memory is free, and NVML does not list it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _processes(index: int) -> list[tuple[int, int]]:
    found = []
    for path in sorted(_dir().glob("proc-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: the writer renames a whole file into place
        used = record.get("used", {}).get(str(index))
        if used is not None and _alive(record["pid"]):
            found.append((record["pid"], used))
    return found


def record_process(directory: str, pid: int, used: dict[int, int]) -> None:
    """For the fake vLLM: `pid` now holds `used` bytes on each GPU index (an empty dict: none)."""
    path = Path(directory) / f"proc-{pid}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"pid": pid, "used": {str(k): v for k, v in used.items()}}))
    temporary.replace(path)


def total_and_free(directory: str, index: int) -> tuple[int, int]:
    """For the fake vLLM's start-up check (the real one refuses to start without the memory it wants)."""
    os.environ.setdefault("FAKE_NVML_DIR", directory)
    gpu = _gpus()[index]
    used = gpu.get("external", 0) + sum(u for _, u in _processes(index))
    return gpu["total"], max(gpu["total"] - used, 0)


def nvmlInit() -> None:
    if "FAKE_NVML_DIR" not in os.environ:
        raise NVMLError_LibraryNotFound()
    _gpus()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlSystemGetDriverVersion() -> str:
    return json.loads((_dir() / "gpus.json").read_text()).get("driver", "560.35.03")


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_gpus()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpus()[handle]
    used = min(gpu.get("external", 0) + sum(u for _, u in _processes(handle)), gpu["total"])
    return SimpleNamespace(total=gpu["total"], used=used, free=gpu["total"] - used)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return 40


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in _processes(handle)]


def nvmlDeviceGetName(handle: int) -> str:
    return _gpus()[handle]["name"]


def nvmlDeviceGetUUID(handle: int) -> str:
    return _gpus()[handle]["uuid"]

"""`test`, `system.get`, `mcp.status` and `dashboard.get` (docs/api_methods.md; docs/architecture.md,
"Honest reports").

`system.get` includes the machine's facts (`machine`): CPUs, memory (from /proc/meminfo, else
sysconf) and the free space where the data and the models live. They are read in the executor (a
file read and two statvfs calls, which a hung network mount could stall), and a fact that cannot be
read is null, never a guess.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from vllm_use import __version__, settings
from vllm_use.abilities.gpu import Gpu, list_gpus
from vllm_use.clock import iso
from vllm_use.context import Call
from vllm_use.errors import VllmUseError
from vllm_use.gateway import audit
from vllm_use.keys import store as key_store
from vllm_use.processes import probe
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.scopes import READ, MethodScope, Surface
from vllm_use.storage import Database

MCP_PROTOCOL_VERSION = "2026-07-28"


class TestArgs(Args):
    message: str = Field(default="", max_length=1024, description="echoed back")


class TestResult(Result):
    ok: bool
    message: str
    protocol: Literal["http", "mcp"]


class Tool(BaseModel):
    name: str
    status: Literal["available", "missing", "error"]
    path: str | None
    version: str | None
    message: str | None


class Machine(BaseModel):
    cpu_count: int | None = Field(description="logical CPUs (os.cpu_count)")
    memory_total_bytes: int | None
    memory_available_bytes: int | None = Field(description="MemAvailable: what can be used without swapping")
    data_dir_free_bytes: int | None = Field(
        description="free for an unprivileged user on the data dir's filesystem"
    )
    data_dir_total_bytes: int | None
    models_dir_free_bytes: int | None
    models_dir_total_bytes: int | None


class SystemInfo(Result):
    version: str
    event_loop: Literal["uvloop", "asyncio"] = Field(description="the event loop the server runs on (--loop)")
    started_at: str
    uptime_s: float
    data_dir: str
    models_dir: str
    hf_cache_dir: str | None
    tools: list[Tool]
    gpu_status: Literal["available", "missing", "error"]
    gpu_count: int
    machine: Machine


class McpStatus(Result):
    endpoint: str
    protocol_version: str
    transport: str
    tool_count: int


class DashboardGpus(BaseModel):
    status: Literal["available", "missing", "error"]
    message: str | None
    gpus: list[Gpu]


class Counts(BaseModel):
    api_keys: int
    settings: int
    requests: int


class Traffic(BaseModel):
    requests_per_s: float = Field(description="/v1 requests ended per second over the last window_s seconds")
    window_s: int
    active_streams: int = Field(
        description="/v1 requests open now; a streamed answer counts until its last event"
    )


class Dashboard(Result):
    system: SystemInfo
    gpus: DashboardGpus
    counts: Counts
    traffic: Traffic


async def _gpus_or_error() -> dict[str, Any]:
    try:
        found = await list_gpus()
        return {"status": found["status"], "message": None, "gpus": found["gpus"]}
    except VllmUseError as exc:
        return {"status": "error", "message": exc.message, "gpus": []}


def _memory() -> tuple[int | None, int | None]:
    """(total, available) bytes: /proc/meminfo's MemTotal and MemAvailable, else sysconf's pages."""
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdecimal():
                fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    except OSError:
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return None, None


def _disk(path: Path) -> tuple[int | None, int | None]:
    """(free, total) bytes of the filesystem holding `path`, or nulls when it cannot be read."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None, None
    return usage.free, usage.total


def machine_facts(data_dir: Path, models_dir: Path) -> dict[str, Any]:
    """The machine's facts (module docstring). Runs in the executor: it reads files and statvfs."""
    total, available = _memory()
    data_free, data_total = _disk(data_dir)
    models_free, models_total = _disk(models_dir)
    return {
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": total,
        "memory_available_bytes": available,
        "data_dir_free_bytes": data_free,
        "data_dir_total_bytes": data_total,
        "models_dir_free_bytes": models_free,
        "models_dir_total_bytes": models_total,
    }


async def system_info(call: Call, gpus: dict[str, Any] | None = None) -> dict[str, Any]:
    app, config = call.app, call.app.config
    machine = asyncio.get_running_loop().run_in_executor(
        None, machine_facts, config.data_dir, config.models_dir
    )
    tools, gpus, facts = await asyncio.gather(
        asyncio.gather(
            probe.probe("vllm", config.vllm_bin, ("--version",)),
            probe.probe("hf", config.hf_bin, ("version",)),
            probe.probe("nvidia-smi", "nvidia-smi", ("--version",)),
        ),
        _gpus_or_error() if gpus is None else _given(gpus),
        machine,
    )
    return {
        "version": __version__,
        "event_loop": "uvloop"
        if type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        else "asyncio",
        "started_at": iso(int(app.started_at * 1000)),
        "uptime_s": round(time.monotonic() - app.started_monotonic, 3),
        "data_dir": str(config.data_dir),
        "models_dir": str(config.models_dir),
        "hf_cache_dir": str(config.hf_cache_dir) if config.hf_cache_dir else None,
        "tools": list(tools),
        "gpu_status": gpus["status"],
        "gpu_count": len(gpus["gpus"]),
        "machine": facts,
    }


async def _given(value: dict[str, Any]) -> dict[str, Any]:
    return value


def mcp_endpoint(call: Call) -> str:
    config = call.app.config
    host = config.host
    if host in ("0.0.0.0", "::"):  # noqa: S104 - reporting, not binding
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.port}/mcp"


def _count_rows(db: Database) -> dict[str, int]:
    return {"api_keys": key_store.count(db), "settings": settings.count(db), "requests": audit.count(db)}


async def test(call: Call, args: TestArgs) -> dict[str, Any]:
    return {"ok": True, "message": args.message, "protocol": "mcp" if call.surface == "mcp" else "http"}


async def system_get(call: Call, args: NoArgs) -> dict[str, Any]:
    return await system_info(call)


async def mcp_status(call: Call, args: NoArgs) -> dict[str, Any]:
    return {
        "endpoint": mcp_endpoint(call),
        "protocol_version": MCP_PROTOCOL_VERSION,
        "transport": "streamable-http (stateless, JSON responses)",
        # Over MCP, the tools this key sees (tools/list); over /api, all of them.
        "tool_count": sum(
            1 for m in call.app.registry if call.identity.may_call(m.scope, Surface.MCP, public=m.public)
        )
        if call.surface == Surface.MCP
        else len(call.app.registry),
    }


async def dashboard_get(call: Call, args: NoArgs) -> dict[str, Any]:
    gpus = await _gpus_or_error()
    system, counts = await asyncio.gather(system_info(call, gpus), call.app.db.query(_count_rows))
    return {
        "system": system,
        "gpus": gpus,
        "counts": counts,
        "traffic": call.app.metrics.traffic_now(call.app),
    }


def register(registry: Registry) -> None:
    registry.method(
        "test",
        "Check connectivity and credentials: echoes the message and names the protocol used.",
        TestArgs,
        TestResult,
        MethodScope(api=None, mcp=None),
        public=True,
    )(test)
    registry.method(
        "system.get",
        "Version, uptime, data and models directories, the vllm/hf/nvidia-smi tools found, GPU count, "
        "and the machine: CPUs, memory, free disk where the data and the models live.",
        NoArgs,
        SystemInfo,
        READ,
    )(system_get)
    registry.method(
        "mcp.status",
        "The MCP endpoint URL, protocol version and number of tools (over MCP: those this key may call).",
        NoArgs,
        McpStatus,
        READ,
    )(mcp_status)
    registry.method(
        "dashboard.get",
        "One call for the overview page: system (with the machine's CPUs, memory and disk), GPUs, record "
        "counts and the /v1 traffic of the last minute.",
        NoArgs,
        Dashboard,
        READ,
    )(dashboard_get)

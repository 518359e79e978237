"""`test`, `system.get`, `mcp.status` and `dashboard.get` (docs/api_methods.md; docs/architecture.md,
"Honest reports")."""

from __future__ import annotations

import asyncio
import time
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


class SystemInfo(Result):
    version: str
    started_at: str
    uptime_s: float
    data_dir: str
    models_dir: str
    hf_cache_dir: str | None
    tools: list[Tool]
    gpu_status: Literal["available", "missing", "error"]
    gpu_count: int


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


class Dashboard(Result):
    system: SystemInfo
    gpus: DashboardGpus
    counts: Counts


async def _gpus_or_error() -> dict[str, Any]:
    try:
        found = await list_gpus()
        return {"status": found["status"], "message": None, "gpus": found["gpus"]}
    except VllmUseError as exc:
        return {"status": "error", "message": exc.message, "gpus": []}


async def system_info(call: Call, gpus: dict[str, Any] | None = None) -> dict[str, Any]:
    app, config = call.app, call.app.config
    tools, gpus = await asyncio.gather(
        asyncio.gather(
            probe.probe("vllm", config.vllm_bin, ("--version",)),
            probe.probe("hf", config.hf_bin, ("version",)),
            probe.probe("nvidia-smi", "nvidia-smi", ("--version",)),
        ),
        _gpus_or_error() if gpus is None else _given(gpus),
    )
    return {
        "version": __version__,
        "started_at": iso(int(app.started_at * 1000)),
        "uptime_s": round(time.monotonic() - app.started_monotonic, 3),
        "data_dir": str(config.data_dir),
        "models_dir": str(config.models_dir),
        "hf_cache_dir": str(config.hf_cache_dir) if config.hf_cache_dir else None,
        "tools": list(tools),
        "gpu_status": gpus["status"],
        "gpu_count": len(gpus["gpus"]),
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
    return {"system": system, "gpus": gpus, "counts": counts}


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
        "Version, uptime, data and models directories, the vllm/hf/nvidia-smi tools found, GPU count.",
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
        "One call for the overview page: system, GPUs and record counts.",
        NoArgs,
        Dashboard,
        READ,
    )(dashboard_get)

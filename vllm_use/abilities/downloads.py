"""`downloads.*` (docs/models-and-downloads.md): start, status, list, logs, cancel, retry.

Clients give only a task id, a registered Hugging Face model id and a one-time
token: repository and revision come from SQLite and the target is always
`<models-dir>/<model_id>`. The work itself is `vllm_use.downloads.manager`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from vllm_use.context import Call
from vllm_use.downloads import tasks
from vllm_use.downloads.tasks import TaskStatus
from vllm_use.fields import ModelId, TaskId
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.scopes import MODELS_WRITE, READ

Token = Annotated[
    str,
    StringConstraints(min_length=1, max_length=tasks.TOKEN_MAX, pattern=r"^[\x21-\x7e]+$"),
    Field(description="a Hugging Face token for this download only; never stored or logged"),
]


class StartArgs(Args):
    id: TaskId | None = Field(default=None, description="task id (server-generated if absent)")
    model_id: ModelId
    token: Token | None = None


class IdArgs(Args):
    id: TaskId


class RetryArgs(Args):
    id: TaskId
    token: Token | None = None


class LogsArgs(Args):
    id: TaskId
    tail: int | None = Field(default=None, ge=1, le=100_000, description="only the last N lines")


class TaskOut(Result):
    id: str
    model_id: str
    repository: str
    revision: str
    status: TaskStatus
    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_s: float
    eta_s: float | None
    stalled: bool
    queue_position: int | None
    exit_code: int | None
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class TaskResult(Result):
    task: TaskOut


class TaskList(Result):
    downloads: list[TaskOut]


class LogLines(Result):
    id: str
    lines: list[str]


async def start(call: Call, args: StartArgs) -> dict[str, Any]:
    return {"task": await call.app.downloads.start(args.model_id, args.id, args.token)}


async def list_tasks(call: Call, args: NoArgs) -> dict[str, Any]:
    return {"downloads": await call.app.downloads.list()}


async def status(call: Call, args: IdArgs) -> dict[str, Any]:
    manager = call.app.downloads
    return {"task": manager.describe(await manager.get(args.id))}


async def logs(call: Call, args: LogsArgs) -> dict[str, Any]:
    return {"id": args.id, "lines": await call.app.downloads.logs(args.id, args.tail)}


async def cancel(call: Call, args: IdArgs) -> dict[str, Any]:
    return {"task": await call.app.downloads.cancel(args.id)}


async def retry(call: Call, args: RetryArgs) -> dict[str, Any]:
    return {"task": await call.app.downloads.retry(args.id, args.token)}


def register(registry: Registry) -> None:
    registry.method(
        "downloads.start",
        "Download a registered Hugging Face model into <models-dir>/<model_id> with the hf CLI. "
        "Queued as pending when every worker is busy.",
        StartArgs,
        TaskResult,
        MODELS_WRITE,
    )(start)
    registry.method(
        "downloads.list",
        "Download tasks, newest first, with progress.",
        NoArgs,
        TaskList,
        READ,
    )(list_tasks)
    registry.method(
        "downloads.status",
        "One download task: state, bytes done and total, rate, ETA, stalled.",
        IdArgs,
        TaskResult,
        READ,
    )(status)
    registry.method("downloads.logs", "The hf child's output (bounded).", LogsArgs, LogLines, READ)(logs)
    registry.method(
        "downloads.cancel",
        "Cancel a pending or running download (its hf process group is stopped).",
        IdArgs,
        TaskResult,
        MODELS_WRITE,
    )(cancel)
    registry.method(
        "downloads.retry",
        "Run a failed or canceled task again under the same id, for the same model (re-read from SQLite).",
        RetryArgs,
        TaskResult,
        MODELS_WRITE,
    )(retry)

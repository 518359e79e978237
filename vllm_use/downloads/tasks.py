"""Download task records (docs/models-and-downloads.md): ids, states, validation of rows read back.

A task's status is a `TaskStatus` (its docstring draws the transitions).

A task id is a permanent audit identity: 1–128 bytes of portable ASCII,
alphanumeric first. A new start can't reuse one; a retry reuses its own.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vllm_use.clock import iso
from vllm_use.errors import CorruptRecord, InvalidArguments
from vllm_use.fields import TASK_ID_RE
from vllm_use.models import records

TOKEN_MAX = 4096


class TaskStatus(StrEnum):
    """Where a download task stands (`downloads.list` → `status`).

        pending ──worker free──▶ running ──hf exit 0──▶ succeeded
           │                       ├──hf failed──────▶ failed ──retry──▶ pending
           └──────cancel───────────┴──cancel/restart─▶ canceled ──retry──▶ pending

    `ACTIVE` tasks hold their model (at most one per model); `FINISHED` ones may be retried
    (`failed`, `canceled`) or are done.
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


STATUSES = tuple(TaskStatus)
ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)
FINISHED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELED)
RETRYABLE = (TaskStatus.FAILED, TaskStatus.CANCELED)


def new_task_id() -> str:
    return "dl-" + secrets.token_hex(12)


@dataclass(frozen=True)
class TaskRecord:
    id: str
    model_id: str
    repository: str
    revision: str
    status: TaskStatus
    bytes_done: int
    bytes_total: int | None
    exit_code: int | None
    error: str | None
    created_at: int
    started_at: int | None
    finished_at: int | None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model_id": self.model_id,
            "repository": self.repository,
            "revision": self.revision,
            "status": self.status,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "exit_code": self.exit_code,
            "error": self.error,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
        }


def parse_row(row: dict[str, Any]) -> TaskRecord:
    """Validate a `download_tasks` row; raise CorruptRecord naming it."""
    raw_id = row.get("id")
    label = raw_id if isinstance(raw_id, str) and TASK_ID_RE.fullmatch(raw_id) else "<malformed id>"

    def bad(why: str) -> CorruptRecord:
        return CorruptRecord(f"download task {label} is corrupt: {why}", record=label)

    if label == "<malformed id>":
        raise bad("id is malformed")
    try:
        model_id = records.validate_model_id(row.get("model_id"))
        repository = records.validate_repository(row.get("repository"))  # type: ignore[arg-type]
        revision = records.validate_revision(row.get("revision"))  # type: ignore[arg-type]
    except (InvalidArguments, AttributeError, TypeError):
        raise bad("model id, repository or revision is invalid") from None
    status = row.get("status")
    if status not in STATUSES:
        raise bad("status is unknown")
    status = TaskStatus(status)
    done, total, code = row.get("bytes_done"), row.get("bytes_total"), row.get("exit_code")
    if type(done) is not int or done < 0 or (total is not None and (type(total) is not int or total < 0)):
        raise bad("byte counts are invalid")
    if code is not None and type(code) is not int:
        raise bad("exit code is invalid")
    error = row.get("error")
    if error is not None and (not isinstance(error, str) or len(error) > 65536):
        raise bad("error is not text")
    created, started, finished = row.get("created_at"), row.get("started_at"), row.get("finished_at")
    stamps = [t for t in (created, started, finished) if t is not None]
    if type(created) is not int or created <= 0 or any(type(t) is not int for t in stamps):
        raise bad("timestamps are invalid")
    if stamps != sorted(stamps):
        raise bad("timestamps are out of order")
    if status in FINISHED and finished is None:
        raise bad("a finished task has no finished_at")
    if status is TaskStatus.PENDING and finished is not None:
        raise bad("a pending task has a finished_at")
    return TaskRecord(
        label, model_id, repository, revision, status, done, total, code, error, created, started, finished
    )

"""SQLite work for models and download tasks. Every function here runs on the database thread
(`Database.run`); callers validate ids before calling. Rows come back as plain dicts and are
validated by `vllm_use.models.parse_row` / `vllm_use.downloads.tasks.parse_row`."""

from __future__ import annotations

from typing import Any

from vllm_use.clock import now_ms
from vllm_use.downloads.tasks import RETRYABLE, TaskStatus
from vllm_use.models import DOWNLOADABLE, ModelStatus
from vllm_use.storage import DownloadTask, Model


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _select(sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    # Raw rows, not peewee-coerced values: they are validated by the caller (docs/architecture.md, "Storage").
    return _dicts(Model._meta.database.execute_sql(sql, params))


def model_rows() -> list[dict[str, Any]]:
    return _select("SELECT * FROM models ORDER BY created_at, id")


def model_row(model_id: str) -> dict[str, Any] | None:
    rows = _select("SELECT * FROM models WHERE id = ?", (model_id,))
    return rows[0] if rows else None


def model_dirs() -> set[str]:
    return {d for (d,) in Model._meta.database.execute_sql("SELECT dir FROM models").fetchall()}


def insert_model(record: dict[str, Any]) -> bool:
    """False if the directory is already owned (the unique index)."""
    db = Model._meta.database
    with db.atomic():
        if Model.select().where(Model.dir == record["dir"]).exists():
            return False
        Model.insert(**record).execute()
    return True


def insert_models(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert the records whose directory is still free, in one transaction; returns those inserted."""
    db = Model._meta.database
    inserted = []
    with db.atomic():
        for record in records:
            if not Model.select().where(Model.dir == record["dir"]).exists():
                Model.insert(**record).execute()
                inserted.append(record)
    return inserted


def delete_model(model_id: str) -> int:
    return Model.delete().where(Model.id == model_id).execute()


def task_rows(limit: int | None = None) -> list[dict[str, Any]]:
    sql = "SELECT * FROM download_tasks ORDER BY created_at DESC, rowid DESC"
    return _select(sql + " LIMIT ?", (limit,)) if limit else _select(sql)


def task_row(task_id: str) -> dict[str, Any] | None:
    rows = _select("SELECT * FROM download_tasks WHERE id = ?", (task_id,))
    return rows[0] if rows else None


def accept_task(task: dict[str, Any], retry: bool) -> str:
    """Accept a download (docs/models-and-downloads.md, "Downloads") in one transaction: persist the
    task (insert, or for a retry reset it to pending) and move the model registered/error/failed/canceled
    → downloading (conditional).
    Returns "ok", "task_exists", "task_not_retryable" or "model_not_startable"."""
    db = Model._meta.database
    now = now_ms()
    with db.atomic() as txn:
        moved = (
            Model.update(status=ModelStatus.DOWNLOADING, error=None, updated_at=now)
            .where(
                (Model.id == task["model_id"])
                & (Model.source == "huggingface")
                & (Model.status.in_(DOWNLOADABLE))
            )
            .execute()
        )
        if moved != 1:
            txn.rollback()
            return "model_not_startable"
        if retry:
            reset = (
                DownloadTask.update(
                    status=TaskStatus.PENDING,
                    repository=task["repository"],
                    revision=task["revision"],
                    bytes_done=0,
                    bytes_total=None,
                    exit_code=None,
                    error=None,
                    started_at=None,
                    finished_at=None,
                )
                .where(
                    (DownloadTask.id == task["id"])
                    & (DownloadTask.model_id == task["model_id"])
                    & (DownloadTask.status.in_(RETRYABLE))
                )
                .execute()
            )
            if reset != 1:
                txn.rollback()
                return "task_not_retryable"
        else:
            if DownloadTask.select().where(DownloadTask.id == task["id"]).exists():
                txn.rollback()
                return "task_exists"
            DownloadTask.insert(**task).execute()
    return "ok"


def mark_running(task_id: str) -> bool:
    """pending → running with started_at, before the child is spawned."""
    return (
        DownloadTask.update(status=TaskStatus.RUNNING, started_at=now_ms())
        .where((DownloadTask.id == task_id) & (DownloadTask.status == TaskStatus.PENDING))
        .execute()
        == 1
    )


def finish_task(
    task_id: str,
    model_id: str,
    status: TaskStatus,
    *,
    model_status: ModelStatus,
    exit_code: int | None = None,
    error: str | None = None,
    bytes_done: int | None = None,
    bytes_total: int | None = None,
    size_bytes: int | None = None,
) -> None:
    """A terminal state for the task and its model, in one transaction."""
    db = Model._meta.database
    now = now_ms()
    task_fields: dict[str, Any] = {
        "status": status,
        "finished_at": now,
        "exit_code": exit_code,
        "error": error,
    }
    if bytes_done is not None:
        task_fields["bytes_done"] = bytes_done
    if bytes_total is not None:
        task_fields["bytes_total"] = bytes_total
    with db.atomic():
        DownloadTask.update(**task_fields).where(DownloadTask.id == task_id).execute()
        model_fields: dict[str, Any] = {"status": model_status, "updated_at": now, "error": error}
        if size_bytes is not None:
            model_fields["size_bytes"] = size_bytes
        Model.update(**model_fields).where(
            (Model.id == model_id) & (Model.status == ModelStatus.DOWNLOADING)
        ).execute()


def save_progress(task_id: str, done: int, total: int | None) -> None:
    DownloadTask.update(bytes_done=done, bytes_total=total).where(DownloadTask.id == task_id).execute()


def cancel_interrupted(task_ids: list[str], model_ids: list[str]) -> None:
    """Restart recovery: interrupted pending/running tasks and their models → canceled, one transaction."""
    db = Model._meta.database
    now = now_ms()
    with db.atomic():
        for task_id in task_ids:
            DownloadTask.update(
                status=TaskStatus.CANCELED, finished_at=now, error="interrupted by a restart"
            ).where(DownloadTask.id == task_id).execute()
        for model_id in model_ids:
            Model.update(
                status=ModelStatus.CANCELED, updated_at=now, error="download interrupted by a restart"
            ).where(Model.id == model_id).execute()

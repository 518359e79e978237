"""Every query of the `models` and `download_tasks` tables (docs/models-and-downloads.md). The two
live together because accepting, finishing and canceling a download each change both in one
transaction. Every function runs on the database thread: call it through `Database.query(fn, …)`;
callers validate ids before calling. Rows come back as stored and are validated by
`models.records.parse_row` / `downloads.tasks.parse_row`."""

from __future__ import annotations

from typing import Any

from vllm_use.clock import now_ms
from vllm_use.downloads.tasks import RETRYABLE, TaskStatus
from vllm_use.errors import ConfigError
from vllm_use.models.records import DOWNLOADABLE, ModelStatus
from vllm_use.storage import Database, DownloadTaskTable, ModelTable


def model_rows(db: Database) -> list[dict[str, Any]]:
    return db.rows("SELECT * FROM models ORDER BY created_at, id")


def model_row(db: Database, model_id: str) -> dict[str, Any] | None:
    rows = db.rows("SELECT * FROM models WHERE id = ?", (model_id,))
    return rows[0] if rows else None


def model_dirs(db: Database) -> set[str]:
    return {d for (d,) in db.execute("SELECT dir FROM models").fetchall()}


def insert_model(db: Database, record: dict[str, Any]) -> bool:
    """False if the directory is already owned (the unique index)."""
    with db.atomic():
        if ModelTable.select().where(ModelTable.dir == record["dir"]).exists(db.peewee_db):
            return False
        ModelTable.insert(**record).execute(db.peewee_db)
    return True


def insert_models(db: Database, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert the records whose directory is still free, in one transaction; returns those inserted."""
    inserted = []
    with db.atomic():
        for record in records:
            if not ModelTable.select().where(ModelTable.dir == record["dir"]).exists(db.peewee_db):
                ModelTable.insert(**record).execute(db.peewee_db)
                inserted.append(record)
    return inserted


def delete_model(db: Database, model_id: str) -> int:
    return ModelTable.delete().where(ModelTable.id == model_id).execute(db.peewee_db)


def task_rows(db: Database, limit: int | None = None) -> list[dict[str, Any]]:
    sql = "SELECT * FROM download_tasks ORDER BY created_at DESC, rowid DESC"
    return db.rows(sql + " LIMIT ?", (limit,)) if limit else db.rows(sql)


def task_row(db: Database, task_id: str) -> dict[str, Any] | None:
    rows = db.rows("SELECT * FROM download_tasks WHERE id = ?", (task_id,))
    return rows[0] if rows else None


def accept_task(db: Database, task: dict[str, Any], retry: bool) -> str:
    """Accept a download (docs/models-and-downloads.md, "Downloads") in one transaction: persist the
    task (insert, or for a retry reset it to pending) and move the model registered/error/failed/canceled
    → downloading (conditional).
    Returns "ok", "task_exists", "task_not_retryable" or "model_not_startable"."""
    now = now_ms()
    with db.atomic() as txn:
        moved = (
            ModelTable.update(status=ModelStatus.DOWNLOADING, error=None, updated_at=now)
            .where(
                (ModelTable.id == task["model_id"])
                & (ModelTable.source == "huggingface")
                & (ModelTable.status.in_(DOWNLOADABLE))
            )
            .execute(db.peewee_db)
        )
        if moved != 1:
            txn.rollback()
            return "model_not_startable"
        if retry:
            reset = (
                DownloadTaskTable.update(
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
                    (DownloadTaskTable.id == task["id"])
                    & (DownloadTaskTable.model_id == task["model_id"])
                    & (DownloadTaskTable.status.in_(RETRYABLE))
                )
                .execute(db.peewee_db)
            )
            if reset != 1:
                txn.rollback()
                return "task_not_retryable"
        else:
            if DownloadTaskTable.select().where(DownloadTaskTable.id == task["id"]).exists(db.peewee_db):
                txn.rollback()
                return "task_exists"
            DownloadTaskTable.insert(**task).execute(db.peewee_db)
    return "ok"


def mark_running(db: Database, task_id: str) -> bool:
    """pending → running with started_at, before the child is spawned."""
    return (
        DownloadTaskTable.update(status=TaskStatus.RUNNING, started_at=now_ms())
        .where((DownloadTaskTable.id == task_id) & (DownloadTaskTable.status == TaskStatus.PENDING))
        .execute(db.peewee_db)
        == 1
    )


def finish_task(
    db: Database,
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
        DownloadTaskTable.update(**task_fields).where(DownloadTaskTable.id == task_id).execute(db.peewee_db)
        model_fields: dict[str, Any] = {"status": model_status, "updated_at": now, "error": error}
        if size_bytes is not None:
            model_fields["size_bytes"] = size_bytes
        ModelTable.update(**model_fields).where(
            (ModelTable.id == model_id) & (ModelTable.status == ModelStatus.DOWNLOADING)
        ).execute(db.peewee_db)


def save_progress(db: Database, task_id: str, done: int, total: int | None) -> None:
    DownloadTaskTable.update(bytes_done=done, bytes_total=total).where(
        DownloadTaskTable.id == task_id
    ).execute(db.peewee_db)


def cancel_interrupted(db: Database, task_ids: list[str], model_ids: list[str]) -> None:
    """Restart recovery: interrupted pending/running tasks and their models → canceled, one transaction."""
    now = now_ms()
    with db.atomic():
        for task_id in task_ids:
            DownloadTaskTable.update(
                status=TaskStatus.CANCELED, finished_at=now, error="interrupted by a restart"
            ).where(DownloadTaskTable.id == task_id).execute(db.peewee_db)
        for model_id in model_ids:
            ModelTable.update(
                status=ModelStatus.CANCELED, updated_at=now, error="download interrupted by a restart"
            ).where(ModelTable.id == model_id).execute(db.peewee_db)


def assert_one_record_per_dir(db: Database) -> None:
    """At start-up: two records claiming one directory refuse the start (nothing changed); then the
    unique index on `dir` is (re-)asserted."""
    duplicates = db.execute(
        "SELECT dir, group_concat(id, ', ') FROM models WHERE dir IS NOT NULL GROUP BY dir HAVING count(*) > 1"
    ).fetchall()
    if duplicates:
        directory, ids = duplicates[0]
        raise ConfigError(
            "--data-dir",
            f"models {ids} all claim the directory {directory!r}; vllm-use will not guess which to keep. "
            "Delete the wrong record by hand; refusing to start (nothing was changed)",
        )
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS models_dir_unique ON models (dir)")

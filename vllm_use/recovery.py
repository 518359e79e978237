"""Start-up reconciliation of models and downloads (docs/models-and-downloads.md). Runs before listening.

Everything is read first and validated; then, in order: one directory ↔ one
record is re-asserted (two records for one directory refuse the start, data
kept), interrupted deletes are finished or undone (`models.reconcile_quarantine`),
and interrupted downloads are marked canceled with their models in one
transaction. Any inconsistency raises ConfigError: nothing is spawned, nothing
listens.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vllm_use import model_store, models
from vllm_use.downloads import tasks
from vllm_use.errors import ConfigError, CorruptRecord
from vllm_use.models import ModelStatus
from vllm_use.storage import Database, Model

log = logging.getLogger(__name__)
OPTION = "--data-dir"


def _assert_one_record_per_dir() -> None:
    """Runs on the DB thread."""
    db = Model._meta.database
    duplicates = db.execute_sql(
        "SELECT dir, group_concat(id, ', ') FROM models WHERE dir IS NOT NULL GROUP BY dir HAVING count(*) > 1"
    ).fetchall()
    if duplicates:
        directory, ids = duplicates[0]
        raise ConfigError(
            OPTION,
            f"models {ids} all claim the directory {directory!r}; vllm-use will not guess which to keep. "
            "Delete the wrong record by hand; refusing to start (nothing was changed)",
        )
    db.execute_sql("CREATE UNIQUE INDEX IF NOT EXISTS models_dir_unique ON models (dir)")


def recover(db: Database, root: Path) -> None:
    """Synchronous; raises ConfigError on anything it cannot reconcile safely."""
    model_rows = db.run_sync(model_store.model_rows)
    task_rows = db.run_sync(model_store.task_rows)
    try:
        records = {r.id: r for r in map(models.parse_row, model_rows)}
        task_records = [tasks.parse_row(row) for row in task_rows]
    except CorruptRecord as exc:
        raise ConfigError(OPTION, f"{exc.message}; refusing to start") from None
    db.run_sync(_assert_one_record_per_dir)
    models.reconcile_quarantine(root, records)

    interrupted = [t for t in task_records if t.status in tasks.ACTIVE]
    for task in interrupted:
        model = records.get(task.model_id)
        if model is None or model.status is not ModelStatus.DOWNLOADING:
            raise ConfigError(
                OPTION,
                f"download task {task.id} was {task.status} but its model {task.model_id} is "
                f"{model.status if model else 'missing'}; refusing to start",
            )
    owners = {t.model_id for t in interrupted}
    orphans = [m.id for m in records.values() if m.status is ModelStatus.DOWNLOADING and m.id not in owners]
    if orphans:
        raise ConfigError(OPTION, f"model {orphans[0]} is downloading but no task is; refusing to start")
    if interrupted:
        db.run_sync(model_store.cancel_interrupted, [t.id for t in interrupted], sorted(owners))
        log.warning("marked %d interrupted download(s) canceled", len(interrupted))

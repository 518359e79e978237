"""Start-up reconciliation of models and downloads (docs/models-and-downloads.md). Runs before listening.

Everything is read first and validated; then, in order: one directory ↔ one
record is re-asserted (two records for one directory refuse the start, data
kept), interrupted deletes are finished or undone (`models.files.reconcile_quarantine`),
and interrupted downloads are marked canceled with their models in one
transaction. Any inconsistency raises ConfigError: nothing is spawned, nothing
listens.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vllm_use.downloads import tasks
from vllm_use.errors import ConfigError, CorruptRecord
from vllm_use.models import files, records, store
from vllm_use.models.records import ModelStatus
from vllm_use.storage import Database

log = logging.getLogger(__name__)
OPTION = "--data-dir"


def recover(db: Database, root: Path) -> None:
    """Synchronous; raises ConfigError on anything it cannot reconcile safely."""
    model_rows = db.query_sync(store.model_rows)
    task_rows = db.query_sync(store.task_rows)
    try:
        known = {r.id: r for r in map(records.parse_row, model_rows)}
        task_records = [tasks.parse_row(row) for row in task_rows]
    except CorruptRecord as exc:
        raise ConfigError(OPTION, f"{exc.message}; refusing to start") from None
    db.query_sync(store.assert_one_record_per_dir)
    files.reconcile_quarantine(root, known)

    interrupted = [t for t in task_records if t.status in tasks.ACTIVE]
    for task in interrupted:
        model = known.get(task.model_id)
        if model is None or model.status is not ModelStatus.DOWNLOADING:
            raise ConfigError(
                OPTION,
                f"download task {task.id} was {task.status} but its model {task.model_id} is "
                f"{model.status if model else 'missing'}; refusing to start",
            )
    owners = {t.model_id for t in interrupted}
    orphans = [m.id for m in known.values() if m.status is ModelStatus.DOWNLOADING and m.id not in owners]
    if orphans:
        raise ConfigError(OPTION, f"model {orphans[0]} is downloading but no task is; refusing to start")
    if interrupted:
        db.query_sync(store.cancel_interrupted, [t.id for t in interrupted], sorted(owners))
        log.warning("marked %d interrupted download(s) canceled", len(interrupted))

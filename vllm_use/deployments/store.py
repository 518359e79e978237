"""Every query of the `deployments` table. Each function runs on the database thread: call it
through `Database.query(fn, …)`. Rows are untrusted: a bad one fails the read (`parse_row`)."""

from __future__ import annotations

from typing import Any

from vllm_use.clock import now_ms
from vllm_use.deployments.records import Deployment, parse_row, to_row
from vllm_use.storage import Database, DeploymentTable


def _rows(db: Database, where: Any = None) -> list[dict[str, Any]]:
    query = DeploymentTable.select().order_by(DeploymentTable.name)
    if where is not None:
        query = query.where(where)
    return [parse_row(row) for row in query.dicts().execute(db.peewee_db)]


def all_deployments(db: Database) -> list[dict[str, Any]]:
    return _rows(db)


def deployment(db: Database, name: str) -> dict[str, Any] | None:
    found = _rows(db, DeploymentTable.name == name)
    return found[0] if found else None


def using_model(db: Database, model_id: str) -> list[str]:
    """The names of the deployments that serve `model_id`."""
    query = DeploymentTable.select(DeploymentTable.name).where(DeploymentTable.model_id == model_id)
    return [row["name"] for row in query.order_by(DeploymentTable.name).dicts().execute(db.peewee_db)]


def insert(db: Database, new: Deployment) -> dict[str, Any]:
    stamp = now_ms()
    DeploymentTable.insert(**to_row(new, stamp, stamp)).execute(db.peewee_db)
    saved = deployment(db, new.name)
    assert saved is not None
    return saved


def replace(db: Database, changed: Deployment) -> dict[str, Any] | None:
    """Save `changed` over the deployment of the same name; None if there is none (any more)."""
    with db.atomic():
        query = DeploymentTable.select(DeploymentTable.created_at).where(DeploymentTable.name == changed.name)
        found = list(query.dicts().execute(db.peewee_db))
        if not found:
            return None
        created = found[0]["created_at"]
        fields = to_row(changed, created, max(now_ms(), created))
        DeploymentTable.update(**fields).where(DeploymentTable.name == changed.name).execute(db.peewee_db)
    return deployment(db, changed.name)


def delete(db: Database, name: str) -> int:
    return DeploymentTable.delete().where(DeploymentTable.name == name).execute(db.peewee_db)

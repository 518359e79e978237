"""Every query of the `api_keys` table (docs/auth.md). Each function runs on the database thread:
call it through `Database.query(fn, …)`. Rows come back as stored; `material.parse_row` validates
them."""

from __future__ import annotations

from typing import Any

from vllm_use.storage import ApiKeyTable, Database

# A prefix names at most a handful of keys; more rows than this for one prefix are not ours to try.
PREFIX_ROWS_MAX = 16


def insert(db: Database, record: dict[str, Any]) -> None:
    ApiKeyTable.insert(**record).execute(db.peewee_db)


def all_rows(db: Database) -> list[dict[str, Any]]:
    return db.rows("SELECT * FROM api_keys ORDER BY created_at, id")


def one_row(db: Database, key_id: str) -> dict[str, Any] | None:
    rows = db.rows("SELECT * FROM api_keys WHERE id = ?", (key_id,))
    return rows[0] if rows else None


def rows_with_prefix(db: Database, prefix: str) -> list[dict[str, Any]]:
    return db.rows("SELECT * FROM api_keys WHERE prefix = ? LIMIT ?", (prefix, PREFIX_ROWS_MAX))


def set_enabled(db: Database, key_id: str, enabled: bool) -> dict[str, Any] | None:
    """The row after the change, None if there is no such key."""
    ApiKeyTable.update(enabled=int(enabled)).where(ApiKeyTable.id == key_id).execute(db.peewee_db)
    return one_row(db, key_id)


def update(db: Database, key_id: str, fields: dict[str, Any]) -> dict[str, Any] | None:
    """Write `fields` (column → value, None clearing a limit); the row after, None if there is no
    such key."""
    if fields:
        ApiKeyTable.update(**fields).where(ApiKeyTable.id == key_id).execute(db.peewee_db)
    return one_row(db, key_id)


def delete(db: Database, key_id: str) -> int:
    return ApiKeyTable.delete().where(ApiKeyTable.id == key_id).execute(db.peewee_db)


def count(db: Database) -> int:
    return ApiKeyTable.select().count(db.peewee_db)


# The key policy's columns (docs/auth.md, "API keys"), in the order `confirm` compares them.
POLICY_COLUMNS = ("expires_at", "models", "rpm", "max_concurrent", "tokens_per_day")


def policy_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's policy columns as stored, for `confirm`."""
    return tuple(row.get(column) for column in POLICY_COLUMNS)


def confirm(
    db: Database, key_id: str, hash_hex: str, scopes_json: str, policy: tuple[Any, ...], used_ms: int
) -> bool:
    """The publishing step of a verification: true only if the key is still enabled, not expired
    at `used_ms` and unchanged (same hash, scopes and policy: `policy_of`); it also records the use."""
    cursor = db.execute(
        "UPDATE api_keys SET last_used_at = MAX(COALESCE(last_used_at, 0), ?) "
        "WHERE id = ? AND hash = ? AND scopes = ? AND enabled = 1 "
        "AND (expires_at IS NULL OR expires_at > ?) "
        # IS: NULL equals NULL. The columns of POLICY_COLUMNS, in its order.
        "AND expires_at IS ? AND models IS ? AND rpm IS ? AND max_concurrent IS ? AND tokens_per_day IS ?",
        (used_ms, key_id, hash_hex, scopes_json, used_ms, *policy),
    )
    return cursor.rowcount == 1


def write_last_used(db: Database, pending: dict[str, int]) -> None:
    """Last-use times batched in memory, in one transaction; a time never moves back."""
    with db.atomic():
        for key_id, used in pending.items():
            db.execute(
                "UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)",
                (used, key_id, used),
            )

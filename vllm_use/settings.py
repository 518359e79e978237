"""Every query of the `settings` table (docs/security.md, "Secrets"). Each function runs on the
database thread: call it through `Database.query(fn, …)`. Rows are untrusted: a bad one fails the
read, never yields a partial list."""

from __future__ import annotations

import unicodedata
from typing import Any

from vllm_use.clock import iso, now_ms
from vllm_use.errors import CorruptRecord
from vllm_use.sensitive import is_sensitive_key
from vllm_use.storage import Database, SettingTable

KEY_MAX, VALUE_MAX = 128, 8192


def read_all(db: Database) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT key, value, updated_at FROM settings ORDER BY key")
    return [_validated(key, value, updated) for key, value, updated in cursor.fetchall()]


def _validated(key: Any, value: Any, updated: Any) -> dict[str, Any]:
    """Rows are untrusted: a bad one fails the request, never a partial list."""
    ok = (
        isinstance(key, str)
        and 0 < len(key) <= KEY_MAX
        and isinstance(value, str)
        and len(value) <= VALUE_MAX
        and type(updated) is int
        and updated > 0
    )
    if not ok or is_sensitive_key(key) or any(unicodedata.category(c) == "Cc" for c in key + value):
        name = key[:KEY_MAX] if isinstance(key, str) else "<not text>"
        raise CorruptRecord(f"setting record {name!r} is corrupt", record=name)
    return {"key": key, "value": value, "updated_at": iso(updated)}


def upsert(db: Database, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
    stamp = now_ms()
    with db.atomic():
        for key, value in items:
            SettingTable.insert(key=key, value=value, updated_at=stamp).on_conflict_replace().execute(
                db.peewee_db
            )
    return read_all(db)


def delete(db: Database, key: str) -> int:
    return SettingTable.delete().where(SettingTable.key == key).execute(db.peewee_db)


def count(db: Database) -> int:
    return SettingTable.select().count(db.peewee_db)

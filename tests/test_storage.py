"""The SQLite file: safety checks, migrations, WAL, the sensitive-settings purge (docs/architecture.md,
"Storage"; docs/security.md, "Secrets")."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import peewee
import pytest

from vllm_use import storage
from vllm_use.clock import now_ms
from vllm_use.errors import ConfigError
from vllm_use.storage import Database, SettingTable

SENSITIVE_KEYS = [
    "token",
    "Password",
    "api_key",
    "API-Key",
    "apiKey",
    "api key",
    "a\u200bpi_key",
    "\uff21\uff30\uff29\uff3f\uff2b\uff25\uff39",
    "client.secret",
]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "vllm-use.db"


@pytest.fixture
def open_db(db_path: Path) -> Iterator[Callable[[], Database]]:
    """Open a Database on db_path; every one opened is closed at teardown, even after a refusal."""
    made: list[Database] = []

    def _open() -> Database:
        db = Database(db_path)
        made.append(db)
        db.open()
        return db

    yield _open
    for db in made:
        db.close()


def build_database(
    path: Path, version: int, *, extra: Callable[[sqlite3.Connection], None] | None = None
) -> None:
    """Build a database at `version` by hand, the way an older vllm-use would have left it."""
    conn = sqlite3.connect(path)
    try:
        for ddl in storage.SCHEMA_DDL[: min(version, storage.SCHEMA_VERSION)]:
            for statement in ddl:
                conn.execute(statement)
        if extra is not None:
            extra(conn)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
    finally:
        conn.close()


def add_v1_rows(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT INTO api_keys (id, name, prefix, salt, hash, enabled, scopes, created_at, last_used_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("k" * 24, "ci", "vu_abcd", "00" * 16, "11" * 32, 1, '["inference"]', 1_700_000_000_000, None),
    )
    conn.execute("INSERT INTO settings VALUES (?, ?, ?)", ("theme", "dark", 1_700_000_000_000))


def inspect(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_new_database_is_created_0600_at_the_current_schema(
    open_db: Callable[[], Database], db_path: Path
) -> None:
    open_db().close()
    assert mode_of(db_path) == 0o600
    assert inspect(db_path, "PRAGMA user_version") == [(storage.SCHEMA_VERSION,)]
    tables = {name for (name,) in inspect(db_path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"api_keys", "settings", "audit_records"} <= tables


def test_wal_mode_is_on(open_db: Callable[[], Database], db_path: Path) -> None:
    db = open_db()
    assert db.run_sync(lambda: db.peewee_db.execute_sql("PRAGMA journal_mode").fetchone()[0]) == "wal"
    db.close()
    # WAL is persistent: any later connection to the file sees it too.
    assert inspect(db_path, "PRAGMA journal_mode") == [("wal",)]


def test_symlinked_database_path_is_refused_with_a_clear_message(
    open_db: Callable[[], Database], db_path: Path, tmp_path: Path
) -> None:
    real = tmp_path / "elsewhere.db"
    build_database(real, 2)
    real.chmod(0o644)
    before = sha256(real)
    db_path.symlink_to(real)
    with pytest.raises(ConfigError) as info:
        open_db()
    assert info.value.option == "--data-dir"
    assert str(db_path) in str(info.value)
    assert "symbolic link" in str(info.value)
    assert sha256(real) == before
    assert mode_of(real) == 0o644


def test_database_in_a_symlinked_data_dir_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real-data"
    real.mkdir()
    link = tmp_path / "data"
    link.symlink_to(real)
    db = Database(link / "vllm-use.db")
    try:
        with pytest.raises(ConfigError, match="symbolic link") as info:
            db.open()
    finally:
        db.close()
    assert info.value.option == "--data-dir"
    assert list(real.iterdir()) == []


def test_directory_at_database_path_is_refused(open_db: Callable[[], Database], db_path: Path) -> None:
    db_path.mkdir()
    with pytest.raises(ConfigError, match="expected a regular file"):
        open_db()


def test_symlinked_wal_file_is_refused(
    open_db: Callable[[], Database], db_path: Path, tmp_path: Path
) -> None:
    build_database(db_path, 2)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    Path(str(db_path) + "-wal").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        open_db()
    assert victim.read_bytes() == b"precious"


def test_existing_database_with_loose_permissions_is_tightened_to_0600(
    open_db: Callable[[], Database], db_path: Path
) -> None:
    build_database(db_path, 2)
    db_path.chmod(0o644)
    wal = Path(str(db_path) + "-wal")
    wal.write_bytes(b"")  # left behind by an older run with a loose umask
    wal.chmod(0o644)
    open_db()
    assert mode_of(db_path) == 0o600
    assert mode_of(wal) == 0o600
    assert mode_of(Path(str(db_path) + "-shm")) & 0o077 == 0


def test_v1_database_migrates_to_the_current_version_keeping_its_rows(
    open_db: Callable[[], Database], db_path: Path
) -> None:
    build_database(db_path, 1, extra=add_v1_rows)
    open_db().close()
    assert inspect(db_path, "PRAGMA user_version") == [(storage.SCHEMA_VERSION,)]
    assert inspect(db_path, "SELECT count(*) FROM models") == [(0,)]
    assert inspect(db_path, "SELECT id, name, scopes FROM api_keys") == [("k" * 24, "ci", '["inference"]')]
    assert inspect(db_path, "SELECT key, value FROM settings") == [("theme", "dark")]
    assert inspect(db_path, "SELECT count(*) FROM audit_records") == [(0,)]


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_newer_schema_version_refuses_to_start_and_leaves_the_file_unchanged(
    open_db: Callable[[], Database], db_path: Path, journal_mode: str
) -> None:
    def journal(conn: sqlite3.Connection) -> None:
        add_v1_rows(conn)
        conn.commit()  # journal_mode cannot change inside a transaction
        assert conn.execute(f"PRAGMA journal_mode = {journal_mode}").fetchone() == (journal_mode,)

    newer = storage.SCHEMA_VERSION + 1
    build_database(db_path, newer, extra=journal)
    db_path.chmod(0o600)
    before = sha256(db_path)
    with pytest.raises(ConfigError) as info:
        open_db()
    assert info.value.option == "--data-dir"
    expected = f"schema version {newer} is newer than this vllm-use supports ({storage.SCHEMA_VERSION})"
    assert expected + "; refusing to start" in str(info.value)
    assert sha256(db_path) == before


def test_failed_migration_leaves_old_data_and_version_untouched(
    open_db: Callable[[], Database], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_database(db_path, 1, extra=add_v1_rows)

    real_v2 = storage.MIGRATIONS[1]

    def half_done_migration(db: peewee.SqliteDatabase) -> None:
        real_v2(db)  # audit_records now exists inside the transaction...
        raise RuntimeError("disk on fire")  # ...and then the migration fails

    monkeypatch.setattr(storage, "MIGRATIONS", [storage.MIGRATIONS[0], half_done_migration])

    with pytest.raises(ConfigError, match="schema version 2 failed") as info:
        open_db()
    assert "disk on fire" in str(info.value)
    assert inspect(db_path, "PRAGMA user_version") == [(1,)]
    tables = {name for (name,) in inspect(db_path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert "audit_records" not in tables
    assert inspect(db_path, "SELECT id FROM api_keys") == [("k" * 24,)]
    assert inspect(db_path, "SELECT key, value FROM settings") == [("theme", "dark")]


def test_database_without_version_holding_foreign_tables_is_refused(
    open_db: Callable[[], Database], db_path: Path
) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match="not ours"):
        open_db()
    assert {name for (name,) in inspect(db_path, "SELECT name FROM sqlite_master")} == {"invoices"}


def test_file_that_is_not_a_database_is_refused_unchanged(
    open_db: Callable[[], Database], db_path: Path
) -> None:
    db_path.write_bytes(b"definitely not sqlite " * 50)
    db_path.chmod(0o600)
    before = sha256(db_path)
    with pytest.raises(ConfigError, match="cannot read database"):
        open_db()
    assert sha256(db_path) == before


def test_sensitive_settings_rows_are_purged_on_open(
    open_db: Callable[[], Database], db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def add_settings(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO settings VALUES ('default_model', 'qwen', 1)")
        for key in SENSITIVE_KEYS:
            conn.execute("INSERT INTO settings VALUES (?, 'hunter2-leaked-value', 1)", (key,))

    build_database(db_path, 2, extra=add_settings)
    with caplog.at_level(logging.DEBUG):
        open_db().close()
    assert inspect(db_path, "SELECT key, value FROM settings") == [("default_model", "qwen")]
    assert f"purged {len(SENSITIVE_KEYS)} settings" in caplog.text
    assert "hunter2" not in caplog.text
    assert "client.secret" not in caplog.text


def test_models_read_and_write_through_async_run_on_the_sqlite_thread(
    open_db: Callable[[], Database],
) -> None:
    db = open_db()

    def write_and_read() -> tuple[str, str]:
        with db.atomic():
            SettingTable.create(key="theme", value="dark", updated_at=now_ms())
        return SettingTable.get(SettingTable.key == "theme").value, threading.current_thread().name

    async def main() -> tuple[str, str]:
        return await db.run(write_and_read)

    value, thread_name = asyncio.run(main())
    assert value == "dark"
    assert thread_name.startswith("sqlite")
    assert thread_name != threading.current_thread().name


def test_reopening_a_current_database_keeps_its_rows(open_db: Callable[[], Database], db_path: Path) -> None:
    db = open_db()
    db.run_sync(lambda: SettingTable.create(key="theme", value="light", updated_at=now_ms()))
    db.close()
    db = open_db()
    assert db.run_sync(lambda: [(s.key, s.value) for s in SettingTable.select()]) == [("theme", "light")]


def test_debug_logging_never_records_stored_values(
    open_db: Callable[[], Database], caplog: pytest.LogCaptureFixture
) -> None:
    db = open_db()
    with caplog.at_level(logging.DEBUG):
        db.run_sync(
            lambda: SettingTable.create(key="theme", value="value-that-must-not-be-logged", updated_at=1)
        )
        db.run_sync(lambda: SettingTable.get(SettingTable.key == "theme"))
    assert "value-that-must-not-be-logged" not in caplog.text


def _shape(connection: sqlite3.Connection, table: str) -> dict[str, object]:
    """What a table is, as SQLite reports it: its columns and its indexes (by columns and
    uniqueness, not by name)."""
    columns = [row[1:6] for row in connection.execute(f"PRAGMA table_info({table})")]  # name … pk
    indexes = set()
    for _, name, unique, *_ in connection.execute(f"PRAGMA index_list({table})"):
        indexed = tuple(row[2] for row in connection.execute(f"PRAGMA index_info({name})"))
        indexes.add((indexed, bool(unique)))
    return {"columns": columns, "indexes": indexes}


def test_the_migrations_build_exactly_the_tables_the_classes_declare(open_db, tmp_path: Path) -> None:
    """Each table is declared once, by its peewee class: the schema that the migrations (and the
    start-up checks) leave behind equals the one peewee would create from the classes."""
    open_db().close()
    migrated = sqlite3.connect(tmp_path / "vllm-use.db")
    declared_db = peewee.SqliteDatabase(":memory:")
    with declared_db.bind_ctx(storage.TABLES, bind_refs=False, bind_backrefs=False):
        declared_db.create_tables(storage.TABLES)
        declared = declared_db.connection()
        tables = sorted(table._meta.table_name for table in storage.TABLES)
        assert tables == sorted(storage.EXPECTED_TABLES)
        on_disk = [
            name
            for (name,) in migrated.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")
        ]
        assert sorted(on_disk) == tables
        for table in tables:
            assert _shape(migrated, table) == _shape(declared, table), table
    migrated.close()

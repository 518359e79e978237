"""SQLite storage through peewee: the source of truth (docs/architecture.md, "Storage").

One file, `<data-dir>/vllm-use.db`, in WAL mode, a regular file (never a symlink) with mode 0600.

Threading: every SQLite call runs on ONE dedicated thread owned by `Database`. The event loop
awaits `Database.query(store_fn, ...)` (or `run(fn, ...)`), so it never blocks on disk, and
peewee's per-thread connection is always the same one.

Each table is declared once, by its peewee class below (`*Table`); tests/test_storage.py proves
that the migrations build exactly what the classes declare. Each table's queries live in its
domain's store and nowhere else: `api_keys` in keys/store.py, `settings` in settings.py,
`audit_records` in gateway/audit.py, `models` and `download_tasks` in models/store.py. A store
function takes the `Database` as its first argument and runs on the DB thread: callers hand it to
`Database.query` (or `query_sync` at start-up and shutdown), never call it from another thread.

Schema versions live in `PRAGMA user_version`. `MIGRATIONS[n]` takes a version-n database to
version n+1; `open()` applies the missing ones and the new user_version in ONE transaction, so a
failure leaves the old data and version untouched and start-up is refused. A database newer than
this code is refused before anything is written to it (it is inspected read-only first).

Everything read back is untrusted: the models use plain integer/text fields, not booleans
or JSON fields that would coerce bad rows silently; abilities validate rows and raise
`CorruptRecord`.

The table classes are module-level and bound to the database at `open()`: one open `Database`
per process (tests open and close them in turn).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import peewee

from vllm_use import fsafety
from vllm_use.errors import ConfigError
from vllm_use.sensitive import is_sensitive_key

log = logging.getLogger(__name__)

# peewee logs every query WITH its parameters at DEBUG: salts, scrypt hashes, key ids and setting
# values would reach the log under --log-level debug. Keep its logger at INFO or above.
logging.getLogger("peewee").setLevel(logging.INFO)

T = TypeVar("T")
P = ParamSpec("P")

OPTION = "--data-dir"
SCHEMA_VERSION = 5

# DDL of each version, kept as plain SQL so a test can build an old database with stdlib sqlite3.
# Never edit a published version; add a new one.
SCHEMA_V1: tuple[str, ...] = (
    """CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        salt TEXT NOT NULL,
        hash TEXT NOT NULL,
        enabled INTEGER NOT NULL,
        scopes TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        last_used_at INTEGER NULL
    )""",
    "CREATE INDEX api_keys_prefix ON api_keys (prefix)",
    """CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    )""",
)
SCHEMA_V2: tuple[str, ...] = (
    """CREATE TABLE audit_records (
        audit_id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL,
        key_id TEXT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        model TEXT NULL,
        status INTEGER NOT NULL,
        duration_ms REAL NOT NULL,
        stream INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    )""",
    "CREATE INDEX audit_records_created_at ON audit_records (created_at)",
)
SCHEMA_V3: tuple[str, ...] = (
    # `dir` is the model's directory name directly under the models root: one managed directory ↔ one
    # record (docs/models-and-downloads.md). The unique index is re-asserted at every start
    # (vllm_use.models.store).
    """CREATE TABLE models (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        source TEXT NOT NULL,
        repository TEXT NULL,
        revision TEXT NULL,
        dir TEXT NULL,
        status TEXT NOT NULL,
        size_bytes INTEGER NULL,
        error TEXT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    )""",
    "CREATE UNIQUE INDEX models_dir_unique ON models (dir)",
    # Tasks outlive their models: a task id is a permanent audit identity (docs/models-and-downloads.md).
    """CREATE TABLE download_tasks (
        id TEXT PRIMARY KEY,
        model_id TEXT NOT NULL,
        repository TEXT NOT NULL,
        revision TEXT NOT NULL,
        status TEXT NOT NULL,
        bytes_done INTEGER NOT NULL,
        bytes_total INTEGER NULL,
        exit_code INTEGER NULL,
        error TEXT NULL,
        created_at INTEGER NOT NULL,
        started_at INTEGER NULL,
        finished_at INTEGER NULL
    )""",
    "CREATE INDEX download_tasks_model ON download_tasks (model_id)",
)
# Deployments: named, saved ways to serve a model (docs/router.md). `options` and `aliases` are JSON.
SCHEMA_V4: tuple[str, ...] = (
    """CREATE TABLE deployments (
        name TEXT PRIMARY KEY,
        model_id TEXT NOT NULL,
        options TEXT NOT NULL,
        aliases TEXT NOT NULL,
        pinned INTEGER NOT NULL,
        load_on_start INTEGER NOT NULL,
        idle_timeout_s INTEGER NOT NULL,
        idle_action TEXT NOT NULL,
        stop_timeout_s INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    )""",
    "CREATE INDEX deployments_model ON deployments (model_id)",
)
# Observability (docs/observability.md): a key's policy (NULL: no such limit; `models` is a JSON array
# of deployment names and aliases), each audit record's deployment and token counts (NULL: not
# known), and the daily token rollups per key and deployment that outlive the audit cap (`day` is
# the UTC date YYYY-MM-DD; `deployment` is '' for a request that named no deployment).
SCHEMA_V5: tuple[str, ...] = (
    "ALTER TABLE api_keys ADD COLUMN expires_at INTEGER NULL",
    "ALTER TABLE api_keys ADD COLUMN models TEXT NULL",
    "ALTER TABLE api_keys ADD COLUMN rpm INTEGER NULL",
    "ALTER TABLE api_keys ADD COLUMN max_concurrent INTEGER NULL",
    "ALTER TABLE api_keys ADD COLUMN tokens_per_day INTEGER NULL",
    "ALTER TABLE audit_records ADD COLUMN deployment TEXT NULL",
    "ALTER TABLE audit_records ADD COLUMN prompt_tokens INTEGER NULL",
    "ALTER TABLE audit_records ADD COLUMN completion_tokens INTEGER NULL",
    """CREATE TABLE usage_daily (
        day TEXT NOT NULL,
        key_id TEXT NOT NULL,
        deployment TEXT NOT NULL,
        requests INTEGER NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        PRIMARY KEY (day, key_id, deployment)
    )""",
)
# SCHEMA_DDL[n] is the DDL that takes version n to n+1.
SCHEMA_DDL: list[tuple[str, ...]] = [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5]
EXPECTED_TABLES = frozenset(
    {"api_keys", "settings", "audit_records", "models", "download_tasks", "deployments", "usage_daily"}
)

# busy_timeout first so the journal_mode switch waits for another connection's lock instead of
# failing; WAL lets readers proceed while the single writer thread commits.
PRAGMAS: list[tuple[str, Any]] = [
    ("busy_timeout", 5000),
    ("journal_mode", "wal"),
    ("foreign_keys", 1),
    ("synchronous", "NORMAL"),
]


def _apply_ddl(statements: Sequence[str]) -> Callable[[peewee.SqliteDatabase], None]:
    def migrate(db: peewee.SqliteDatabase) -> None:
        for statement in statements:
            db.execute_sql(statement)

    return migrate


# MIGRATIONS[n] takes a version-n database to version n+1; run inside open()'s transaction.
MIGRATIONS: list[Callable[[peewee.SqliteDatabase], None]] = [_apply_ddl(ddl) for ddl in SCHEMA_DDL]


class _Table(peewee.Model):
    """The base of the table declarations. A `TEXT PRIMARY KEY` column of ours has no `NOT NULL` (the
    published DDL above never said it, and SQLite then allows NULL there), so each one is declared
    `null=True`: the classes describe the tables as they are. Rows are validated on read anyway."""

    class Meta:
        legacy_table_names = False


class ApiKeyTable(_Table):
    id = peewee.TextField(primary_key=True, null=True)
    name = peewee.TextField()
    prefix = peewee.TextField(index=True)
    salt = peewee.TextField()  # hex
    hash = peewee.TextField()  # hex scrypt output
    enabled = peewee.IntegerField()  # 0/1; validated on read, not coerced
    scopes = peewee.TextField()  # JSON array of strings
    created_at = peewee.IntegerField()  # unix ms
    last_used_at = peewee.IntegerField(null=True)  # unix ms
    expires_at = peewee.IntegerField(null=True)  # unix ms; NULL: never
    models = peewee.TextField(null=True)  # JSON array of deployment names/aliases; NULL: every model
    rpm = peewee.IntegerField(null=True)  # requests per minute; NULL: no limit
    max_concurrent = peewee.IntegerField(null=True)  # requests at once
    tokens_per_day = peewee.IntegerField(null=True)  # prompt + completion tokens per UTC day

    class Meta:
        table_name = "api_keys"


class SettingTable(_Table):
    key = peewee.TextField(primary_key=True, null=True)
    value = peewee.TextField()
    updated_at = peewee.IntegerField()  # unix ms

    class Meta:
        table_name = "settings"


class AuditTable(_Table):
    audit_id = peewee.TextField(primary_key=True, null=True)
    request_id = peewee.TextField()
    key_id = peewee.TextField(null=True)
    method = peewee.TextField()
    path = peewee.TextField()
    model = peewee.TextField(null=True)
    status = peewee.IntegerField()
    duration_ms = peewee.FloatField()
    stream = peewee.IntegerField()  # 0/1
    created_at = peewee.IntegerField(index=True)  # unix ms
    deployment = peewee.TextField(null=True)  # the deployment that served it; NULL: none
    prompt_tokens = peewee.IntegerField(null=True)  # from the response's usage; NULL: not known
    completion_tokens = peewee.IntegerField(null=True)

    class Meta:
        table_name = "audit_records"


class ModelTable(_Table):
    id = peewee.TextField(primary_key=True, null=True)  # 32 lowercase hex
    name = peewee.TextField()
    source = peewee.TextField()  # local | huggingface
    repository = peewee.TextField(null=True)
    revision = peewee.TextField(null=True)
    dir = peewee.TextField(null=True, unique=True)  # directory name under the models root
    status = peewee.TextField()
    size_bytes = peewee.IntegerField(null=True)
    error = peewee.TextField(null=True)
    created_at = peewee.IntegerField()
    updated_at = peewee.IntegerField()

    class Meta:
        table_name = "models"


class DownloadTaskTable(_Table):
    id = peewee.TextField(primary_key=True, null=True)
    model_id = peewee.TextField(index=True)
    repository = peewee.TextField()
    revision = peewee.TextField()
    status = peewee.TextField()  # pending | running | succeeded | failed | canceled
    bytes_done = peewee.IntegerField()
    bytes_total = peewee.IntegerField(null=True)
    exit_code = peewee.IntegerField(null=True)
    error = peewee.TextField(null=True)
    created_at = peewee.IntegerField()
    started_at = peewee.IntegerField(null=True)
    finished_at = peewee.IntegerField(null=True)

    class Meta:
        table_name = "download_tasks"


class DeploymentTable(_Table):
    name = peewee.TextField(primary_key=True, null=True)  # the served model name: the routing key
    model_id = peewee.TextField(index=True)
    options = peewee.TextField()  # JSON object: runtime options
    aliases = peewee.TextField()  # JSON array of names
    pinned = peewee.IntegerField()  # 0/1
    load_on_start = peewee.IntegerField()  # 0/1
    idle_timeout_s = peewee.IntegerField()
    idle_action = peewee.TextField()  # sleep | stop
    stop_timeout_s = peewee.IntegerField()
    created_at = peewee.IntegerField()  # unix ms
    updated_at = peewee.IntegerField()  # unix ms

    class Meta:
        table_name = "deployments"


class UsageDailyTable(_Table):
    day = peewee.TextField()  # UTC date, YYYY-MM-DD
    key_id = peewee.TextField()
    deployment = peewee.TextField()  # '' when the request named no deployment
    requests = peewee.IntegerField()
    prompt_tokens = peewee.IntegerField()
    completion_tokens = peewee.IntegerField()

    class Meta:
        table_name = "usage_daily"
        primary_key = peewee.CompositeKey("day", "key_id", "deployment")


TABLES: tuple[type[peewee.Model], ...] = (
    ApiKeyTable,
    SettingTable,
    AuditTable,
    ModelTable,
    DownloadTaskTable,
    DeploymentTable,
    UsageDailyTable,
)


def _read_only_version(path: Path) -> int:
    """user_version of `path`, read through a read-only connection so nothing is written to it."""
    uri = "file:" + urllib.parse.quote(os.fspath(path), safe="/") + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise ConfigError(OPTION, f"cannot read database {path}: {exc}") from exc


def _refuse_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise ConfigError(
            OPTION,
            f"database schema version {version} is newer than this vllm-use supports "
            f"({SCHEMA_VERSION}); refusing to start",
        )


class Database:
    """The SQLite file plus the one thread that may touch it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._thread_id: int | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sqlite", initializer=self._remember_thread
        )
        self._db = peewee.SqliteDatabase(None)
        self._closed = False

    @property
    def peewee_db(self) -> peewee.SqliteDatabase:
        """The peewee database; use only inside functions passed to `run`/`run_sync`."""
        return self._db

    def atomic(self) -> Any:
        """A peewee transaction/savepoint context; only on the DB thread (inside `run`)."""
        return self._db.atomic()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one SQL statement; the sqlite3 cursor. Only on the DB thread."""
        return self._db.execute_sql(sql, params)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """The rows of a SELECT as dicts of the values exactly as stored, not coerced by peewee:
        rows are untrusted and their domain validates them. Only on the DB thread."""
        cursor = self._db.execute_sql(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def connection(self) -> sqlite3.Connection:
        """The sqlite3 connection itself. Only on the DB thread."""
        return self._db.connection()

    # -- running work on the DB thread ----------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the DB thread and await its result. Runs on the IOLoop.

        Cancelling the awaiting coroutine does not stop `fn`: it finishes (and commits) anyway.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def query(self, fn: Callable[Concatenate[Database, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a store function `fn(self, *args, **kwargs)` on the DB thread and await its result."""
        return await self.run(lambda: fn(self, *args, **kwargs))

    def query_sync(self, fn: Callable[Concatenate[Database, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`query` for start-up and shutdown: waits, never on the IOLoop."""
        return self.run_sync(lambda: fn(self, *args, **kwargs))

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the DB thread and wait: for start-up and shutdown, never on the IOLoop."""
        if threading.get_ident() == self._thread_id:
            # Waiting on our own single worker would deadlock; on this thread call fn directly.
            raise RuntimeError("Database.run_sync called from the database thread")
        return self._executor.submit(fn, *args).result()

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Check, create or migrate the database file and connect. Synchronous, at start-up.

        Raises ConfigError (option --data-dir) for an unsafe path, an unreadable or foreign
        database, a newer schema version or a failed migration.
        """
        if self._closed:
            raise RuntimeError("Database is closed")
        self.run_sync(self._open_on_thread)

    def close(self) -> None:
        """Close the connection on the DB thread and stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._executor.submit(self._close_on_thread).result()
        finally:
            self._executor.shutdown(wait=True)

    # -- internals (DB thread) -------------------------------------------------------------------

    def _remember_thread(self) -> None:
        self._thread_id = threading.get_ident()

    def _close_on_thread(self) -> None:
        # peewee raises on closing a database that was never initialised (open() refused early).
        if not self._db.deferred and not self._db.is_closed():
            self._db.close()

    def _sidecars(self) -> list[Path]:
        return [self.path.with_name(self.path.name + suffix) for suffix in ("-wal", "-shm")]

    def _secure_sidecars(self) -> None:
        # SQLite opens the -wal/-shm files by name: a symlink there would redirect our writes.
        for sidecar in self._sidecars():
            if os.path.lexists(sidecar):
                fsafety.secure_file(sidecar, option=OPTION)

    def _prepare_file(self) -> None:
        # The config layer secures the data dir too; checking here keeps Database safe on its own
        # (a symlinked parent would put the database, and its -wal/-shm, somewhere unchecked).
        fsafety.secure_dir(self.path.parent, option=OPTION, create=False)
        if not os.path.lexists(self.path):
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                os.close(os.open(self.path, flags, 0o600))
                log.info("created database %s", self.path)
            except FileExistsError:
                pass  # created concurrently; secure_file below decides whether it is acceptable
            except OSError as exc:
                raise ConfigError(OPTION, f"cannot create database {self.path}: {exc.strerror}") from exc
        fsafety.secure_file(self.path, option=OPTION)
        self._secure_sidecars()

    def _open_on_thread(self) -> None:
        self._prepare_file()
        # Checked read-only before the read-write connection: setting WAL mode rewrites the
        # header, and a database from a newer vllm-use must be left exactly as it was.
        _refuse_newer(_read_only_version(self.path))

        self._db.init(os.fspath(self.path), pragmas=PRAGMAS)
        try:
            self._db.connect()
            mode = self._db.execute_sql("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigError(OPTION, f"cannot enable WAL journal mode on {self.path} (got {mode!r})")
            self._db.bind(TABLES, bind_refs=False, bind_backrefs=False)
            self._migrate()
            self._purge_sensitive_settings()
            self._secure_sidecars()
        except ConfigError:
            self._close_on_thread()
            raise
        except (peewee.PeeweeException, sqlite3.Error) as exc:
            self._close_on_thread()
            raise ConfigError(OPTION, f"cannot open database {self.path}: {exc}") from exc

    def _user_version(self) -> int:
        return int(self._db.execute_sql("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        db = self._db
        # IMMEDIATE takes the write lock up front, so the version read here cannot change
        # under us before the migrations commit.
        with db.atomic("IMMEDIATE"):
            version = self._user_version()
            _refuse_newer(version)
            if version == 0:
                foreign = [
                    name
                    for (name,) in db.execute_sql("SELECT name FROM sqlite_master").fetchall()
                    if not str(name).startswith("sqlite_")
                ]
                if foreign:
                    raise ConfigError(
                        OPTION,
                        f"{self.path} already holds tables but no vllm-use schema version; "
                        "refusing to modify a database that is not ours",
                    )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                try:
                    MIGRATIONS[target - 1](db)
                except Exception as exc:
                    raise ConfigError(
                        OPTION,
                        f"migrating {self.path} to schema version {target} failed ({exc}); "
                        "the database was left unchanged; refusing to start",
                    ) from exc
            if version != SCHEMA_VERSION:
                # PRAGMA takes no bound parameters; the value is our own integer constant.
                db.execute_sql(f"PRAGMA user_version = {int(SCHEMA_VERSION)}")
        if version != SCHEMA_VERSION:
            log.info("migrated database %s from schema version %d to %d", self.path, version, SCHEMA_VERSION)
        missing = EXPECTED_TABLES - set(db.get_tables())
        if missing:
            raise ConfigError(
                OPTION,
                f"{self.path} claims schema version {SCHEMA_VERSION} but lacks tables "
                f"{', '.join(sorted(missing))}; refusing to start",
            )

    def _purge_sensitive_settings(self) -> None:
        # Raw SQL on purpose: keys are untrusted and may not even be text; deleting by the exact
        # stored value (not a peewee-coerced string) removes precisely the offending rows. The
        # cursor is used directly because peewee's execute_sql logs every parameter at DEBUG.
        db = self._db
        with db.atomic():
            cursor = db.cursor()
            rows = cursor.execute("SELECT key FROM settings").fetchall()
            doomed = [key for (key,) in rows if is_sensitive_key(_as_text(key))]
            for key in doomed:
                cursor.execute("DELETE FROM settings WHERE key = ?", (key,))
        if doomed:
            # The count only: the keys (and certainly the values) may themselves be secrets.
            log.warning("purged %d settings row(s) whose keys look like credentials", len(doomed))


def _as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)

"""The model registry's rules (docs/models-and-downloads.md): validation, records, managed directories,
crash-safe delete.

A model's status is a `ModelStatus` (its docstring draws the transitions).

One managed directory ↔ one record: `dir` is the directory's name directly under
the models root, guarded by an application lock and a unique index that is
re-asserted at every start. Records read back are validated in full; a bad one
is a `CorruptRecord` naming it, never half a model.

Deleting files is crash-safe: rename the directory into `<models-dir>/.quarantine/<id>`,
commit the SQLite delete, then remove the quarantined copy. `reconcile_quarantine`
finishes or undoes an interrupted delete at start-up and refuses to start on
anything it does not recognise.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import stat
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from vllm_use.clock import iso
from vllm_use.errors import ConfigError, CorruptRecord, InvalidArguments
from vllm_use.fields import MODEL_ID_RE, has_control

log = logging.getLogger(__name__)

QUARANTINE = ".quarantine"


class ModelStatus(StrEnum):
    """Where a model's files stand (`models.list` → `status`).

        registered ──downloads.start──▶ downloading ──hf exit 0──▶ ready
            ▲                               │
            └── retry/start ◀── failed / error / canceled ◀──┘
        register_local / scan ──────────────────────────────▶ ready

    `DOWNLOADABLE`: the states a download may start from.
    """

    REGISTERED = "registered"
    DOWNLOADING = "downloading"
    READY = "ready"
    ERROR = "error"
    FAILED = "failed"
    CANCELED = "canceled"


STATUSES = tuple(ModelStatus)
DOWNLOADABLE = (ModelStatus.REGISTERED, ModelStatus.ERROR, ModelStatus.FAILED, ModelStatus.CANCELED)
SOURCES = ("local", "huggingface")
# The Hub's rules, ASCII only: owner/name of letters, digits, "-", "_", "."; no "--" or "..";
# neither part starts or ends with "-" or "."; not ending in ".git"; at most 96 bytes.
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
REPO_MAX, REVISION_MAX, NAME_MAX = 96, 255, 256
# Test-only fault injection (crash-safety tests kill the process at a named point).
CRASH_ENV = "VLLM_USE_TEST_CRASH_AT"


def _bad(field: str, message: str) -> InvalidArguments:
    return InvalidArguments(
        f"invalid arguments: {field}: {message}", errors=[{"loc": [field], "msg": message}]
    )


def validate_model_id(value: Any, field: str = "id") -> str:
    """Server ids: 32 lowercase hex. Checked before any query or file operation."""
    if not isinstance(value, str) or not MODEL_ID_RE.fullmatch(value):
        raise _bad(field, "a model id is 32 lowercase hexadecimal characters")
    return value


def validate_name(value: str, field: str = "name") -> str:
    if not value.strip() or len(value.encode("utf-8")) > NAME_MAX or has_control(value):
        raise _bad(field, f"1 to {NAME_MAX} UTF-8 bytes without control characters")
    return value


def validate_repository(value: str, field: str = "repository") -> str:
    """`owner/name` as the Hub accepts it."""
    if len(value.encode("utf-8")) > REPO_MAX:
        raise _bad(field, f"at most {REPO_MAX} bytes")
    parts = value.split("/")
    if (
        len(parts) != 2
        or not all(_REPO_PART.fullmatch(p) for p in parts)
        or "--" in value
        or ".." in value
        or value.endswith(".git")
    ):
        raise _bad(field, "must be owner/name (letters, digits, '-', '_', '.'; no '--' or '..')")
    return value


def validate_revision(value: str, field: str = "revision") -> str:
    """A branch, tag or commit: ≤ 255 bytes, no whitespace or control characters, no leading '-'."""
    if (
        not value
        or len(value.encode("utf-8")) > REVISION_MAX
        or value.startswith("-")
        or any(c.isspace() for c in value)
        or has_control(value)
    ):
        raise _bad(
            field, f"1 to {REVISION_MAX} bytes, no whitespace or control characters, not starting with '-'"
        )
    return value


def crash_point(name: str) -> None:
    """Test hook: SIGKILL this process at `name` when VLLM_USE_TEST_CRASH_AT says so."""
    if os.environ.get(CRASH_ENV) == name:
        log.warning("test crash point %s reached: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class ModelRecord:
    id: str
    name: str
    source: str
    repository: str | None
    revision: str | None
    dir: str | None
    status: ModelStatus
    size_bytes: int | None
    error: str | None
    created_at: int
    updated_at: int

    def public(self, root: Path) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "source": self.source,
            "repository": self.repository,
            "revision": self.revision,
            "status": self.status,
            "path": str(root / self.dir) if self.dir else None,
            "size_bytes": self.size_bytes,
            "error": self.error,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }


def parse_row(row: dict[str, Any]) -> ModelRecord:
    """Validate a `models` row read from SQLite; raise CorruptRecord naming it."""
    raw_id = row.get("id")
    label = raw_id if isinstance(raw_id, str) and MODEL_ID_RE.fullmatch(raw_id) else "<malformed id>"

    def bad(why: str) -> CorruptRecord:
        return CorruptRecord(f"model record {label} is corrupt: {why}", record=label)

    if label == "<malformed id>":
        raise bad("id is not 32 lowercase hex characters")
    try:
        name = validate_name(row.get("name"))  # type: ignore[arg-type]
    except (InvalidArguments, AttributeError, TypeError):
        raise bad("name is invalid") from None
    source, status = row.get("source"), row.get("status")
    if source not in SOURCES:
        raise bad("source is unknown")
    if status not in STATUSES:
        raise bad("status is unknown")
    status = ModelStatus(status)
    repository, revision, directory = row.get("repository"), row.get("revision"), row.get("dir")
    try:
        if source == "huggingface":
            validate_repository(repository)  # type: ignore[arg-type]
            validate_revision(revision)  # type: ignore[arg-type]
            if directory != label:
                raise bad("a Hugging Face model's directory must be its id")
        elif repository is not None or revision is not None or status is not ModelStatus.READY:
            raise bad("a local model has no repository or revision and is always ready")
    except (InvalidArguments, AttributeError, TypeError):
        raise bad("repository or revision is invalid") from None
    if not isinstance(directory, str) or not valid_dir_name(directory):
        raise bad("directory is not a plain name under the models root")
    size, error = row.get("size_bytes"), row.get("error")
    if size is not None and (type(size) is not int or size < 0):
        raise bad("size_bytes is not a non-negative integer")
    if status is ModelStatus.READY and size is None:
        raise bad("a ready model has no size")
    if error is not None and (not isinstance(error, str) or len(error) > 65536):
        raise bad("error is not text")
    created, updated = row.get("created_at"), row.get("updated_at")
    if type(created) is not int or type(updated) is not int or created <= 0 or updated < created:
        raise bad("timestamps are out of order")
    return ModelRecord(
        label, name, source, repository, revision, directory, status, size, error, created, updated
    )


def valid_dir_name(name: str) -> bool:
    return (
        0 < len(name) <= 255
        and name not in (".", "..")
        and not name.startswith(".")
        and "/" not in name
        and "\0" not in name
        and not has_control(name)
    )


# --- the managed directory (runs in an executor: filesystem work) ---------------------------


def resolve_local_dir(root: Path, path: str) -> str:
    """The directory name for `path` (absolute or relative to the root), which must be a real
    subdirectory directly under the root: not the root, not a symlink, not escaping it."""
    if not path or "\0" in path or has_control(path) or len(path) > 4096:
        raise _bad("path", "a directory path without control characters")
    candidate = Path(path) if os.path.isabs(path) else root / path
    normal = Path(os.path.normpath(candidate))
    if normal.parent != root or not valid_dir_name(normal.name):
        raise _bad("path", f"must name a directory directly under the models root {root}")
    try:
        info = os.lstat(normal)
    except FileNotFoundError:
        raise _bad("path", f"{normal} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise _bad("path", f"{normal} is a symbolic link; register the real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise _bad("path", f"{normal} is not a directory")
    return normal.name


def directory_size(path: Path) -> int:
    """Bytes of the regular files under `path`, never following symlinks. Runs in an executor."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return total


def real_model_dir(root: Path, name: str) -> Path:
    """`root/name` if it is a real, readable directory (not a symlink); else InvalidArguments."""
    path = root / name
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode) or not os.access(path, os.R_OK | os.X_OK):
        raise _bad("path", f"{path} is not a real readable directory")
    return path


def scan_candidates(root: Path, known_dirs: set[str]) -> list[str]:
    """Real subdirectories with a config.json that no record owns yet. Runs in an executor."""
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            if not valid_dir_name(entry.name) or entry.name in known_dirs:
                continue
            if entry.is_dir(follow_symlinks=False) and os.path.isfile(
                os.path.join(entry.path, "config.json")
            ):
                found.append(entry.name)
    return sorted(found)


def quarantine(root: Path, model_id: str, name: str) -> Path | None:
    """Atomically move `root/name` to `root/.quarantine/<id>`; None if there is no directory."""
    source = root / name
    if not os.path.lexists(source):
        return None
    if os.path.islink(source) or not os.path.isdir(source):
        raise _bad("files", f"{source} is not a real directory; refusing to delete it")
    qdir = root / QUARANTINE
    qdir.mkdir(mode=0o700, exist_ok=True)
    if os.path.islink(qdir) or not qdir.is_dir():
        raise _bad("files", f"{qdir} is not a real directory")
    target = qdir / model_id
    os.rename(source, target)
    return target


def restore(root: Path, model_id: str, name: str) -> None:
    os.rename(root / QUARANTINE / model_id, root / name)


def purge(path: Path) -> None:
    shutil.rmtree(path)


def reconcile_quarantine(root: Path, records: dict[str, ModelRecord]) -> None:
    """At start-up: restore quarantined dirs whose record exists, remove those whose record is
    gone, and refuse to start (ConfigError) on anything else, keeping it."""
    qdir = root / QUARANTINE
    if not os.path.lexists(qdir):
        return
    if os.path.islink(qdir) or not qdir.is_dir():
        raise ConfigError("--models-dir", f"{qdir} is not a real directory; refusing to start")
    for entry in sorted(os.listdir(qdir)):
        path = qdir / entry
        if not MODEL_ID_RE.fullmatch(entry) or os.path.islink(path) or not path.is_dir():
            raise ConfigError(
                "--models-dir",
                f"unknown content in {qdir}: {entry!r}; it was kept — move it away by hand; refusing to start",
            )
        record = records.get(entry)
        if record is None:
            log.info("removing %s: its model's delete was committed before a restart", path)
            purge(path)
        elif record.dir and not os.path.lexists(root / record.dir):
            log.info("restoring %s to %s: its delete was interrupted before commit", path, root / record.dir)
            restore(root, entry, record.dir)
        else:
            raise ConfigError(
                "--models-dir",
                f"{path} belongs to model {entry}, whose directory exists again; kept; refusing to start",
            )

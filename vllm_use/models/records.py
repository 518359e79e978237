"""The model registry's rules (docs/models-and-downloads.md): validation and records.

A model's status is a `ModelStatus` (its docstring draws the transitions).

One managed directory ↔ one record: `dir` is the directory's name directly under
the models root, guarded by an application lock and a unique index that is
re-asserted at every start. Records read back are validated in full; a bad one
is a `CorruptRecord` naming it, never half a model. The directories themselves
are models/files.py's.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from vllm_use.clock import iso
from vllm_use.errors import CorruptRecord, InvalidArguments
from vllm_use.fields import MODEL_ID_RE, has_control

log = logging.getLogger(__name__)


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


def invalid(field: str, message: str) -> InvalidArguments:
    """The error for a bad `field`, for this module and models/files.py."""
    return InvalidArguments(
        f"invalid arguments: {field}: {message}", errors=[{"loc": [field], "msg": message}]
    )


def validate_model_id(value: Any, field: str = "id") -> str:
    """Server ids: 32 lowercase hex. Checked before any query or file operation."""
    if not isinstance(value, str) or not MODEL_ID_RE.fullmatch(value):
        raise invalid(field, "a model id is 32 lowercase hexadecimal characters")
    return value


def validate_name(value: str, field: str = "name") -> str:
    if not value.strip() or len(value.encode("utf-8")) > NAME_MAX or has_control(value):
        raise invalid(field, f"1 to {NAME_MAX} UTF-8 bytes without control characters")
    return value


def validate_repository(value: str, field: str = "repository") -> str:
    """`owner/name` as the Hub accepts it."""
    if len(value.encode("utf-8")) > REPO_MAX:
        raise invalid(field, f"at most {REPO_MAX} bytes")
    parts = value.split("/")
    if (
        len(parts) != 2
        or not all(_REPO_PART.fullmatch(p) for p in parts)
        or "--" in value
        or ".." in value
        or value.endswith(".git")
    ):
        raise invalid(field, "must be owner/name (letters, digits, '-', '_', '.'; no '--' or '..')")
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
        raise invalid(
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

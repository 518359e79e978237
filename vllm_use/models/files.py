"""A model's managed directory (docs/models-and-downloads.md): where it is, its size, and the
crash-safe delete. Everything here is filesystem work: it runs in an executor.

One managed directory ↔ one record: `dir` is the directory's name directly under the models root.
Deleting files is crash-safe: rename the directory into `<models-dir>/.quarantine/<id>`, commit
the SQLite delete, then remove the quarantined copy. `reconcile_quarantine` finishes or undoes an
interrupted delete at start-up and refuses to start on anything it does not recognise.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from vllm_use.errors import ConfigError
from vllm_use.fields import MODEL_ID_RE, has_control
from vllm_use.models.records import ModelRecord, invalid, valid_dir_name

log = logging.getLogger(__name__)

QUARANTINE = ".quarantine"


def resolve_local_dir(root: Path, path: str, field: str = "path") -> str:
    """The directory name for `path` (absolute or relative to the root), which must be a real
    subdirectory directly under the root: not the root, not a symlink, not escaping it."""
    if not path or "\0" in path or has_control(path) or len(path) > 4096:
        raise invalid(field, "a directory path without control characters")
    candidate = Path(path) if os.path.isabs(path) else root / path
    normal = Path(os.path.normpath(candidate))
    if normal.parent != root or not valid_dir_name(normal.name):
        raise invalid(field, f"must name a directory directly under the models root {root}")
    try:
        info = os.lstat(normal)
    except FileNotFoundError:
        raise invalid(field, f"{normal} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise invalid(field, f"{normal} is a symbolic link; register the real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise invalid(field, f"{normal} is not a directory")
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
        raise invalid("path", f"{path} is not a real readable directory")
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
        raise invalid("files", f"{source} is not a real directory; refusing to delete it")
    qdir = root / QUARANTINE
    qdir.mkdir(mode=0o700, exist_ok=True)
    if os.path.islink(qdir) or not qdir.is_dir():
        raise invalid("files", f"{qdir} is not a real directory")
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


CARD_MAX_BYTES = 1024 * 1024  # a config.json or generation_config.json larger than this is not read

# The keys of a generation_config.json that vLLM applies by default (`--generation-config auto`):
# each with the request field it fills and the values that field accepts (the chat's bounds,
# static/js/chat/params.js); anything else is dropped.
GENERATION_KEYS: dict[str, tuple[str, type, Callable[[float], bool]]] = {
    "temperature": ("temperature", float, lambda v: 0 <= v <= 2),
    "top_p": ("top_p", float, lambda v: 0 < v <= 1),
    "top_k": ("top_k", int, lambda v: v >= -1),
    "min_p": ("min_p", float, lambda v: 0 <= v <= 1),
    "repetition_penalty": ("repetition_penalty", float, lambda v: 0 < v <= 2),
    "max_new_tokens": ("max_tokens", int, lambda v: v >= 1),
}


def _read_json_file(path: Path) -> object:
    """The JSON in `path`, or None when it is missing, a symlink (O_NOFOLLOW), larger than
    `CARD_MAX_BYTES` or not JSON. Runs in an executor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(CARD_MAX_BYTES + 1)
        return json.loads(raw) if len(raw) <= CARD_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None


def generation_defaults(directory: Path) -> dict[str, float | int]:
    """The sampling defaults vLLM takes from the model's `generation_config.json` (docs/router.md):
    only the keys of `GENERATION_KEYS` whose value is a number in range (`max_new_tokens` becomes
    `max_tokens`); {} when the file is missing, a symlink, too large or not a JSON object."""
    config = _read_json_file(directory / "generation_config.json")
    if not isinstance(config, dict):
        return {}
    found: dict[str, float | int] = {}
    for key, (field, kind, accepts) in GENERATION_KEYS.items():
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if kind is int and not (isinstance(value, int) or float(value).is_integer()):
            continue
        if accepts(value):
            found[field] = int(value) if kind is int else value
    return found


def model_card(directory: Path) -> dict[str, object]:
    """What `GET /v1/models` says of a model from its `config.json`: `max_model_len` (its
    `max_position_embeddings`, or its text model's) and `input_modalities` (text, plus image for a
    `vision_config`, audio for an `audio_config`); and from its `generation_config.json`,
    `generation_defaults` (`generation_defaults()`). A file that is missing, a symlink, larger than
    `CARD_MAX_BYTES` or not a JSON object gives the defaults (None, text only, {}). Runs in an
    executor."""
    card: dict[str, object] = {
        "max_model_len": None,
        "input_modalities": ["text"],
        "generation_defaults": generation_defaults(directory),
    }
    config = _read_json_file(directory / "config.json")
    if not isinstance(config, dict):
        return card
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for length in (config.get("max_position_embeddings"), text.get("max_position_embeddings")):
        if type(length) is int and length > 0:
            card["max_model_len"] = length
            break
    modalities = ["text"]
    if isinstance(config.get("vision_config"), dict):
        modalities.append("image")
    if isinstance(config.get("audio_config"), dict):
        modalities.append("audio")
    card["input_modalities"] = modalities
    return card

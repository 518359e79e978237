"""Filesystem and hub work of a download (docs/models-and-downloads.md).

Every function here runs in an executor.

hf writes partial files under `<target>/.cache/huggingface/download/` in 10 MiB steps and keeps
its bookkeeping in `<target>/.cache`: progress counts the payload plus the partials; the model's
size counts the payload only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vllm_use.errors import InvalidArguments
from vllm_use.logbuffer import LogBuffer
from vllm_use.models.files import directory_size, real_model_dir

log = logging.getLogger(__name__)


def prepare_target(root: Path, target: Path) -> None:
    """Refuse a root or target that is a symlink or not a directory; create the target 0700."""
    if os.path.islink(root) or not root.is_dir():
        raise InvalidArguments(f"the models root {root} is not a real directory")
    if os.path.lexists(target):
        if os.path.islink(target) or not target.is_dir():
            raise InvalidArguments(
                f"{target} is a symbolic link or not a directory; refusing to download into it"
            )
        return
    os.mkdir(target, 0o700)


def verify_target(root: Path, model_id: str) -> int:
    path = real_model_dir(root, model_id)
    if Path(os.path.realpath(path)).parent != Path(os.path.realpath(root)):
        raise InvalidArguments(f"{path} resolves outside the models root")
    return payload_size(path)


def payload_size(target: Path) -> int:
    """The model's files: everything but hf's `.cache` bookkeeping."""
    total = 0
    with os.scandir(target) as entries:
        for entry in entries:
            if entry.name == ".cache":
                continue
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
            elif entry.is_dir(follow_symlinks=False):
                total += directory_size(Path(entry.path))
    return total


def partials(target: Path) -> list[str]:
    """hf's partial files (`.cache/huggingface/download/**/*.incomplete`), written in 10 MiB steps."""
    partials = target / ".cache" / "huggingface" / "download"
    if os.path.islink(partials) or not partials.is_dir():
        return []
    return [
        os.path.join(dirpath, name)
        for dirpath, _dirs, files in os.walk(partials, followlinks=False)
        for name in files
        if name.endswith(".incomplete")
    ]


def partial_size(target: Path) -> int:
    total = 0
    for path in partials(target):
        try:
            total += os.lstat(path).st_size
        except OSError:
            pass  # renamed into place meanwhile: counted with the payload next time
    return total


def remove_partials(target: Path) -> None:
    for path in partials(target):
        try:
            os.unlink(path)
        except OSError:
            pass


def measure(target: Path) -> int:
    try:
        return payload_size(target) + partial_size(target)
    except OSError:
        return 0


def hub_total(repository: str, revision: str, token: str | None) -> int | None:
    """Total bytes from the hub's file list (HF_ENDPOINT honoured); None if it can't be read."""
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repository, revision=revision, files_metadata=True, token=token or False)
        sizes = [s.size for s in info.siblings or [] if s.size is not None]
        return sum(sizes) if sizes else None
    except Exception as exc:  # any hub failure only costs us the total
        log.info("hub file list for %s@%s unavailable: %s", repository, revision, type(exc).__name__)
        return None


def free_bytes(path: Path) -> int:
    """What an unprivileged writer may still put on `path`'s filesystem (statvfs `f_bavail`)."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def disk_shortfall(root: Path, target: Path, total: int) -> str | None:
    """Why `total` bytes from the hub won't fit under `root`, or None if they do.

    What `target` already holds (a retry's finished files, which hf skips) is not needed again.
    """
    needed = max(total - measure(target), 0)
    free = free_bytes(root)
    if needed <= free:
        return None
    return f"not enough disk space: needs {human_size(needed)}, {human_size(free)} free in {root}"


def human_size(size: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def write_log(path: Path, buffer: LogBuffer) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        buffer.write_to(f)


def read_log(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return f.read(8 * 1024 * 1024)

"""How the file tools stay inside --tools-root (docs/tools.md, "File tools").

Every path a tool receives is relative to the root. It is checked as text first, then resolved by
walking from a descriptor of the root, one component at a time, each opened with `O_NOFOLLOW`
relative to the descriptor of the one before (`dir_fd`). There is no realpath-then-open: a
component swapped for a symlink in the middle of a call makes the open fail instead of leading out.

The rules, and why:
- Absolute paths, `..` components and NUL are refused before anything is opened: they name
  something outside the root, or nothing at all.
- Any component that is a symbolic link is refused, even one that points inside the root. A link
  that is never followed cannot lead out, and there is no target to check and re-check.
- Only directories and regular files are used. The last component is `lstat`-ed (a device node or
  a FIFO is never opened), then opened with `O_NOFOLLOW | O_NONBLOCK` (a FIFO swapped in after the
  check cannot hang the call) and its `fstat` must be the same regular file.
- Walks (list_files, file_glob_search, grep_search) never descend into a symlinked directory, skip
  everything that is not a directory or a regular file, and stop MAX_DEPTH levels down.
- Writes go to a new file in the same directory, then `os.replace` through the directory's
  descriptor: a reader sees the old content or the new one, and a symlink at the target is
  refused, never written through.
- Messages name the path as the caller gave it, never the absolute root.

Everything here is synchronous and runs in a worker thread or the grep_search child process,
never on the IOLoop.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from vllm_use.tools.base import ToolError

FILE_MAX_BYTES = 1024 * 1024  # read_file, grep_search and edit_file handle files up to this size
MAX_DEPTH = 64  # walks list entries at most this many levels below where they start
FILE_MODE = 0o644  # files written by write_file
DIR_MODE = 0o755  # directories write_file creates on the way

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Stopped(Exception):
    """The call was cancelled (its time limit passed or the client left); the walk stops."""


class Entry(NamedTuple):
    """One entry a walk found. `dir_fd` and `name` open it, and are valid only until the walk
    moves on; `descended` is False for a directory at MAX_DEPTH, whose content is not walked."""

    path: str  # relative to the root, "/"-separated; directories end with "/"
    is_dir: bool
    size: int
    dir_fd: int
    name: str
    descended: bool = True


def split(path: str, *, what: str = "path") -> list[str]:
    """The components of a relative path, with "" and "." dropped ("." alone is the root).

    Refuses an absolute path, `..`, NUL; the message names `path` as given."""
    if not isinstance(path, str):
        raise ToolError(f"{what} must be a string")
    if "\0" in path:
        raise ToolError(f"{what} {path!r} contains a NUL character")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate no file name can hold
        raise ToolError(f"{what} {path!r} is not valid Unicode") from None
    if path.startswith("/"):
        raise ToolError(f"{what} {path!r} is absolute; give a path relative to the tools root")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ToolError(f"{what} {path!r} contains '..'; paths stay inside the tools root")
    return parts


def file_parts(path: str) -> list[str]:
    """`split` for a path that must name a file: not empty, not the root, no trailing "/"."""
    parts = split(path)
    if not parts or path.endswith("/"):
        raise ToolError(f"path {path!r} does not name a file")
    return parts


def open_root(root: Path) -> int:
    """A descriptor of the tools root (the caller checked it is a real directory)."""
    try:
        return os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise ToolError(f"the tools root cannot be opened: {exc.strerror}") from None


def _where(given: str, name: str) -> str:
    """The path as given, and the component at fault when that is not the whole path."""
    return f"{given!r}" if given.strip("/") == name else f"{given!r}: {name!r}"


def _refusal(dir_fd: int, name: str, given: str, exc: OSError) -> ToolError:
    """Why `name` (in `dir_fd`) could not be opened, in words that name the path as given."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return ToolError(f"{_where(given, name)} is a symbolic link; the file tools never follow links")
    if exc.errno == errno.ENOENT or st is None:
        return ToolError(f"{given!r} does not exist")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"{_where(given, name)} is not a directory")
    return ToolError(f"{given!r} cannot be opened: {exc.strerror}")


def _open_dir_at(dir_fd: int, name: str, given: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(dir_fd, name, given, exc) from None


def open_dir(root_fd: int, parts: list[str], given: str, *, create: bool = False) -> int:
    """A new descriptor of the directory `parts` names (the root itself for []), opened one
    component at a time without following links; `create` makes missing ones (mode 0755)."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass  # it exists: opening it below decides whether it is a usable directory
                except OSError as exc:
                    raise _refusal(fd, name, given, exc) from None
            child = _open_dir_at(fd, name, given)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_entry(dir_fd: int, name: str, given: str) -> tuple[int, os.stat_result]:
    """Open `name` in `dir_fd` if it is a directory or a regular file; refuse anything else."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise _refusal(dir_fd, name, given, exc) from None
    if stat.S_ISLNK(before.st_mode):
        raise ToolError(f"{_where(given, name)} is a symbolic link; the file tools never follow links")
    if not (stat.S_ISREG(before.st_mode) or stat.S_ISDIR(before.st_mode)):
        raise ToolError(f"{given!r} is not a regular file (a device, FIFO or socket)")
    flags = _DIR_FLAGS if stat.S_ISDIR(before.st_mode) else _FILE_FLAGS
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(dir_fd, name, given, exc) from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)) != (
        before.st_dev,
        before.st_ino,
        stat.S_IFMT(before.st_mode),
    ):
        os.close(fd)
        raise ToolError(f"{given!r} changed while it was being opened; try again")
    return fd, st


def open_path(root_fd: int, parts: list[str], given: str) -> tuple[int, os.stat_result]:
    """Open the directory or regular file `parts` names (the root for [])."""
    if not parts:
        fd = os.dup(root_fd)
        return fd, os.fstat(fd)
    parent = open_dir(root_fd, parts[:-1], given)
    try:
        return open_entry(parent, parts[-1], given)
    finally:
        os.close(parent)


def read_text(fd: int, given: str) -> str:
    """The content of the open regular file `fd` as text: at most FILE_MAX_BYTES, UTF-8, no NUL."""
    limit = FILE_MAX_BYTES
    if os.fstat(fd).st_size > limit:
        raise ToolError(f"{given!r} is larger than 1 MiB ({limit} bytes)")
    chunks: list[bytes] = []
    total = 0
    while total <= limit:  # one byte past the limit catches a file that grew after fstat
        chunk = os.read(fd, limit + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise ToolError(f"{given!r} is larger than 1 MiB ({limit} bytes)")
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{given!r} is not a text file (it is not valid UTF-8)") from None
    if "\0" in text:
        raise ToolError(f"{given!r} is not a text file (it contains NUL bytes)")
    return text


def lines(text: str) -> list[str]:
    """The lines of `text`, each with its "\\n"; the one rule for line numbers in every tool."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def write_atomic(
    dir_fd: int,
    name: str,
    data: bytes,
    given: str,
    *,
    mode: int = FILE_MODE,
    expect: os.stat_result | None = None,
) -> None:
    """Replace (or create) the regular file `name` in `dir_fd` with `data`, atomically.

    Refuses a target that is a symlink or not a regular file. With `expect` (what the caller read),
    also refuses when the file changed since, so an edit never overwrites someone else's write."""
    current = _lstat_or_none(dir_fd, name)
    _check_target(current, name, given, expect)
    temp = f".vllm-use-{secrets.token_hex(8)}.tmp"  # hidden, and short whatever `name` is
    fd = os.open(temp, _NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not decide the mode
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        _check_target(_lstat_or_none(dir_fd, name), name, given, expect)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass  # nothing left to clean, or the directory went away with it
        raise
    os.fsync(dir_fd)


def _lstat_or_none(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_target(
    current: os.stat_result | None, name: str, given: str, expect: os.stat_result | None
) -> None:
    if current is not None and stat.S_ISLNK(current.st_mode):
        raise ToolError(f"{_where(given, name)} is a symbolic link; the file tools never follow links")
    if current is not None and not stat.S_ISREG(current.st_mode):
        raise ToolError(f"{given!r} exists and is not a regular file")
    if expect is not None and (
        current is None
        or (current.st_ino, current.st_size, current.st_mtime_ns)
        != (expect.st_ino, expect.st_size, expect.st_mtime_ns)
    ):
        raise ToolError(f"{given!r} changed while it was being edited; read it again")


def walk(
    dir_fd: int, prefix: str, stopped: Callable[[], bool], max_depth: int = MAX_DEPTH, depth: int = 1
) -> Iterator[Entry]:
    """The directories and regular files under `dir_fd`, sorted, depth first, at most `max_depth`
    levels down; `prefix` is the directory's path ("" or ending with "/"). Symlinks and other
    files are skipped; `stopped()` is asked before each entry: when it answers True, Stopped."""
    with os.scandir(dir_fd) as listing:
        found = sorted(listing, key=lambda entry: entry.name)
    for entry in found:
        if stopped():
            raise Stopped
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone since the listing
        path = prefix + entry.name
        if stat.S_ISREG(st.st_mode):
            yield Entry(path, False, st.st_size, dir_fd, entry.name)
        elif stat.S_ISDIR(st.st_mode):
            if depth >= max_depth:
                yield Entry(path + "/", True, 0, dir_fd, entry.name, descended=False)
                continue
            yield Entry(path + "/", True, 0, dir_fd, entry.name)
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # swapped for a link or removed since the listing: not ours to follow
            try:
                if os.fstat(child).st_ino == st.st_ino:
                    yield from walk(child, path + "/", stopped, max_depth, depth + 1)
            finally:
                os.close(child)

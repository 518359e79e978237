"""Filesystem safety for the paths vllm-use owns: the data dir, the SQLite file, the admin token.

Everything here is synchronous and runs at start-up, before the listener opens (docs/architecture.md,
"Storage"; docs/auth.md, "The admin token"), so a refusal becomes a `ConfigError` naming the option
and the process exits without serving.

The rules, and why:
- Never follow a symlink we are about to trust or chmod. Each path is `lstat`-ed, then opened
  with `O_NOFOLLOW`, and the descriptor's `fstat` must match the `lstat` (same device and inode);
  permissions are tightened through that descriptor (`fchmod`), so a path swapped between the
  check and the change can never redirect the chmod onto someone else's file or directory.
- Directories end up 0700 and files 0600; looser modes are tightened with a warning that names
  the path only.
- Secrets are created with an exclusive atomic create and read back with size, character and
  length checks. Error and log messages name the path, never the content.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from vllm_use.errors import ConfigError

log = logging.getLogger(__name__)

# A token file larger than this is not something we wrote; refuse before reading it.
MAX_SECRET_FILE_BYTES = 4096

# O_NONBLOCK: if a FIFO is swapped in after the lstat check, open() must not hang start-up;
# the identity check then refuses it. O_CLOEXEC: children (vllm, hf) must not inherit the fd.
_OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _absolute(path: Path) -> Path:
    # abspath, not resolve(): resolving would follow the very symlinks we want to refuse.
    return Path(os.path.abspath(os.fspath(path)))


def _lstat(path: Path, *, option: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(option, f"cannot inspect {path}: {exc.strerror}") from exc


def _open_checked(path: Path, flags: int, expected: os.stat_result, *, option: str, kind: str) -> int:
    """Open `path` without following links and prove it is the object `expected` describes."""
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        # ELOOP here means a symlink appeared after the lstat check.
        raise ConfigError(option, f"cannot open {kind} {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(option, f"cannot inspect {kind} {path}: {exc.strerror}") from exc
    if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino):
        os.close(fd)
        raise ConfigError(option, f"{path} changed while it was being checked; refusing to use it")
    return fd


def _tighten(fd: int, path: Path, current_mode: int, wanted: int, *, option: str, kind: str) -> None:
    """fchmod the open descriptor to `wanted` when the current mode grants anything more."""
    mode = stat.S_IMODE(current_mode)
    if not mode & ~wanted:
        return
    try:
        os.fchmod(fd, wanted)
    except OSError as exc:
        raise ConfigError(
            option,
            f"{kind} {path} has mode {mode:04o} and cannot be tightened to {wanted:04o}: {exc.strerror}",
        ) from exc
    log.warning("tightened permissions of %s from %04o to %04o", path, mode, wanted)


def _refuse_unless(st: os.stat_result, path: Path, *, option: str, want_dir: bool) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(option, f"{path} is a symbolic link; refusing to follow it (use the real path)")
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise ConfigError(option, f"{path} exists but is not a directory")
    if not want_dir and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ConfigError(option, f"{path} is {kind}; expected a regular file")


def secure_dir(path: Path, *, option: str, create: bool = True) -> Path:
    """Make sure `path` is a real directory of ours with mode 0700, creating it if asked.

    Returns the absolute path. Missing parents are created with default permissions; the final
    directory itself is created 0700. Refuses symlinks and non-directories.
    """
    path = _absolute(path)
    st = _lstat(path, option=option)
    if st is None:
        if not create:
            raise ConfigError(option, f"directory {path} does not exist")
        try:
            os.makedirs(path.parent, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # someone created it concurrently; the checks below decide whether it is acceptable
        except OSError as exc:
            raise ConfigError(option, f"cannot create directory {path}: {exc.strerror}") from exc
        st = _lstat(path, option=option)
        if st is None:
            raise ConfigError(option, f"directory {path} disappeared while it was being created")
    _refuse_unless(st, path, option=option, want_dir=True)
    fd = _open_checked(path, _OPEN_DIR_FLAGS, st, option=option, kind="directory")
    try:
        _tighten(fd, path, st.st_mode, 0o700, option=option, kind="directory")
    finally:
        os.close(fd)
    return path


def secure_file(path: Path, *, option: str, mode: int = 0o600) -> None:
    """Check that an existing `path` is a regular file (not a symlink) and tighten it to `mode`."""
    path = _absolute(path)
    st = _lstat(path, option=option)
    if st is None:
        raise ConfigError(option, f"file {path} does not exist")
    _refuse_unless(st, path, option=option, want_dir=False)
    fd = _open_checked(path, _OPEN_FILE_FLAGS, st, option=option, kind="file")
    try:
        _tighten(fd, path, st.st_mode, mode, option=option, kind="file")
    finally:
        os.close(fd)


def _check_secret_text(text: str, path: Path, *, option: str, min_len: int, max_len: int) -> None:
    # Messages describe the problem and the path only: the text may be (part of) a credential.
    if any(ord(ch) < 0x20 or ord(ch) >= 0x7F for ch in text):
        raise ConfigError(option, f"secret file {path} contains control or non-ASCII characters")
    if not min_len <= len(text) <= max_len:
        raise ConfigError(
            option, f"secret file {path} holds {len(text)} characters; expected {min_len} to {max_len}"
        )


def create_secret_file(path: Path, secret: str, *, option: str) -> None:
    """Atomically create `path` (mode 0600) holding `secret` and a newline; refuse if it exists.

    `O_EXCL | O_NOFOLLOW` means an existing file or a (dangling) symlink planted at the path makes
    this fail instead of writing our secret somewhere we did not choose.
    """
    path = _absolute(path)
    _check_secret_text(secret, path, option=option, min_len=1, max_len=MAX_SECRET_FILE_BYTES - 1)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        raise ConfigError(option, f"{path} already exists; refusing to overwrite it") from exc
    except OSError as exc:
        raise ConfigError(option, f"cannot create secret file {path}: {exc.strerror}") from exc
    try:
        data = (secret + "\n").encode("ascii")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        # A half-written token file would be refused on the next start; remove what we created.
        try:
            os.unlink(path)
        except OSError:
            log.warning("could not remove partially written %s", path)
        raise ConfigError(option, f"cannot write secret file {path}: {exc.strerror}") from exc
    os.close(fd)


def read_secret_file(path: Path, *, option: str, min_len: int = 16, max_len: int = 512) -> str:
    """Read a secret we (or the operator) stored in `path`, refusing anything abnormal.

    Refuses symlinks, directories and other non-regular files, files over 4096 bytes, control or
    non-ASCII characters and a length outside [min_len, max_len]. One trailing newline ("\\n" or
    "\\r\\n") is stripped. Looser permissions are tightened to 0600 with a warning.
    """
    path = _absolute(path)
    st = _lstat(path, option=option)
    if st is None:
        raise ConfigError(option, f"secret file {path} does not exist")
    _refuse_unless(st, path, option=option, want_dir=False)
    fd = _open_checked(path, _OPEN_FILE_FLAGS, st, option=option, kind="secret file")
    try:
        if st.st_size > MAX_SECRET_FILE_BYTES:
            raise ConfigError(option, f"secret file {path} is larger than {MAX_SECRET_FILE_BYTES} bytes")
        _tighten(fd, path, st.st_mode, 0o600, option=option, kind="secret file")
        chunks: list[bytes] = []
        total = 0
        # Read one byte past the limit so a file that grew after fstat is still caught.
        while total <= MAX_SECRET_FILE_BYTES:
            try:
                chunk = os.read(fd, MAX_SECRET_FILE_BYTES + 1 - total)
            except OSError as exc:
                raise ConfigError(option, f"cannot read secret file {path}: {exc.strerror}") from exc
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > MAX_SECRET_FILE_BYTES:
        raise ConfigError(option, f"secret file {path} is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        text = b"".join(chunks).decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(option, f"secret file {path} contains control or non-ASCII characters") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    _check_secret_text(text, path, option=option, min_len=min_len, max_len=max_len)
    return text


def read_operator_file(path: Path, *, option: str, max_bytes: int) -> bytes:
    """Read a configuration file the operator wrote (and may keep secrets in), refusing what
    someone else could have changed: a symlink, a non-regular file, a file over `max_bytes`, a file
    owned by another user than ours or root, or one writable by group or others (refused, never
    tightened: the file is the operator's, and a file others could write is already suspect).
    """
    path = _absolute(path)
    st = _lstat(path, option=option)
    if st is None:
        raise ConfigError(option, f"file {path} does not exist")
    _refuse_unless(st, path, option=option, want_dir=False)
    fd = _open_checked(path, _OPEN_FILE_FLAGS, st, option=option, kind="file")
    try:
        if st.st_uid not in (os.geteuid(), 0):
            raise ConfigError(
                option, f"{path} belongs to another user (uid {st.st_uid}); refusing to trust it"
            )
        if stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                option,
                f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); chmod go-w it",
            )
        if st.st_size > max_bytes:
            raise ConfigError(option, f"{path} is larger than {max_bytes} bytes")
        # Read one byte past the limit so a file that grew after fstat is still caught.
        data = b""
        while len(data) <= max_bytes:
            try:
                chunk = os.read(fd, max_bytes + 1 - len(data))
            except OSError as exc:
                raise ConfigError(option, f"cannot read {path}: {exc.strerror}") from exc
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(option, f"{path} is larger than {max_bytes} bytes")
    return data

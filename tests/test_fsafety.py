"""Filesystem safety of the data dir and secret files (docs/architecture.md, "Storage"; docs/auth.md,
"The admin token")."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from vllm_use.errors import ConfigError
from vllm_use.fsafety import create_secret_file, read_secret_file, secure_dir, secure_file

SECRET = "s3cr3t-Token-value-ABCDEFGH"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- secure_dir ---------------------------------------------------------------------------------


def test_missing_data_dir_is_created_0700_with_its_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "data"
    result = secure_dir(target, option="--data-dir")
    assert result == target
    assert target.is_dir()
    assert mode_of(target) == 0o700


def test_loose_data_dir_is_tightened_to_0700(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "data"
    target.mkdir()
    target.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        secure_dir(target, option="--data-dir")
    assert mode_of(target) == 0o700
    assert str(target) in caplog.text


def test_symlinked_data_dir_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "someone-elses"
    real.mkdir()
    real.chmod(0o755)
    link = tmp_path / "data"
    link.symlink_to(real)
    with pytest.raises(ConfigError) as info:
        secure_dir(link, option="--data-dir")
    assert info.value.option == "--data-dir"
    assert "symbolic link" in str(info.value)
    assert str(link) in str(info.value)
    assert mode_of(real) == 0o755


def test_file_at_data_dir_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "data"
    target.write_text("not a directory")
    with pytest.raises(ConfigError, match="not a directory") as info:
        secure_dir(target, option="--models-dir")
    assert info.value.option == "--models-dir"


def test_missing_dir_is_refused_when_creation_is_not_allowed(tmp_path: Path) -> None:
    target = tmp_path / "hf-cache"
    with pytest.raises(ConfigError, match="does not exist"):
        secure_dir(target, option="--hf-cache-dir", create=False)
    assert not target.exists()


def test_relative_dir_is_returned_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert secure_dir(Path("rel"), option="--data-dir") == tmp_path / "rel"


# -- secure_file --------------------------------------------------------------------------------


def test_loose_file_is_tightened_to_0600(tmp_path: Path) -> None:
    target = tmp_path / "vllm-use.db"
    target.write_bytes(b"")
    target.chmod(0o644)
    secure_file(target, option="--data-dir")
    assert mode_of(target) == 0o600


def test_stricter_file_mode_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "vllm-use.db"
    target.write_bytes(b"")
    target.chmod(0o400)
    secure_file(target, option="--data-dir")
    assert mode_of(target) == 0o400


def test_symlinked_file_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"")
    real.chmod(0o644)
    link = tmp_path / "vllm-use.db"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        secure_file(link, option="--data-dir")
    assert mode_of(real) == 0o644


def test_fifo_at_file_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "vllm-use.db"
    os.mkfifo(target)
    with pytest.raises(ConfigError, match="not a regular file"):
        secure_file(target, option="--data-dir")


# -- create_secret_file ---------------------------------------------------------------------------


def test_secret_file_is_created_0600_with_the_secret_and_a_newline(tmp_path: Path) -> None:
    target = tmp_path / "admin-token"
    create_secret_file(target, SECRET, option="--admin-token")
    assert mode_of(target) == 0o600
    assert target.read_text() == SECRET + "\n"
    assert read_secret_file(target, option="--admin-token") == SECRET


def test_secret_file_creation_refuses_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "admin-token"
    target.write_text("operator's own content\n")
    with pytest.raises(ConfigError, match="already exists") as info:
        create_secret_file(target, SECRET, option="--admin-token")
    assert SECRET not in str(info.value)
    assert target.read_text() == "operator's own content\n"


def test_secret_file_creation_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    target = tmp_path / "admin-token"
    target.symlink_to(elsewhere)
    with pytest.raises(ConfigError) as info:
        create_secret_file(target, SECRET, option="--admin-token")
    assert SECRET not in str(info.value)
    assert not elsewhere.exists()


# -- read_secret_file -----------------------------------------------------------------------------


def write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_reading_strips_exactly_one_trailing_newline(tmp_path: Path) -> None:
    assert read_secret_file(write(tmp_path / "lf", SECRET.encode() + b"\n"), option="x") == SECRET
    assert read_secret_file(write(tmp_path / "crlf", SECRET.encode() + b"\r\n"), option="x") == SECRET
    assert read_secret_file(write(tmp_path / "bare", SECRET.encode()), option="x") == SECRET
    with pytest.raises(ConfigError, match="control"):
        read_secret_file(write(tmp_path / "two", SECRET.encode() + b"\n\n"), option="x")


def test_reading_refuses_a_symlink(tmp_path: Path) -> None:
    real = write(tmp_path / "real", SECRET.encode())
    link = tmp_path / "admin-token"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link") as info:
        read_secret_file(link, option="--admin-token")
    assert SECRET not in str(info.value)


def test_reading_refuses_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "admin-token"
    target.mkdir()
    with pytest.raises(ConfigError, match="directory"):
        read_secret_file(target, option="--admin-token")


def test_reading_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    target = tmp_path / "admin-token"
    os.mkfifo(target)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret_file(target, option="--admin-token")


@pytest.mark.parametrize(
    "content",
    [
        SECRET[:10].encode() + b"\x00" + SECRET[10:].encode(),
        SECRET[:10].encode() + b"\x1b[2J" + SECRET[10:].encode(),
        SECRET.encode() + b"\x7f",
        SECRET.encode() + b"\t",
        SECRET.encode() + "é".encode(),
        b"\xff" + SECRET.encode(),
    ],
)
def test_reading_refuses_control_and_non_ascii_characters_without_echoing_them(
    tmp_path: Path, content: bytes
) -> None:
    target = write(tmp_path / "admin-token", content)
    with pytest.raises(ConfigError, match="control or non-ASCII") as info:
        read_secret_file(target, option="--admin-token")
    assert SECRET[:10] not in str(info.value)
    assert info.value.__cause__ is None or SECRET[:10] not in str(info.value.__cause__)


def test_reading_refuses_too_short_content(tmp_path: Path) -> None:
    target = write(tmp_path / "admin-token", b"a" * 15 + b"\n")
    with pytest.raises(ConfigError, match="15 characters"):
        read_secret_file(target, option="--admin-token")
    assert read_secret_file(write(target, b"a" * 16 + b"\n"), option="--admin-token") == "a" * 16


def test_reading_refuses_too_long_content(tmp_path: Path) -> None:
    target = write(tmp_path / "admin-token", b"b" * 513)
    with pytest.raises(ConfigError, match="513 characters") as info:
        read_secret_file(target, option="--admin-token")
    assert "bbbb" not in str(info.value)
    assert read_secret_file(write(target, b"b" * 512), option="--admin-token") == "b" * 512


def test_reading_refuses_an_oversized_file(tmp_path: Path) -> None:
    target = write(tmp_path / "admin-token", b"c" * 4097)
    with pytest.raises(ConfigError, match="larger than 4096 bytes"):
        read_secret_file(target, option="--admin-token", max_len=10_000)


def test_reading_tightens_0644_to_0600_without_logging_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = write(tmp_path / "admin-token", SECRET.encode() + b"\n", mode=0o644)
    with caplog.at_level(logging.DEBUG):
        assert read_secret_file(target, option="--admin-token") == SECRET
    assert mode_of(target) == 0o600
    assert str(target) in caplog.text
    assert SECRET not in caplog.text


def test_reading_a_missing_file_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "admin-token"
    with pytest.raises(ConfigError, match="does not exist") as info:
        read_secret_file(target, option="--admin-token")
    assert str(target) in str(info.value)

"""Start-up safety of the real `vllm-use serve` (docs/architecture.md, "Start-up and shutdown" and
"Storage"; docs/auth.md, "The admin token"): what it refuses, tightens and creates.

tests/test_fsafety.py and tests/test_storage.py cover the functions one by one; these tests check
that a start wires them in: the refusal reaches the operator as exit status 2 with a message naming
the option, nothing listens, and a refused file is left exactly as it was.
"""

from __future__ import annotations

import http.server
import os
import resource
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import REPO
from tests.support.server import ADMIN_TOKEN, Server, eventually, free_port, start_server

FILE_TOKEN = "file-admin-token-0123456789abcdefXYZ"


def run_refused(data_dir: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """Start a server that must refuse; return its stderr after checking it never listened."""
    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    child_env.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "vllm_use", "serve", "--port", str(port), "--data-dir", str(data_dir), *flags],
        env=child_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "listening" not in output
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return result.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def make_data_dir(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    return data_dir


def write_token_file(data_dir: Path, text: str, file_mode: int = 0o600) -> Path:
    path = data_dir / "admin-token"
    path.write_text(text)
    path.chmod(file_mode)
    return path


def system_status(server: Server, token: str | None) -> int:
    return server.fetch("/api/system", token=token).status_code


# --- data dir and database ----------------------------------------------------------------------


def test_symlinked_data_dir_refuses_to_start(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "data"
    link.symlink_to(real)
    stderr = run_refused(link, env={"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert "--data-dir" in stderr
    assert "symbolic link" in stderr or "symlink" in stderr
    # Nothing was created or chmod-ed through the link.
    assert list(real.iterdir()) == []
    assert mode(real) == 0o755


def test_symlinked_database_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    target.chmod(0o644)
    (data_dir / "vllm-use.db").symlink_to(target)
    stderr = run_refused(data_dir, env={"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert "--data-dir" in stderr
    assert "symbolic link" in stderr or "symlink" in stderr
    assert target.read_bytes() == b""
    assert mode(target) == 0o644


def test_newer_schema_database_refuses_to_start_and_stays_byte_identical(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    db_path = data_dir / "vllm-use.db"
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE future (x INTEGER)")
    conn.execute("INSERT INTO future VALUES (42)")
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    db_path.chmod(0o600)
    before = db_path.read_bytes()
    stderr = run_refused(data_dir, env={"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert "--data-dir" in stderr
    assert "99" in stderr and "newer" in stderr
    assert db_path.read_bytes() == before
    assert not (data_dir / "vllm-use.db-wal").exists()


def test_loose_data_dir_models_dir_and_database_are_tightened(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_server(data_dir)
    assert first.stop() == 0
    db_path = data_dir / "vllm-use.db"
    data_dir.chmod(0o755)
    (data_dir / "models").chmod(0o755)
    db_path.chmod(0o644)

    server = start_server(data_dir)
    try:
        assert mode(data_dir) == 0o700
        assert mode(data_dir / "models") == 0o700
        assert mode(db_path) == 0o600
        assert system_status(server, ADMIN_TOKEN) == 200
    finally:
        assert server.stop() == 0


def test_new_data_dir_database_and_models_dir_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    child_env["VLLM_USE_ADMIN_TOKEN"] = ADMIN_TOKEN
    # start_server pre-creates the data dir; this start must create it itself.
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_use", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        env=child_env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server(f"http://127.0.0.1:{port}", data_dir, tmp_path / "unused.log", proc)
    try:

        def healthy() -> bool:
            assert proc.poll() is None, "server exited early"
            try:
                return server.fetch("/healthz", token=None).status_code == 200
            except httpx.TransportError:
                return False

        eventually(healthy, timeout=20)
        assert mode(data_dir) == 0o700
        assert mode(data_dir / "models") == 0o700
        assert mode(data_dir / "vllm-use.db") == 0o600
    finally:
        assert server.stop() == 0


# --- bootstrap admin token ----------------------------------------------------------------------


def test_bootstrap_admin_token_is_created_private_and_only_its_path_is_logged(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir, admin_token=None)
    try:
        token_path = data_dir / "admin-token"
        assert token_path.is_file() and not token_path.is_symlink()
        assert mode(token_path) == 0o600
        token = token_path.read_text().strip()
        assert len(token) >= 16
        assert system_status(server, token) == 200
        assert system_status(server, None) == 401
        log = server.log()
        assert str(token_path) in log
        assert token not in log
    finally:
        assert server.stop() == 0
    assert token not in server.log()


def test_second_start_reuses_the_bootstrap_admin_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_server(data_dir, admin_token=None)
    token = (data_dir / "admin-token").read_text().strip()
    assert first.stop() == 0
    second = start_server(data_dir, admin_token=None)
    try:
        assert (data_dir / "admin-token").read_text().strip() == token
        assert system_status(second, token) == 200
    finally:
        assert second.stop() == 0
    assert token not in second.log()


def test_operator_written_token_file_is_used(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    write_token_file(data_dir, FILE_TOKEN + "\n")
    server = start_server(data_dir, admin_token=None)
    try:
        assert system_status(server, FILE_TOKEN) == 200
        assert FILE_TOKEN not in server.log()
    finally:
        assert server.stop() == 0


def test_symlink_at_admin_token_path_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    target = tmp_path / "stolen-token"
    target.write_text(FILE_TOKEN + "\n")
    target.chmod(0o644)
    (data_dir / "admin-token").symlink_to(target)
    stderr = run_refused(data_dir)
    assert "admin-token" in stderr
    assert "symbolic link" in stderr or "symlink" in stderr
    assert FILE_TOKEN not in stderr
    assert target.read_text() == FILE_TOKEN + "\n"
    assert mode(target) == 0o644


def test_dangling_symlink_at_admin_token_path_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    target = tmp_path / "would-be-written"
    (data_dir / "admin-token").symlink_to(target)
    stderr = run_refused(data_dir)
    assert "admin-token" in stderr
    assert not target.exists()


def test_directory_at_admin_token_path_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    (data_dir / "admin-token").mkdir()
    stderr = run_refused(data_dir)
    assert "admin-token" in stderr
    assert "directory" in stderr


def test_loose_admin_token_file_is_tightened_and_still_works(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    token_path = write_token_file(data_dir, FILE_TOKEN + "\n", 0o644)
    server = start_server(data_dir, admin_token=None)
    try:
        assert mode(token_path) == 0o600
        assert system_status(server, FILE_TOKEN) == 200
        assert FILE_TOKEN not in server.log()
    finally:
        assert server.stop() == 0


def test_admin_token_file_with_a_control_character_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    secret = "ctrl-token-0123456789\x07abcdef"
    write_token_file(data_dir, secret + "\n")
    stderr = run_refused(data_dir)
    assert "admin-token" in stderr
    assert "ctrl-token" not in stderr
    assert (data_dir / "admin-token").read_text() == secret + "\n"


def test_too_short_admin_token_file_refuses_to_start(tmp_path: Path) -> None:
    data_dir = make_data_dir(tmp_path)
    write_token_file(data_dir, "short-tok\n")
    stderr = run_refused(data_dir)
    assert "admin-token" in stderr
    assert "short-tok" not in stderr


def test_configured_admin_token_never_appears_in_the_server_log(tmp_path: Path) -> None:
    wrong = ADMIN_TOKEN[:-4] + "zzzz"
    server = start_server(tmp_path / "data", env={"VLLM_USE_LOG_LEVEL": "debug"})
    try:
        assert system_status(server, ADMIN_TOKEN) == 200
        assert server.fetch("/api/keys").status_code == 200
        assert system_status(server, wrong) == 401
        assert server.fetch("/api/nope").status_code == 404
        _key_id, secret = server.create_key("admin.read", name="log check")
        assert system_status(server, secret) == 200
        assert server.fetch("/api/keys", token=secret).status_code == 200
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "listening" in log  # the log really was captured
    assert ADMIN_TOKEN not in log
    assert ADMIN_TOKEN[:12] not in log
    assert wrong not in log
    assert secret not in log
    # No admin token file is created when one is configured.
    assert not (tmp_path / "data" / "admin-token").exists()


# --- the connection cap and the open-file limit ---------------------------------------------------


def run_with_nofile(data_dir: Path, soft: int, hard: int, *flags: str) -> subprocess.Popen[str]:
    """`vllm-use serve` with RLIMIT_NOFILE set to (soft, hard) before it starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    env.update({"VLLM_USE_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1"})
    args = ["--port", str(free_port()), "--data-dir", str(data_dir), *flags]
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_use", "serve", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )


def test_a_max_connections_the_open_file_limit_cannot_hold_refuses_to_start(tmp_path: Path) -> None:
    proc = run_with_nofile(tmp_path / "data", 256, 256, "--max-connections", "100")
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, output
    assert "--max-connections" in output and "RLIMIT_NOFILE 256" in output
    assert "listening" not in output


def test_the_open_file_soft_limit_is_raised_to_the_hard_limit_before_the_cap_is_derived(
    tmp_path: Path,
) -> None:
    proc = run_with_nofile(tmp_path / "data", 256, 2048)
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:  # ends when the server exits
            if "listening" in line:
                break
        assert "(at most 928 connections)" in line, line  # (2048 - 192 reserved) / 2
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_server_started_for_a_test_is_never_mistaken_for_another_on_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between `free_port()` and the child's bind, another process may take the port (another
    xdist worker's server did once, and a test then talked to the wrong server). Here a stranger
    that answers /healthz with 200 holds the port: the start must fail with the child's own
    refusal, never hand back a server whose port answers for someone else."""
    import tests.support.server as support

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    stranger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    monkeypatch.setattr(support, "free_port", lambda: stranger.server_address[1])
    try:
        with pytest.raises(AssertionError, match=r"cannot listen on 127\.0\.0\.1"):
            start_server(tmp_path / "data")
    finally:
        stranger.shutdown()
        stranger.server_close()

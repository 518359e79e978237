"""Shutdown (docs/architecture.md, "Start-up and shutdown"): SIGTERM/SIGINT stop the server promptly
with exit 0, persisting what it held.

Promptly by cause, not by a clock: the one wait a shutdown may make is `SHUTDOWN_GRACE_S` for open
connections, and it logs "did not close within" when it waits that out; a prompt shutdown is one
that never does. `STOP_BOUND_S` only keeps a stuck server from hanging the test.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.server import Server, start_server
from vllm_use.app import SHUTDOWN_GRACE_S

STOP_BOUND_S = 2 * SHUTDOWN_GRACE_S  # the grace, then the flushes and closes that follow it
WAITED = "did not close within"  # what the shutdown logs when it waited out its grace


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def port_of(server: Server) -> int:
    port = urlsplit(server.base_url).port
    assert port is not None
    return port


def bounded_stop(server: Server, sig: int) -> int:
    try:
        return server.stop(sig, timeout=STOP_BOUND_S)
    finally:
        if server.proc.poll() is None:  # it overran: do not leave it behind
            server.proc.kill()
            server.proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_server_with_exit_0_without_waiting_out_a_grace(tmp_path: Path, sig: int) -> None:
    server = start_server(tmp_path / "data")
    assert server.fetch("/api/system").status_code == 200
    code = bounded_stop(server, sig)
    assert code == 0, server.log()
    assert "stopped" in server.log()
    assert WAITED not in server.log()


def test_port_is_closed_after_shutdown(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    port = port_of(server)
    code = bounded_stop(server, signal.SIGTERM)
    assert code == 0, server.log()
    with socket.socket() as s:
        s.settimeout(1)
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_connections_half_sent_refused_or_over_the_cap_do_not_hold_up_shutdown(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--max-connections", "8")
    port = port_of(server)
    server.client.close()  # its kept-alive connection would take one of the 8 places
    held: list[socket.socket] = []
    try:
        for _ in range(20):  # a body announced and never sent: refused (401), lingering, or a 503
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /api/keys HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{")
            held.append(sock)
        code = bounded_stop(server, signal.SIGTERM)
        assert code == 0, server.log()
        assert WAITED not in server.log()  # none of them held the shutdown for its grace
    finally:
        for sock in held:
            sock.close()


def test_key_used_just_before_sigterm_has_its_last_use_persisted(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    key_id, secret = server.create_key("admin.read", name="last use")
    # The first use verifies the key and writes last_used_at; later uses are coalesced in memory.
    assert server.fetch("/api/system", token=secret).status_code == 200
    time.sleep(0.05)
    used_from = now_ms()
    assert server.fetch("/api/system", token=secret).status_code == 200
    code = bounded_stop(server, signal.SIGTERM)
    assert code == 0, server.log()

    conn = sqlite3.connect(data_dir / "vllm-use.db")
    try:
        (last_used_at,) = conn.execute("SELECT last_used_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    finally:
        conn.close()
    assert last_used_at is not None
    assert used_from <= last_used_at <= now_ms()


def test_unused_key_keeps_no_last_use_after_shutdown(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    key_id, _secret = server.create_key("admin.read", name="never used")
    code = bounded_stop(server, signal.SIGTERM)
    assert code == 0, server.log()
    conn = sqlite3.connect(data_dir / "vllm-use.db")
    try:
        (last_used_at,) = conn.execute("SELECT last_used_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    finally:
        conn.close()
    assert last_used_at is None


def test_restart_after_sigterm_serves_the_same_keys(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start_server(data_dir)
    _key_id, secret = first.create_key("admin.read", name="survives")
    code = bounded_stop(first, signal.SIGTERM)
    assert code == 0, first.log()
    second = start_server(data_dir)
    try:
        assert second.fetch("/api/system", token=secret).status_code == 200
    finally:
        assert second.stop() == 0

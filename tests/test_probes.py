"""`/livez` and `/readyz` (docs/observability.md, "Probes"), on a real `vllm-use serve` whose
deployment runs the fake vLLM: no auth, no caching, HEAD as GET; 503 with the reason while SQLite
is locked by another writer and while a `load_on_start` deployment loads, 200 once it is ready."""

from __future__ import annotations

import concurrent.futures
import sqlite3
import time
from pathlib import Path

import httpx

from tests.fakes import fake_vllm_bin
from tests.support.deployments import START_TIMEOUT_S, create, register
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.readiness import BUSY_MS

LOCKED = "database: locked by another writer"
PROBES = 40  # at once, while the database is locked


def probe(server: Server, path: str, method: str = "GET") -> httpx.Response:
    r = server.fetch(path, method, token=None)
    assert r.headers["Cache-Control"] == "no-store"
    return r


def reasons(server: Server) -> list[str] | None:
    """/readyz's reasons; None when it answers 200 ready."""
    r = probe(server, "/readyz")
    if r.status_code == 200:
        assert r.json() == {"status": "ready"}
        return None
    assert r.status_code == 503 and r.json()["status"] == "not_ready", r.text
    return r.json()["reasons"]


def assert_live(server: Server) -> None:
    r = probe(server, "/livez")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_names_a_locked_database_and_a_probe_flood_queues_one_check(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    lock = sqlite3.connect(server.data_dir / "vllm-use.db", isolation_level=None, timeout=0)
    try:
        lock.execute("BEGIN IMMEDIATE")  # another writer holds the write lock: nothing else can write
        url = server.base_url + "/readyz"
        with httpx.Client(timeout=30, trust_env=False) as client:
            with concurrent.futures.ThreadPoolExecutor(PROBES) as pool:
                answers = list(pool.map(lambda _: client.get(url), range(PROBES)))
        assert {r.status_code for r in answers} == {503}
        assert all(r.json() == {"status": "not_ready", "reasons": [LOCKED]} for r in answers)
        assert_live(server)
        # One check per probe would have queued PROBES writes, each waiting BUSY_MS for the lock,
        # on the one DB thread: a read would then wait behind them all.
        started = time.monotonic()
        assert server.fetch("/api/keys").status_code == 200
        assert time.monotonic() - started < PROBES * BUSY_MS / 1000 / 2
        lock.execute("ROLLBACK")
        eventually(lambda: reasons(server) is None, timeout=START_TIMEOUT_S)
        assert probe(server, "/readyz", "HEAD").status_code == 200
    finally:
        lock.close()
        server.stop()


def test_readyz_waits_for_the_load_on_start_deployment_and_livez_answers_throughout(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "loaded"  # the fake vLLM loads until this file exists
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300, load_until=gate)
    first = free_port()
    flags = ("--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}")
    server = start_server(tmp_path / "data", *flags)
    try:
        model_id = register(server, "alpha")
        for name, at_start in (("boot", True), ("later", False)):
            body = {"name": name, "model_id": model_id, "load_on_start": at_start}
            assert create(server, body).status_code == 201
        # Saved with load_on_start while running: not loaded until the next start, so not ready.
        assert reasons(server) == ["deployment boot: not ready since start (unloaded)"]
    finally:
        server.stop()

    server = start_server(tmp_path / "data", *flags)
    try:

        def state() -> str:
            return server.fetch("/api/deployments/boot").json()["instance"]["state"]

        eventually(lambda: state() == "starting", timeout=START_TIMEOUT_S)
        assert reasons(server) == ["deployment boot: starting"]
        head = probe(server, "/readyz", "HEAD")
        assert head.status_code == 503 and head.content == b""
        assert_live(server)
        assert probe(server, "/livez", "HEAD").status_code == 200

        gate.touch()
        eventually(lambda: reasons(server) is None, timeout=START_TIMEOUT_S)
        assert state() == "ready"
        assert_live(server)
        head = probe(server, "/readyz", "HEAD")
        assert head.status_code == 200 and head.content == b""
        # Unloading it later is an operator's choice, not a failure: still ready.
        r = server.fetch("/api/deployments/boot/unload", "POST", timeout=START_TIMEOUT_S)
        assert r.status_code == 200, r.text
        assert reasons(server) is None
        # A new deployment of that name, saved with load_on_start, is another one: not ready since start.
        assert server.fetch("/api/deployments/boot", "DELETE").status_code == 200
        assert reasons(server) is None
        model_id = server.fetch("/api/deployments/later").json()["model_id"]
        assert (
            create(server, {"name": "boot", "model_id": model_id, "load_on_start": True}).status_code == 201
        )
        assert reasons(server) == ["deployment boot: not ready since start (unloaded)"]
    finally:
        server.stop()

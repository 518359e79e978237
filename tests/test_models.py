"""Models (docs/models-and-downloads.md): registration rules, scan, crash-safe delete and start-up
reconciliation."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, start_app, start_server
from vllm_use import storage

# `server` and `start_app` run the Application in this process (tests/conftest.py); a server that
# must crash, and a start that must fail with an exit status, are children.
pytestmark = pytest.mark.in_process


def make_model_dir(root: Path, name: str, config: bool = True) -> Path:
    path = root / name
    path.mkdir(parents=True)
    if config:
        (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "weights.bin").write_bytes(b"w" * 1000)
    return path


def snapshot(server: Server) -> tuple[list[str], list[str]]:
    """What a bad request must not change: the model records and the models directory."""
    ids = sorted(m["id"] for m in server.fetch("/api/models").json()["models"])
    return ids, sorted(os.listdir(server.data_dir / "models"))


def test_register_local_model_is_ready_with_size_and_path(server: Server) -> None:
    root = server.data_dir / "models"
    make_model_dir(root, "tiny")
    r = server.fetch("/api/models/local", "POST", json={"name": "Tiny", "path": "tiny"})
    assert r.status_code == 201, r.text
    model = r.json()["model"]
    assert model["status"] == "ready" and model["source"] == "local"
    assert model["path"] == str(root / "tiny")
    assert model["size_bytes"] == 1000 + len(json.dumps({"model_type": "llama"}))
    assert len(model["id"]) == 32 and model["id"] == model["id"].lower()
    assert server.fetch(f"/api/models/{model['id']}").json()["model"] == model
    again = server.fetch("/api/models/local", "POST", json={"name": "Again", "path": str(root / "tiny")})
    assert again.status_code == 409


def test_local_model_name_defaults_to_its_directory_but_an_empty_name_is_refused(server: Server) -> None:
    make_model_dir(server.data_dir / "models", "tiny")
    for name in ("", "   "):
        r = server.fetch("/api/models/local", "POST", json={"name": name, "path": "tiny"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["errors"][0]["loc"] == ["name"]
    assert server.fetch("/api/models").json()["models"] == []
    r = server.fetch("/api/models/local", "POST", json={"path": "tiny"})
    assert r.status_code == 201, r.text
    assert r.json()["model"]["name"] == "tiny"


@pytest.mark.parametrize(
    "path",
    [
        "/etc",
        ".",
        "",
        "..",
        "../data",
        "tiny/../../x",
        "missing-dir",
        "afile",
        "alink",
        "tiny/sub",
        ".hidden",
    ],
)
def test_bad_local_paths_are_refused_and_change_nothing(shared_server: Server, path: str) -> None:
    root = shared_server.data_dir / "models"
    if not (root / "tiny").exists():
        make_model_dir(root, "tiny").joinpath("sub").mkdir()
        (root / "afile").write_text("not a dir")
        (root / "alink").symlink_to(root / "tiny")
        (root / ".hidden").mkdir()
    before = snapshot(shared_server)
    r = shared_server.fetch("/api/models/local", "POST", json={"name": "x", "path": path})
    assert r.status_code == 400, (path, r.text)
    assert r.json()["error"]["errors"][0]["loc"] == ["path"]
    assert snapshot(shared_server) == before
    root_abs = shared_server.fetch("/api/models/local", "POST", json={"name": "x", "path": str(root)})
    assert root_abs.status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"repository": "../x"}, "repository"),
        ({"repository": "a/b/c"}, "repository"),
        ({"repository": "a" * 48 + "/" + "b" * 48}, "repository"),
        ({"repository": "org/na--me"}, "repository"),
        ({"repository": "org/name.git"}, "repository"),
        ({"repository": "org/nam\u00e9"}, "repository"),
        ({"repository": "org/x", "revision": "--help"}, "revision"),
        ({"repository": "org/x", "revision": "main branch"}, "revision"),
        ({"repository": "org/x", "revision": "main\x07"}, "revision"),
        ({"repository": "org/x", "revision": "r" * 256}, "revision"),
        ({"repository": "org/x", "name": "n" * 257}, "name"),
        ({"repository": "org/x", "name": "bad\nname"}, "name"),
    ],
)
def test_bad_hugging_face_coordinates_are_refused(shared_server: Server, body: dict, field: str) -> None:
    before = snapshot(shared_server)
    r = shared_server.fetch("/api/models/huggingface", "POST", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["loc"][0] == field
    assert snapshot(shared_server) == before


def test_hugging_face_bounds_pass_at_the_limit(shared_server: Server) -> None:
    repo = "a" * 47 + "/" + "b" * 48  # 96 bytes
    r = shared_server.fetch(
        "/api/models/huggingface", "POST", json={"repository": repo, "revision": "r" * 255}
    )
    assert r.status_code == 201, r.text
    model = r.json()["model"]
    assert model["status"] == "registered" and model["revision"] == "r" * 255
    assert model["name"] == repo
    assert model["path"] == str(shared_server.data_dir / "models" / model["id"])
    named = shared_server.fetch(
        "/api/models/huggingface", "POST", json={"repository": "org/x", "name": "é" * 128}
    )
    assert named.status_code == 201
    over = shared_server.fetch(
        "/api/models/huggingface", "POST", json={"repository": "org/x", "name": "é" * 128 + "a"}
    )
    assert over.status_code == 400


@pytest.mark.parametrize("bad_id", ["A" * 32, "0" * 31, "0" * 33, "..%2F..%2Fetc", "g" * 32])
def test_model_ids_are_validated_before_any_query(shared_server: Server, bad_id: str) -> None:
    for method in ("GET", "DELETE"):
        r = shared_server.fetch(f"/api/models/{bad_id}", method)
        assert r.status_code == 400, (method, bad_id, r.text)
        assert r.json()["error"]["errors"][0]["loc"] == ["id"]
    assert shared_server.fetch("/api/models/" + "0" * 32).status_code == 404


def test_scan_registers_new_model_directories_only(server: Server) -> None:
    root = server.data_dir / "models"
    make_model_dir(root, "one")
    make_model_dir(root, "two")
    make_model_dir(root, "no-config", config=False)
    (root / "link").symlink_to(root / "one")
    server.fetch("/api/models/local", "POST", json={"name": "one", "path": "one"})
    r = server.fetch("/api/models/scan", "POST")
    assert r.status_code == 200, r.text
    assert [m["path"] for m in r.json()["models"]] == [str(root / "two")]
    assert server.fetch("/api/models/scan", "POST").json() == {"models": []}


def test_delete_without_files_keeps_the_directory(server: Server) -> None:
    root = server.data_dir / "models"
    make_model_dir(root, "keep")
    model = server.fetch("/api/models/local", "POST", json={"name": "k", "path": "keep"}).json()["model"]
    assert server.fetch(f"/api/models/{model['id']}", "DELETE").json() == {"deleted": model["id"]}
    assert (root / "keep" / "config.json").exists()
    assert server.fetch(f"/api/models/{model['id']}").status_code == 404


def test_delete_with_files_removes_the_directory(server: Server) -> None:
    root = server.data_dir / "models"
    make_model_dir(root, "gone")
    model = server.fetch("/api/models/local", "POST", json={"name": "g", "path": "gone"}).json()["model"]
    r = server.fetch(f"/api/models/{model['id']}?files=true", "DELETE")
    assert r.status_code == 200, r.text
    assert not (root / "gone").exists()
    assert os.listdir(root / ".quarantine") == []
    assert server.fetch(f"/api/models/{model['id']}?files=maybe", "DELETE").status_code == 400


def _crash_during_delete(tmp_path: Path, point: str) -> tuple[Server, str, Path]:
    data = tmp_path / "data"
    root = data / "models"
    make_model_dir(root, "precious")
    server = start_app(data)
    model = server.fetch("/api/models/local", "POST", json={"name": "p", "path": "precious"}).json()["model"]
    server.stop()
    crashing = start_server(data, env={"VLLM_USE_TEST_CRASH_AT": point})
    with pytest.raises(httpx.TransportError):  # the server dies mid-request, as intended
        crashing.fetch(f"/api/models/{model['id']}?files=true", "DELETE")
    assert crashing.proc.wait(10) == -signal.SIGKILL
    crashing.client.close()
    return start_app(data), model["id"], root  # in-process: recovery runs at start, as in a child


def test_crash_between_quarantine_and_commit_restores_the_model(tmp_path: Path) -> None:
    server, model_id, root = _crash_during_delete(tmp_path, "quarantined")
    try:
        assert server.fetch(f"/api/models/{model_id}").json()["model"]["status"] == "ready"
        assert (root / "precious" / "weights.bin").read_bytes() == b"w" * 1000
        assert os.listdir(root / ".quarantine") == []
    finally:
        server.stop()


def test_crash_after_commit_removes_the_quarantined_copy(tmp_path: Path) -> None:
    server, model_id, root = _crash_during_delete(tmp_path, "committed")
    try:
        assert server.fetch(f"/api/models/{model_id}").status_code == 404
        assert not (root / "precious").exists()
        assert os.listdir(root / ".quarantine") == []
    finally:
        server.stop()


def _start_fails(data: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    env["VLLM_USE_ADMIN_TOKEN"] = "test-admin-token-0123456789abcdef"
    return subprocess.run(
        [sys.executable, "-m", "vllm_use", "serve", "--port", "1", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_unknown_quarantine_content_refuses_the_start_and_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    start_app(data).stop()
    stray = data / "models" / ".quarantine" / "not-a-model-id"
    stray.mkdir(parents=True)
    (stray / "important.txt").write_text("keep me")
    result = _start_fails(data)
    assert result.returncode == 2
    assert "quarantine" in result.stderr and "not-a-model-id" in result.stderr
    assert (stray / "important.txt").read_text() == "keep me"


def test_two_records_for_one_directory_refuse_the_start_and_keep_the_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db_path = data / "vllm-use.db"
    with sqlite3.connect(db_path) as db:
        # A database from a build whose models table had no unique index on dir.
        for ddl in storage.SCHEMA_DDL:
            for statement in ddl:
                db.execute(statement.replace("CREATE UNIQUE INDEX", "CREATE INDEX"))
        db.execute(f"PRAGMA user_version = {storage.SCHEMA_VERSION}")
        for model_id in ("a" * 32, "b" * 32):
            db.execute(
                "INSERT INTO models VALUES (?, 'm', 'local', NULL, NULL, 'shared', 'ready', 1, NULL, 1, 1)",
                (model_id,),
            )
    db_path.chmod(0o600)
    result = _start_fails(data)
    assert result.returncode == 2
    assert "shared" in result.stderr and "a" * 32 in result.stderr
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT count(*) FROM models").fetchone() == (2,)


def test_a_hand_corrupted_model_row_fails_requests_closed_naming_it(server: Server) -> None:
    r = server.fetch("/api/models/huggingface", "POST", json={"repository": "org/x"})
    model_id = r.json()["model"]["id"]
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute("UPDATE models SET status = 'exploded' WHERE id = ?", (model_id,))
    for path in ("/api/models", f"/api/models/{model_id}"):
        r = server.fetch(path)
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "corrupt_record"
        assert model_id in r.json()["error"]["message"]
    assert server.fetch("/api/downloads", "POST", json={"model_id": model_id}).status_code == 500


def test_a_corrupt_model_row_stops_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_app(data)
    model_id = server.fetch("/api/models/huggingface", "POST", json={"repository": "org/x"}).json()["model"][
        "id"
    ]
    server.stop()
    with sqlite3.connect(data / "vllm-use.db") as db:
        db.execute("UPDATE models SET revision = '--help' WHERE id = ?", (model_id,))
    result = _start_fails(data)
    assert result.returncode == 2
    assert model_id in result.stderr

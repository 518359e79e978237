"""API keys (docs/auth.md): format, one-time secret, enable/disable/delete taking effect at once, corrupt
rows."""

from __future__ import annotations

import re
import sqlite3

import pytest

from tests.support.server import Server, start_app

# No test here needs a process of its own: the Application runs in this one (tests/conftest.py).
pytestmark = pytest.mark.in_process


def test_create_returns_the_secret_once_in_the_documented_shape(server: Server) -> None:
    r = server.fetch("/api/keys", "POST", json={"name": "ci", "scopes": ["admin.read", "inference"]})
    assert r.status_code == 201
    body = r.json()
    assert re.fullmatch(r"vu_[A-Za-z0-9]{48}", body["secret"])
    key = body["key"]
    assert re.fullmatch(r"[A-Za-z0-9]{24}", key["id"])
    policy = {"expires_at", "expired", "models", "rpm", "max_concurrent", "tokens_per_day"}
    assert set(key) == {"id", "name", "prefix", "scopes", "enabled", "created_at", "last_used_at", *policy}
    assert {name: key[name] for name in policy} == dict.fromkeys(policy) | {"expired": False}
    assert key["scopes"] == ["admin.read", "inference"]
    assert key["enabled"] is True and key["last_used_at"] is None
    assert body["secret"].startswith(key["prefix"])
    listed = server.fetch("/api/keys").text
    assert body["secret"] not in listed
    assert key["id"] in listed


def test_secret_is_never_logged_or_stored(server: Server) -> None:
    key_id, secret = server.create_key("admin.read")
    assert server.fetch("/api/system", token=secret).status_code == 200
    assert server.fetch("/api/keys", token=secret).status_code == 200
    server.stop()
    assert secret not in server.log()
    assert key_id in server.log()  # the executor log line names the key id
    for path in server.data_dir.iterdir():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
            assert secret[3:].encode() not in path.read_bytes(), path


def test_disable_refuses_the_very_next_request_and_enable_restores(server: Server) -> None:
    key_id, secret = server.create_key("admin.read")
    assert server.fetch("/api/system", token=secret).status_code == 200  # now cached as verified
    r = server.fetch(f"/api/keys/{key_id}/disable", "POST")
    assert r.status_code == 200 and r.json()["key"]["enabled"] is False
    assert server.fetch("/api/system", token=secret).status_code == 401
    assert server.fetch(f"/api/keys/{key_id}/enable", "POST").json()["key"]["enabled"] is True
    assert server.fetch("/api/system", token=secret).status_code == 200


def test_delete_refuses_the_very_next_request(server: Server) -> None:
    key_id, secret = server.create_key("admin.read")
    assert server.fetch("/api/system", token=secret).status_code == 200
    r = server.fetch(f"/api/keys/{key_id}", "DELETE")
    assert r.status_code == 200 and r.json() == {"deleted": key_id}
    assert server.fetch("/api/system", token=secret).status_code == 401
    assert server.fetch(f"/api/keys/{key_id}", "DELETE").status_code == 404


@pytest.mark.parametrize(
    "bad_id", ["short", "A" * 25, "A" * 23 + "-", "A" * 23 + "%C3%A9", "%27%3B--" + "A" * 16]
)
def test_malformed_key_id_is_refused_before_any_query(shared_server: Server, bad_id: str) -> None:
    for method, path in (("POST", f"/api/keys/{bad_id}/disable"), ("DELETE", f"/api/keys/{bad_id}")):
        r = shared_server.fetch(path, method)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["errors"][0]["loc"] == ["id"]


def test_unknown_but_wellformed_id_is_404(shared_server: Server) -> None:
    assert shared_server.fetch("/api/keys/" + "Z" * 24 + "/enable", "POST").status_code == 404


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a" * 128, True),
        ("a" * 129, False),
        ("é" * 64, True),
        ("é" * 64 + "a", False),
        ("", False),
        ("bad\nname", False),
        ("   ", False),
    ],
)
def test_key_name_bounds(shared_server: Server, name: str, ok: bool) -> None:
    r = shared_server.fetch("/api/keys", "POST", json={"name": name, "scopes": ["inference"]})
    assert r.status_code == (201 if ok else 400), r.text


def test_duplicate_scopes_are_refused(shared_server: Server) -> None:
    r = shared_server.fetch("/api/keys", "POST", json={"name": "d", "scopes": ["inference", "inference"]})
    assert r.status_code == 400


def test_hand_edited_unknown_scope_never_authenticates_and_is_flagged(tmp_path) -> None:
    server = start_app(tmp_path / "data")
    key_id, secret = server.create_key("admin.read")
    server.stop()
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute("UPDATE api_keys SET scopes = ? WHERE id = ?", ('["admin.read", "root"]', key_id))
    server = start_app(server.data_dir)
    try:
        assert server.fetch("/api/system", token=secret).status_code == 401
        listed = {k["id"]: k for k in server.fetch("/api/keys").json()["keys"]}
        assert listed[key_id]["usable"] is False
        assert "unknown scope" in listed[key_id]["problem"]
        assert listed[key_id]["scopes"] == []
    finally:
        server.stop()
    assert "corrupt api key record" in server.log()


def test_last_used_at_is_recorded_and_never_goes_backwards(tmp_path) -> None:
    server = start_app(tmp_path / "data")
    key_id, secret = server.create_key("admin.read")
    assert server.fetch("/api/system", token=secret).status_code == 200
    listed = {k["id"]: k for k in server.fetch("/api/keys").json()["keys"]}
    assert listed[key_id]["last_used_at"] is not None
    server.stop()
    future = 4_000_000_000_000  # year 2096, in ms
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (future, key_id))
    server = start_app(server.data_dir)
    for _ in range(3):
        assert server.fetch("/api/system", token=secret).status_code == 200
    server.stop()
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        (used,) = db.execute("SELECT last_used_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    assert used == future


def test_key_disabled_by_hand_in_sqlite_is_refused_after_restart(tmp_path) -> None:
    server = start_app(tmp_path / "data")
    key_id, secret = server.create_key("admin.read")
    server.stop()
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute("UPDATE api_keys SET enabled = 0 WHERE id = ?", (key_id,))
    server = start_app(server.data_dir)
    try:
        assert server.fetch("/api/system", token=secret).status_code == 401
    finally:
        server.stop()


def mcp_call(server: Server, key: str, tool: str, arguments: dict) -> dict:
    r = server.mcp("tools/call", {"name": tool, "arguments": arguments}, token=key)
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_an_mcp_admin_key_cannot_mint_or_touch_admin_keys(shared_server: Server) -> None:
    """mcp.admin manages keys, but not into /api: no scope crosses surfaces, minting included."""
    _, agent = shared_server.create_key("mcp.admin", name="agent")
    admin_id, admin_secret = shared_server.create_key("admin.read", name="operator's reader")
    minted = mcp_call(shared_server, agent, "api_keys.create", {"name": "x", "scopes": ["admin.write"]})
    assert minted["isError"] and "managed over /api only" in minted["content"][0]["text"]
    mixed = {"name": "x", "scopes": ["mcp.read", "admin.read"]}
    assert mcp_call(shared_server, agent, "api_keys.create", mixed)["isError"]
    for tool in ("api_keys.disable", "api_keys.enable", "api_keys.delete"):
        refused = mcp_call(shared_server, agent, tool, {"id": admin_id})
        assert refused["isError"] and "managed over /api only" in refused["content"][0]["text"], tool
    assert shared_server.fetch("/api/system", token=admin_secret).status_code == 200  # untouched
    # Keys of its own surface, and inference keys, it may create and change.
    made = mcp_call(
        shared_server, agent, "api_keys.create", {"name": "y", "scopes": ["mcp.read", "inference"]}
    )
    assert not made.get("isError"), made
    made_id = made["structuredContent"]["key"]["id"]
    assert not mcp_call(shared_server, agent, "api_keys.disable", {"id": made_id}).get("isError")
    assert not mcp_call(shared_server, agent, "api_keys.delete", {"id": made_id}).get("isError")
    # Over /api, an admin may still do all of it.
    assert shared_server.fetch(f"/api/keys/{admin_id}/disable", "POST").status_code == 200

"""Settings (docs/security.md, "Secrets"): sensitive keys refused and purged, all-or-nothing updates,
bounds at n and n+1."""

from __future__ import annotations

import sqlite3

import pytest

from tests.support.server import Server, start_app

# No test here needs a process of its own: the Application runs in this one (tests/conftest.py).
pytestmark = pytest.mark.in_process

SENSITIVE = [
    "token",
    "Password",
    "api_key",
    "API-Key",
    "apiKey",
    "api key",
    "a\u200bpi_key",
    "ＡＰＩ＿ＫＥＹ",
    "client.secret",
    "hf.credentials",
    "db_passwd",
]


@pytest.mark.parametrize("key", SENSITIVE)
def test_sensitive_keys_are_refused(shared_server: Server, key: str) -> None:
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": key, "value": "x"}])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["loc"] == ["settings", 0, "key"]
    assert key not in [s["key"] for s in shared_server.fetch("/api/settings").json()["settings"]]


def test_update_is_all_or_nothing(shared_server: Server) -> None:
    r = shared_server.fetch(
        "/api/settings", "PUT", json=[{"key": "ui.theme", "value": "dark"}, {"key": "my_token", "value": "x"}]
    )
    assert r.status_code == 400
    keys = [s["key"] for s in shared_server.fetch("/api/settings").json()["settings"]]
    assert "ui.theme" not in keys


def test_update_list_and_delete(shared_server: Server) -> None:
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": "ui.lang", "value": "fr"}])
    assert r.status_code == 200
    assert {"key": "ui.lang", "value": "fr"}.items() <= next(
        s for s in r.json()["settings"] if s["key"] == "ui.lang"
    ).items()
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": "ui.lang", "value": "de"}])
    assert next(s for s in r.json()["settings"] if s["key"] == "ui.lang")["value"] == "de"
    assert shared_server.fetch("/api/settings/ui.lang", "DELETE").json() == {"deleted": "ui.lang"}
    assert shared_server.fetch("/api/settings/ui.lang", "DELETE").status_code == 404


@pytest.mark.parametrize(
    ("key", "value", "status"),
    [
        ("k" * 128, "v", 200),
        ("k" * 129, "v", 400),
        ("long.value", "v" * 8192, 200),
        ("long.value", "v" * 8193, 400),
        ("", "v", 400),
        ("ctl\x01key", "v", 400),
        ("ok.key", "bad\x00", 400),
    ],
)
def test_key_and_value_bounds(shared_server: Server, key: str, value: str, status: int) -> None:
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": key, "value": value}])
    assert r.status_code == status, r.text


def test_dot_keys_are_refused_because_no_url_could_delete_them(shared_server: Server) -> None:
    for key in (".", ".."):
        r = shared_server.fetch("/api/settings", "PUT", json=[{"key": key, "value": "v"}])
        assert r.status_code == 400, r.text
        assert r.json()["error"]["errors"][0]["loc"] == ["settings", 0, "key"]
        assert "could not be deleted" in r.json()["error"]["message"]
    for key in ("...", ".a", "a."):
        r = shared_server.fetch("/api/settings", "PUT", json=[{"key": key, "value": "v"}])
        assert r.status_code == 200, r.text
        assert shared_server.fetch(f"/api/settings/{key}", "DELETE").status_code in (200, 204)
    keys = [s["key"] for s in shared_server.fetch("/api/settings").json()["settings"]]
    assert not {".", ".."} & set(keys)


def test_batch_size_bounds(shared_server: Server) -> None:
    batch = [{"key": f"batch.{i}", "value": "v"} for i in range(256)]
    assert shared_server.fetch("/api/settings", "PUT", json=batch).status_code == 200
    batch.append({"key": "batch.256", "value": "v"})
    assert shared_server.fetch("/api/settings", "PUT", json=batch).status_code == 400
    assert shared_server.fetch("/api/settings", "PUT", json=[]).status_code == 400


def test_sensitive_rows_written_by_hand_are_purged_on_next_open(tmp_path) -> None:
    server = start_app(tmp_path / "data")
    server.fetch("/api/settings", "PUT", json=[{"key": "ui.theme", "value": "dark"}])
    server.stop()
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        for key in SENSITIVE:
            db.execute("INSERT INTO settings (key, value, updated_at) VALUES (?, 'leaked', 1)", (key,))
    server = start_app(server.data_dir)
    try:
        keys = [s["key"] for s in server.fetch("/api/settings").json()["settings"]]
    finally:
        server.stop()
    assert keys == ["ui.theme"]
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        assert db.execute("SELECT count(*) FROM settings WHERE value = 'leaked'").fetchone() == (0,)
    assert "leaked" not in server.log()


def test_a_corrupt_settings_row_fails_the_request_closed(tmp_path) -> None:
    server = start_app(tmp_path / "data")
    server.fetch("/api/settings", "PUT", json=[{"key": "ui.theme", "value": "dark"}])
    server.stop()
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute("INSERT INTO settings (key, value, updated_at) VALUES ('bad', 'x', 'yesterday')")
    server = start_app(server.data_dir)
    try:
        r = server.fetch("/api/settings")
    finally:
        server.stop()
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "corrupt_record"
    assert "bad" in r.json()["error"]["message"]


def test_a_pattern_error_on_a_nested_field_says_what_is_expected_not_the_regex(shared_server: Server) -> None:
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": "ok", "value": "two\nlines"}])
    assert r.status_code == 400
    (error,) = r.json()["error"]["errors"]
    assert error["loc"] == ["settings", 0, "value"]
    assert (
        error["msg"]
        == "not of the expected form: up to 8192 characters, no control characters (no line breaks or tabs)"
    )
    assert "pattern" not in r.json()["error"]["message"]

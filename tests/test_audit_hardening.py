"""An audit trail that an attacker cannot wipe or break (docs/gateway.md, docs/auth.md).

Only requests with a recognised key become audit records; refused credentials on every surface
are counted in memory and shown in `requests.recent` as `auth_failures`. Every field is cut to
what the reader accepts, and a row that fails validation is reported in `corrupt`, never a 500.
"""

from __future__ import annotations

import http.client
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import Server, eventually, start_server
from vllm_use.gateway.audit import METHOD_MAX, AuditWriter, read_newest
from vllm_use.storage import Database

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


def recent(server: Server, token: str | None = "admin") -> dict[str, Any]:
    r = server.fetch("/api/requests/recent?limit=1000", token=token)
    assert r.status_code == 200, r.text
    return r.json()


def chat(server: Server, secret: str | None, request_id: str) -> int:
    hdrs = {"X-Request-ID": request_id}
    if secret is not None:
        hdrs["Authorization"] = f"Bearer {secret}"
    return server.client.post(server.base_url + "/v1/chat/completions", json=CHAT, headers=hdrs).status_code


def test_a_flood_of_refused_credentials_never_evicts_audit_records_and_is_counted(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = start_server(tmp_path / "data", "--upstream", upstream.url, "--max-audit-records", "20")
    try:
        _, secret = server.create_key("inference")
        _, mcp_only = server.create_key("mcp.read")
        for i in range(5):
            assert chat(server, secret, f"real-{i}") == 200
        eventually(lambda: len(recent(server)["requests"]) == 5)
        before = recent(server)["auth_failures"]
        assert before == {
            "total": 0,
            "by_surface": {"api": 0, "mcp": 0, "gateway": 0, "tools": 0, "metrics": 0},
            "last_at": None,
        }

        refused = [None, "vu_" + "B" * 48, server.admin_token, mcp_only, "not-a-key"]
        statuses = [chat(server, refused[i % len(refused)], f"flood-{i}") for i in range(300)]
        assert set(statuses) == {401}
        for _ in range(4):
            assert server.fetch("/api/system", token="vu_" + "C" * 48).status_code == 401
            assert server.mcp("tools/list", token=None).status_code == 401
        assert server.fetch("/api/system", token=mcp_only).status_code == 401  # valid key, wrong surface

        assert chat(server, secret, "after-the-flood") == 200  # its flush comes after the flood's requests
        eventually(lambda: len(recent(server)["requests"]) == 6)
        answer = recent(server)
        kept = {rec["request_id"] for rec in answer["requests"]}
        assert kept == {f"real-{i}" for i in range(5)} | {"after-the-flood"}
        assert all(rec["status"] == 200 and rec["key_id"] for rec in answer["requests"])
        failures = answer["auth_failures"]
        assert failures["total"] == 309
        assert failures["by_surface"] == {"api": 5, "mcp": 4, "gateway": 300, "tools": 0, "metrics": 0}
        assert failures["last_at"].endswith("Z")
        assert answer["corrupt"] == []
    finally:
        server.stop()
    assert secret not in server.log()


def insert_raw(db_path: Path, **overrides: Any) -> None:
    row = {
        "audit_id": "au_" + "0" * 24,
        "request_id": "raw",
        "key_id": None,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "tiny",
        "status": 200,
        "duration_ms": 1.0,
        "stream": 0,
        "created_at": 1_700_000_000_000,
        **overrides,
    }
    columns = ", ".join(row)
    values = ", ".join("CAST(? AS TEXT)" if isinstance(v, bytes) else "?" for v in row.values())
    with sqlite3.connect(db_path) as db:
        db.execute(f"INSERT INTO audit_records ({columns}) VALUES ({values})", tuple(row.values()))  # noqa: S608


def test_corrupt_rows_are_reported_next_to_the_page_never_a_500(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = start_server(tmp_path / "data", "--upstream", upstream.url)
    try:
        _, secret = server.create_key("inference")
        _, reader = server.create_key("mcp.read")
        for i in range(3):
            assert chat(server, secret, f"good-{i}") == 200
        eventually(lambda: len(recent(server)["requests"]) == 3)
        db = server.data_dir / "vllm-use.db"
        bad = {
            "au_method00000000000000000": {"method": "M" * 17},
            "au_status00000000000000000": {"status": "abc"},
            "au_utf8000000000000000000a": {"path": b"/v1/\xff\xfe"},
            "au_created0000000000000000": {"created_at": 10**17},
            "au_duration000000000000000": {"duration_ms": -1.0},
        }
        for audit_id, fields in bad.items():
            insert_raw(db, audit_id=audit_id, **fields)
        insert_raw(db, audit_id="bad id with spaces")

        answer = recent(server)
        assert {rec["request_id"] for rec in answer["requests"]} == {f"good-{i}" for i in range(3)}
        corrupt = {c["audit_id"]: c["problem"] for c in answer["corrupt"]}
        assert set(corrupt) == {*bad, None}
        for audit_id, fields in bad.items():
            assert corrupt[audit_id].startswith(next(iter(fields))), corrupt[audit_id]
        assert corrupt[None].startswith("audit_id")
        assert all(isinstance(c["rowid"], int) for c in answer["corrupt"])
        assert "MMMMMMMMMMMMMMMMM" not in str(answer["corrupt"])  # the problem, never the value

        over_mcp = server.mcp("tools/call", {"name": "requests.recent", "arguments": {}}, token=reader).json()
        assert over_mcp["result"]["isError"] is False
        assert len(over_mcp["result"]["structuredContent"]["corrupt"]) == 6
    finally:
        server.stop()


def test_a_method_longer_than_the_column_never_breaks_the_page(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Tornado accepts any token as a method; the reader allows 16 characters."""
    server = start_server(tmp_path / "data", "--upstream", upstream.url)
    try:
        _, secret = server.create_key("inference")
        assert chat(server, secret, "before") == 200
        host, port = server.base_url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request(
                "PROPFINDPROPFIND1", "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}
            )
            assert conn.getresponse().status == 405
        finally:
            conn.close()
        assert chat(server, secret, "after") == 200
        eventually(lambda: {"before", "after"} <= {r["request_id"] for r in recent(server)["requests"]})
        assert recent(server)["corrupt"] == []
    finally:
        server.stop()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    (tmp_path / "data").mkdir(mode=0o700)
    database = Database(tmp_path / "data" / "vllm-use.db")
    database.open()
    yield database
    database.close()


def test_the_writer_cuts_every_field_to_what_the_reader_accepts(db: Database) -> None:
    writer = AuditWriter(db, 100)
    writer.record(
        audit_id="au_" + "1" * 24,
        request_id="cut",
        key_id=None,
        method="X" * 40,
        path="/" + "p" * 5000,
        model="m" * 5000,
        status=200,
        duration_ms=1.5,
        stream=False,
    )
    writer.record(
        audit_id="au_" + "2" * 24,
        request_id="empty",
        key_id=None,
        method="",
        path="",
        model=None,
        status=200,
        duration_ms=0.0,
        stream=True,
    )
    assert writer.flush_sync()
    records, corrupt = db.query_sync(read_newest, 10)
    assert corrupt == []
    by_id = {r["request_id"]: r for r in records}
    assert by_id["cut"]["method"] == "X" * METHOD_MAX
    assert len(by_id["cut"]["path"]) == 2048 and len(by_id["cut"]["model"]) == 1024
    assert by_id["empty"]["method"] and by_id["empty"]["path"]


def test_the_console_shows_refused_credentials_and_corrupt_rows(
    tmp_path: Path, upstream: FakeUpstream, browser: Any
) -> None:
    from playwright.sync_api import expect

    from tests.support.browser import new_page, sign_in

    server = start_server(tmp_path / "data", "--upstream", upstream.url)
    try:
        _, secret = server.create_key("inference")
        for i in range(2):
            assert chat(server, secret, f"shown-{i}") == 200
        for i in range(3):
            assert chat(server, None, f"refused-{i}") == 401
        eventually(lambda: len(recent(server)["requests"]) == 2)
        insert_raw(server.data_dir / "vllm-use.db", audit_id="au_broken0000000000000000", status="abc")
        watched = new_page(browser, server.base_url)
        try:
            sign_in(watched, server.admin_token or "", "/requests")
            page = watched.page
            expect(page.locator(".requests-table tbody tr")).to_have_count(2)
            expect(page.locator(".requests-failures")).to_contain_text(
                "Refused credentials since the server started: 3 (gateway 3)"
            )
            corrupt = page.locator(".requests-corrupt")
            expect(corrupt).to_contain_text("1 record could not be read and is not shown")
            expect(corrupt).to_contain_text("au_broken0000000000000000")
            expect(corrupt).to_contain_text("status is missing")
        finally:
            watched.page.context.close()
        watched.assert_clean()
    finally:
        server.stop()


def test_the_eviction_keeps_exactly_the_newest_max_records_across_flushes_and_restarts(db: Database) -> None:
    """--max-audit-records at its edge: n records are all kept, the n+1st evicts the oldest; a new
    writer (a restart) counts what is stored and keeps to its own cap, however large the table."""

    def add(writer: AuditWriter, *numbers: int) -> list[str]:
        for n in numbers:
            writer.record(
                audit_id=f"au_{n:024d}",
                request_id=str(n),
                key_id=None,
                method="POST",
                path="/v1/chat/completions",
                model="tiny",
                status=200,
                duration_ms=1.0,
                stream=False,
            )
        assert writer.flush_sync()
        records, corrupt = db.query_sync(read_newest, 100)
        assert corrupt == []
        return sorted((r["request_id"] for r in records), key=int)

    writer = AuditWriter(db, 5)
    assert add(writer, 0, 1, 2, 3, 4) == ["0", "1", "2", "3", "4"]
    assert add(writer, 5) == ["1", "2", "3", "4", "5"]
    assert add(writer, 6, 7) == ["3", "4", "5", "6", "7"]
    assert add(AuditWriter(db, 5), 8) == ["4", "5", "6", "7", "8"]
    assert add(AuditWriter(db, 3), 9) == ["7", "8", "9"]
    assert add(AuditWriter(db, 10), 10, 11) == ["7", "8", "9", "10", "11"]

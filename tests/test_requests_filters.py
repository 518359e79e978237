"""`requests.recent` names each record's key and filters server side (issue 17, finding 10; docs/gateway.md,
"Audit"): by key, model (a part of it), status (a code or a class) and time (since/until, ISO 8601
with a time zone). Bad filter input is a 400 naming the field; a key id that no key has is a filter
that finds nothing, not an error (a deleted key's records keep its id and are still found by it).

Records come from real /v1 calls through the gateway to the fake upstream (two keys, one then
deleted), plus two rows written straight into the database with known times for the time range.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import Server, eventually, start_server

OLD = 1_700_000_000_000  # 2023-11-14T22:13:20Z
OLDER = OLD - 3_600_000  # an hour before


def chat(server: Server, secret: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {secret}"}
    return server.client.post(
        server.base_url + "/v1/chat/completions", json=body, headers=headers
    ).status_code


def recent(server: Server, query: str = "", token: str | None = "admin") -> list[dict[str, Any]]:
    r = server.fetch("/api/requests/recent?limit=1000" + query, token=token)
    assert r.status_code == 200, r.text
    return r.json()["requests"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def audited(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream
) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with records: alice 2× tiny (200), bob 1× tiny (200) and 1× nope (404), a deleted
    key 1× tiny (200), and two old rows of alice's (200 and 503) an hour apart."""
    server = start_server(tmp_path_factory.mktemp("data"), "--upstream", upstream.url)
    try:
        keys: dict[str, str] = {}
        secrets: dict[str, str] = {}
        for name in ("alice", "bob", "gone"):
            keys[name], secrets[name] = server.create_key("inference", name=name)
        assert [chat(server, secrets["alice"], "tiny") for _ in range(2)] == [200, 200]
        assert chat(server, secrets["bob"], "tiny") == 200
        assert chat(server, secrets["bob"], "nope") == 404
        assert chat(server, secrets["gone"], "tiny") == 200
        eventually(lambda: len(recent(server)) == 5)
        assert server.fetch(f"/api/keys/{keys['gone']}", "DELETE").status_code == 200
        with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
            for audit_id, status, created in (
                ("au_" + "a" * 24, 200, OLDER),
                ("au_" + "b" * 24, 503, OLD),
            ):
                db.execute(
                    "INSERT INTO audit_records (audit_id, request_id, key_id, method, path, model, status,"
                    " duration_ms, stream, created_at) VALUES (?, ?, ?, 'POST', '/v1/chat/completions',"
                    " 'tiny', ?, 1.0, 0, ?)",
                    (audit_id, f"old-{status}", keys["alice"], status, created),
                )
        yield server, keys
    finally:
        server.stop()


def test_each_record_names_its_key_and_a_deleted_key_is_marked(
    audited: tuple[Server, dict[str, str]],
) -> None:
    server, keys = audited
    records = recent(server)
    assert len(records) == 7
    names = {(r["key_id"], r["key_name"], r["key_deleted"]) for r in records}
    assert names == {(keys["alice"], "alice", False), (keys["bob"], "bob", False), (keys["gone"], None, True)}


def test_a_caller_that_may_not_list_keys_gets_ids_without_names(
    audited: tuple[Server, dict[str, str]],
) -> None:
    server, keys = audited
    for scope, named in (("mcp.read", False), ("mcp.admin", True)):
        _, token = server.create_key(scope, name=f"reader {scope}")
        r = server.mcp(
            "tools/call", {"name": "requests.recent", "arguments": {"key_id": keys["bob"]}}, token=token
        )
        rows = r.json()["result"]["structuredContent"]["requests"]
        assert {row["key_id"] for row in rows} == {keys["bob"]}
        assert {row["key_name"] for row in rows} == ({"bob"} if named else {None})


def test_the_key_filter(audited: tuple[Server, dict[str, str]]) -> None:
    server, keys = audited
    assert {r["key_name"] for r in recent(server, f"&key_id={keys['alice']}")} == {"alice"}
    assert len(recent(server, f"&key_id={keys['alice']}")) == 4
    assert len(recent(server, f"&key_id={keys['bob']}")) == 2
    gone = recent(server, f"&key_id={keys['gone']}")  # deleted, its records still found by its id
    assert len(gone) == 1 and gone[0]["key_deleted"] is True
    assert recent(server, "&key_id=" + "Z" * 24) == []  # well formed, nobody's: nothing, not an error


def test_the_model_filter_matches_a_part_of_the_model(audited: tuple[Server, dict[str, str]]) -> None:
    server, _ = audited
    assert [(r["model"], r["status"], r["key_name"]) for r in recent(server, "&model=nope")] == [
        ("nope", 404, "bob")
    ]
    assert {r["model"] for r in recent(server, "&model=tin")} == {"tiny"}
    assert len(recent(server, "&model=tin")) == 6
    assert recent(server, "&model=TINY") == []  # case-sensitive, as the model is sent


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("404", [404]),
        ("4xx", [404]),
        ("5xx", [503]),
        ("503", [503]),
        ("2xx", [200] * 5),
        ("3xx", []),
        ("201", []),
    ],
)
def test_the_status_filter_takes_a_code_or_a_class(
    audited: tuple[Server, dict[str, str]], status: str, expected: list[int]
) -> None:
    server, _ = audited
    assert [r["status"] for r in recent(server, f"&status={status}")] == expected


def test_the_time_range_is_inclusive_and_combines_with_other_filters(
    audited: tuple[Server, dict[str, str]],
) -> None:
    server, keys = audited
    old, older = "2023-11-14T22:13:20Z", "2023-11-14T21:13:20Z"
    assert [r["request_id"] for r in recent(server, f"&until={old}")] == ["old-503", "old-200"]
    assert [r["request_id"] for r in recent(server, f"&until={older}")] == ["old-200"]
    assert [r["request_id"] for r in recent(server, f"&since={older}&until={old}&status=2xx")] == ["old-200"]
    # The same instant in another zone.
    assert [
        r["request_id"]
        for r in recent(server, "&since=2023-11-14T23:13:20%2B01:00&until=2023-11-15T00:00:00Z")
    ] == ["old-503"]
    recent_only = recent(server, "&since=2024-01-01T00:00:00Z")
    assert len(recent_only) == 5 and all(not r["request_id"].startswith("old-") for r in recent_only)
    assert recent(
        server, f"&since=2024-01-01T00:00:00Z&key_id={keys['alice']}&status=2xx&model=tiny"
    ) == recent(server, f"&since=2024-01-01T00:00:00Z&key_id={keys['alice']}")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("key_id=abc", "key_id"),
        ("key_id=" + "a" * 25, "key_id"),
        ("model=", "model"),
        ("model=%07bell", "model"),
        ("status=4x", "status"),
        ("status=600", "status"),
        ("status=6xx", "status"),
        ("status=ok", "status"),
        ("since=yesterday", "since"),
        ("since=2026-13-01T00:00:00Z", "since"),
        ("since=2026-12-01T00:00:00", "since"),  # no time zone: whose midnight?
        ("until=2026-12-01", "until"),
        ("since=2026-12-02T00:00:00Z&until=2026-12-01T00:00:00Z", "until"),  # before since
        ("status=404&status=500", "status"),
    ],
)
def test_bad_filters_are_a_400_naming_the_field(
    audited: tuple[Server, dict[str, str]], query: str, field: str
) -> None:
    server, _ = audited
    r = server.fetch("/api/requests/recent?" + query)
    assert r.status_code == 400, r.text
    assert f"invalid arguments: {field}" in r.json()["error"]["message"], r.text

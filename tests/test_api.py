"""The /api surface: routes, JSON errors, cache headers, body caps, the SPA fallback."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

import pytest

from handlers.base import BODY_LIMIT
from tests.support.server import Server


def assert_no_store(r: object) -> None:
    headers = r.headers  # type: ignore[attr-defined]
    assert headers["cache-control"] == "no-store"
    assert headers["pragma"] == "no-cache"


def test_healthz_is_ok_without_auth(shared_server: Server) -> None:
    r = shared_server.fetch("/healthz", token=None)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("method", "path", "token", "status"),
    [
        ("GET", "/api/system", "admin", 200),
        ("GET", "/api/system", None, 401),
        ("GET", "/api/nope", "admin", 404),
        ("GET", "/api/nope", None, 404),
        ("GET", "/api", None, 404),
        ("PATCH", "/api/system", "admin", 405),
        ("DELETE", "/api/system", "admin", 405),
        ("GET", "/v1/anything", None, 404),
        ("GET", "/mcp/extra", None, 404),
        ("GET", "/mcp", None, 405),
        ("DELETE", "/mcp", None, 405),
        ("POST", "/mcp", None, 401),
        ("GET", "/api/openapi.json", "admin", 200),
        ("GET", "/api/methods", "admin", 200),
    ],
)
def test_every_api_and_mcp_response_is_no_store(
    shared_server: Server, method: str, path: str, token: str | None, status: int
) -> None:
    r = shared_server.fetch(path, method, token=token)
    assert r.status_code == status, r.text
    assert_no_store(r)
    assert r.headers["content-type"].startswith("application/json")
    if status >= 400:
        assert r.json()["error"]["code"]


def test_unknown_api_path_is_json_404_not_the_console(shared_server: Server) -> None:
    r = shared_server.fetch("/api/models/whatever/deep")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_spa_fallback_serves_index_for_client_routes(shared_server: Server) -> None:
    index = shared_server.fetch("/", token=None)
    assert index.status_code == 200
    assert "<title>vllm-use</title>" in index.text
    deep = shared_server.fetch("/models/abc/settings", token=None)
    assert deep.status_code == 200
    assert deep.text == index.text
    asset = shared_server.fetch("/js/main.js", token=None)
    assert asset.status_code == 200
    assert "javascript" in asset.headers["content-type"]


def test_a_missing_console_asset_is_404_not_the_index(shared_server: Server) -> None:
    for path in (
        "/js/nope.js",
        "/css/nope.css",
        "/js/pages/nope.js",
        "/vendor/x.js",
        "/package.json",
        "/node_modules/marked/package.json",
    ):
        r = shared_server.fetch(path, token=None)
        assert r.status_code == 404, path
        assert "<title>vllm-use</title>" not in r.text


def test_only_the_console_files_are_served_and_any_other_file_name_is_404(shared_server: Server) -> None:
    """An allow-list (handlers/static.py): a path that names a file outside index.html, js/, css/
    and vendor/ is a 404, never the page; a path without a file name is a client route."""
    for path in ("/robots.txt", "/favicon.ico", "/models/x.json", "/.env", "/README.md"):
        r = shared_server.fetch(path, token=None)
        assert r.status_code == 404, path
        assert "<title>vllm-use</title>" not in r.text
    for path in ("/models", "/chat", "/a/b/c"):
        r = shared_server.fetch(path, token=None)
        assert r.status_code == 200 and "<title>vllm-use</title>" in r.text, path


def test_console_files_are_revalidated_so_an_upgrade_is_never_stale(shared_server: Server) -> None:
    for path in ("/", "/index.html", "/js/main.js", "/css/console.css"):
        r = shared_server.fetch(path, token=None)
        assert r.status_code == 200, path
        assert r.headers["cache-control"] == "no-cache", path
        etag = r.headers["etag"]
        again = shared_server.fetch(path, token=None, headers={"If-None-Match": etag})
        assert again.status_code == 304, path


def test_the_console_page_has_a_strict_content_security_policy(shared_server: Server) -> None:
    r = shared_server.fetch("/runtime", token=None)
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY"


def test_spa_fallback_does_not_escape_static_dir(shared_server: Server) -> None:
    url = urlsplit(shared_server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", "/../../etc/passwd")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert b"root:" not in body


def test_body_at_the_limit_is_read_and_one_byte_more_is_413(shared_server: Server) -> None:
    # A JSON body of exactly BODY_LIMIT bytes is accepted for parsing (and fails validation: 400);
    # one byte more is refused as too large, before anything runs.
    pad = BODY_LIMIT - len('{"message":""}')
    at_limit = ('{"message":"' + "a" * pad + '"}').encode()
    assert len(at_limit) == BODY_LIMIT
    r = shared_server.fetch(
        "/api/test", "POST", content=at_limit, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400  # message is longer than 1024 characters
    assert r.json()["error"]["errors"][0]["loc"] == ["message"]
    over = at_limit[:-2] + b'a"}'
    assert len(over) == BODY_LIMIT + 1
    r = shared_server.fetch("/api/test", "POST", content=over, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert_no_store(r)


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/octet-stream", "multipart/form-data"]
)
def test_body_cap_holds_whatever_the_content_type(shared_server: Server, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = shared_server.fetch("/api/keys", "POST", content=b"x" * (BODY_LIMIT + 1), headers=headers)
    assert r.status_code == 413


def test_chunked_body_over_the_limit_is_413(shared_server: Server) -> None:
    def chunks():  # no Content-Length: httpx sends Transfer-Encoding: chunked
        for _ in range(BODY_LIMIT // 65536 + 2):
            yield b"x" * 65536

    r = shared_server.client.post(
        shared_server.base_url + "/api/keys",
        content=chunks(),
        headers={"Authorization": f"Bearer {shared_server.admin_token}"},
    )
    assert r.status_code == 413
    assert_no_store(r)


def test_413_on_mcp_too(shared_server: Server) -> None:
    r = shared_server.fetch("/mcp", "POST", content=b"x" * (BODY_LIMIT + 1), token=None)
    assert r.status_code == 413
    assert_no_store(r)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b"not json", ["body"]),
        (b"[1, 2]", ["body"]),
        (b'{"name": "k"}', ["scopes"]),
        (b'{"name": "k", "scopes": ["root"]}', ["scopes", 0]),
        (b'{"name": "k", "scopes": ["inference"], "admin": true}', ["admin"]),
        (b'{"name": 5, "scopes": ["inference"]}', ["name"]),
        (b'{"name": "k", "scopes": []}', ["scopes"]),
    ],
)
def test_bad_arguments_are_400_with_the_field_path_and_change_nothing(
    shared_server: Server, body: bytes, loc: list[object]
) -> None:
    before = len(shared_server.fetch("/api/keys").json()["keys"])
    r = shared_server.fetch("/api/keys", "POST", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_arguments"
    assert error["errors"][0]["loc"] == loc
    assert len(shared_server.fetch("/api/keys").json()["keys"]) == before


@pytest.mark.parametrize("body", [None, b"{}", b" { }\n", b"\r\n"])
def test_a_method_without_arguments_takes_no_body_or_an_empty_object(
    shared_server: Server, body: bytes | None
) -> None:
    r = shared_server.fetch(
        "/api/runtime/stop", "POST", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body", [b'{"force": true}', b"[]", b"null", b"{}{}", b"0", b"{", b'""'])
def test_a_method_without_arguments_refuses_any_other_body(shared_server: Server, body: bytes) -> None:
    r = shared_server.fetch(
        "/api/runtime/stop", "POST", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["loc"] == ["body"]


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("limit=1", 200),
        ("limit=1000", 200),
        ("limit=0", 400),
        ("limit=1001", 400),
        ("limit=abc", 400),
        ("limit=1&limit=2", 400),
        ("other=1", 400),
        ("", 200),
    ],
)
def test_query_parameters_are_validated(shared_server: Server, query: str, status: int) -> None:
    r = shared_server.fetch("/api/requests/recent?" + query)
    assert r.status_code == status, r.text
    if status == 200:
        assert r.json()["requests"] == [] and r.json()["corrupt"] == []


def test_methods_listing_matches_the_registry(shared_server: Server) -> None:
    from vllm_use.abilities import build_registry
    from vllm_use.scopes import Scope

    listed = shared_server.fetch("/api/methods").json()["methods"]
    registry = list(build_registry())
    assert [m["name"] for m in listed] == [m.name for m in registry]
    by_name = {m["name"]: m for m in listed}
    create = by_name["api_keys.create"]
    assert create["scope"] == {"api": "admin.write", "mcp": "mcp.admin"}
    assert create["input_schema"]["additionalProperties"] is False
    assert create["input_schema"]["properties"]["scopes"]["maxItems"] == len(Scope) == 9
    assert by_name["test"]["public"] is True


def test_methods_listing_needs_admin_read(shared_server: Server) -> None:
    _, writer = shared_server.create_key("admin.write")
    assert shared_server.fetch("/api/methods", token=writer).status_code == 403
    assert shared_server.fetch("/api/openapi.json", token=writer).status_code == 403
    _, reader = shared_server.create_key("admin.read")
    assert shared_server.fetch("/api/methods", token=reader).status_code == 200


def test_system_reports_missing_tools_and_gpus_honestly(shared_server: Server, tmp_path) -> None:
    body = shared_server.fetch("/api/system").json()
    tools = {t["name"]: t for t in body["tools"]}
    assert set(tools) == {"vllm", "hf", "nvidia-smi"}
    assert body["data_dir"] == str(shared_server.data_dir)
    assert body["models_dir"] == str(shared_server.data_dir / "models")
    for tool in tools.values():
        assert tool["status"] in ("available", "missing", "error")
        if tool["status"] == "missing":
            assert tool["path"] is None and tool["version"] is None
    gpus = shared_server.fetch("/api/gpus").json()
    assert gpus["status"] in ("available", "missing")
    if gpus["status"] == "missing":
        assert gpus["gpus"] == []
        assert body["gpu_count"] == 0


def test_dashboard_counts_what_exists(shared_server: Server) -> None:
    before = shared_server.fetch("/api/dashboard").json()
    shared_server.create_key("inference", name="counted")
    after = shared_server.fetch("/api/dashboard").json()
    assert after["counts"]["api_keys"] == before["counts"]["api_keys"] + 1
    assert after["counts"]["requests"] == 0
    assert after["system"]["version"]
    assert after["gpus"]["status"] in ("available", "missing", "error")


def test_mcp_status_names_the_endpoint(shared_server: Server) -> None:
    body = shared_server.fetch("/api/mcp").json()
    assert body["endpoint"] == shared_server.base_url + "/mcp"
    assert body["protocol_version"] == "2026-07-28"
    assert body["tool_count"] == len(shared_server.fetch("/api/methods").json()["methods"])


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("PATCH", "/api/settings", "GET, PUT"), ("DELETE", "/api/system", "GET"), ("GET", "/mcp", "POST")],
)
def test_405_names_the_allowed_verbs(shared_server: Server, method: str, path: str, allow: str) -> None:
    r = shared_server.fetch(path, method)
    assert r.status_code == 405
    assert r.headers["allow"] == allow


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_number_constants_are_refused(shared_server: Server, constant: bytes) -> None:
    r = shared_server.fetch("/api/test", "POST", content=b'{"message": ' + constant + b"}")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_arguments"

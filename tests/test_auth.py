"""The auth matrix (docs/auth.md, "The header"; docs/security.md): malformed or foreign credentials are
refused and nothing runs."""

from __future__ import annotations

import http.client
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.server import ADMIN_TOKEN, Server

# No test here needs a process of its own: `server` runs the Application in this one (tests/conftest.py).
pytestmark = pytest.mark.in_process

BAD_HEADERS = [
    pytest.param(None, id="no-header"),
    pytest.param("Basic dXNlcjpwYXNz", id="basic-scheme"),
    pytest.param("bearer " + ADMIN_TOKEN, id="lowercase-scheme"),
    pytest.param("Bearer  " + ADMIN_TOKEN, id="two-spaces"),
    pytest.param(f"Bearer {ADMIN_TOKEN}, Bearer {ADMIN_TOKEN}", id="comma-joined"),
    pytest.param("Bearer a, Bearer b", id="bearer-a-bearer-b"),
    pytest.param("Bearer\t" + ADMIN_TOKEN, id="tab-separator"),
    pytest.param("Bearer", id="no-token"),
    pytest.param("Bearer vu_" + "A" * 48, id="unknown-key"),
    pytest.param("Bearer not-a-known-token-at-all", id="unknown-token"),
    pytest.param("Bearer " + ADMIN_TOKEN + "\u00a0", id="nbsp-suffix"),
]


def raw_request(
    server: Server, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """http.client lets a test send repeated or odd headers exactly as given."""
    url = urlsplit(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value.encode("latin-1"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def key_ids(server: Server) -> set[str]:
    return {k["id"] for k in server.fetch("/api/keys").json()["keys"]}


@pytest.mark.parametrize("header", BAD_HEADERS)
def test_bad_authorization_is_401_on_api_and_nothing_runs(shared_server: Server, header: str | None) -> None:
    before = key_ids(shared_server)
    headers = [("Authorization", header)] if header is not None else []
    status, resp_headers, body = raw_request(
        shared_server, "POST", "/api/keys", headers, b'{"name": "x", "scopes": ["inference"]}'
    )
    assert status == 401, body
    assert resp_headers["www-authenticate"].startswith("Bearer")
    assert resp_headers["cache-control"] == "no-store"
    assert key_ids(shared_server) == before


@pytest.mark.parametrize("header", BAD_HEADERS)
def test_bad_authorization_is_401_on_mcp(shared_server: Server, header: str | None) -> None:
    headers = [("Authorization", header)] if header is not None else []
    headers += [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/list"),
        ("Content-Type", "application/json"),
    ]
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}).encode()
    status, resp_headers, _ = raw_request(shared_server, "POST", "/mcp", headers, body)
    assert status == 401
    assert resp_headers["www-authenticate"].startswith("Bearer")


def test_two_authorization_headers_are_401(shared_server: Server) -> None:
    auth = ("Authorization", f"Bearer {ADMIN_TOKEN}")
    status, _, _ = raw_request(shared_server, "GET", "/api/system", [auth, auth])
    assert status == 401
    status, _, _ = raw_request(shared_server, "GET", "/api/system", [auth])
    assert status == 200


def test_control_character_in_token_is_refused(shared_server: Server) -> None:
    status, _, _ = raw_request(
        shared_server, "GET", "/api/system", [("Authorization", f"Bearer {ADMIN_TOKEN}\x01")]
    )
    assert status in (400, 401)


def test_admin_token_is_not_a_credential_on_mcp(shared_server: Server) -> None:
    r = shared_server.mcp("tools/list", token=ADMIN_TOKEN)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")


def test_mcp_only_key_is_not_a_credential_on_api(shared_server: Server) -> None:
    _, secret = shared_server.create_key("mcp.admin")
    assert shared_server.fetch("/api/system", token=secret).status_code == 401
    assert shared_server.fetch("/api/test", "POST", json={}, token=secret).status_code == 401


def test_inference_key_is_not_a_credential_on_api_or_mcp(shared_server: Server) -> None:
    _, secret = shared_server.create_key("inference")
    assert shared_server.fetch("/api/system", token=secret).status_code == 401
    assert shared_server.mcp("tools/list", token=secret).status_code == 401


def test_key_lacking_the_scope_is_403_and_nothing_runs(shared_server: Server) -> None:
    _, secret = shared_server.create_key("admin.read")
    before = key_ids(shared_server)
    r = shared_server.fetch("/api/keys", "POST", json={"name": "x", "scopes": ["inference"]}, token=secret)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "permission_denied"
    assert key_ids(shared_server) == before


def test_admin_write_does_not_imply_admin_read(shared_server: Server) -> None:
    _, secret = shared_server.create_key("admin.write")
    assert shared_server.fetch("/api/settings", token=secret).status_code == 403
    r = shared_server.fetch("/api/settings", "PUT", json=[{"key": "theme", "value": "dark"}], token=secret)
    assert r.status_code == 200


def test_public_test_method_needs_a_credential(shared_server: Server) -> None:
    assert shared_server.fetch("/api/test", "POST", json={"message": "hi"}, token=None).status_code == 401
    r = shared_server.fetch("/api/test", "POST", json={"message": "hi"})
    assert r.status_code == 200
    assert r.json() == {"ok": True, "message": "hi", "protocol": "http"}


def test_wrong_secrets_for_a_real_prefix_are_401_or_429_never_200_and_counted(server: Server) -> None:
    """Many concurrent wrong secrets for one real key's display prefix (each would cost a scrypt):
    refused, some at once beyond the bounded queue, never let through; the key itself still works."""
    _, secret = server.create_key("admin.read")
    prefix = secret[:11]  # "vu_" + the 8 characters api_keys.list shows
    wrong = [prefix + secrets.token_hex(20) for _ in range(48)]
    before = server.fetch("/api/requests/recent").json()["auth_failures"]["total"]

    def attempt(token: str) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=60) as client:
            return client.get(server.base_url + "/api/system", headers={"Authorization": f"Bearer {token}"})

    with ThreadPoolExecutor(max_workers=len(wrong)) as pool:
        answers = list(pool.map(attempt, wrong))
    assert {r.status_code for r in answers} <= {401, 429}, [r.status_code for r in answers]
    for r in answers:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "auth_busy"
            assert r.json()["error"]["retry_after_s"] >= 1
            assert r.headers["Retry-After"] == str(r.json()["error"]["retry_after_s"])
    after = server.fetch("/api/requests/recent").json()["auth_failures"]
    assert after["total"] - before == len(wrong)
    assert after["by_surface"]["api"] >= len(wrong)
    assert server.fetch("/api/system", token=secret).status_code == 200

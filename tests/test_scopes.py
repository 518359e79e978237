"""The scope matrix (docs/security.md), generated from the registry: every method × every scope × both
protocols.

The expectations below are the method table of docs/api_methods.md written out by hand, independent of
the scopes the code declares; a method registered without a row here fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from handlers.api import ROUTES
from tests.support.server import ADMIN_TOKEN, Server, start_server
from vllm_use.abilities import build_registry

READ = ("admin.read", "mcp.read")
# docs/api_methods.md: method → (admin HTTP scope, MCP scope); "any" = any valid credential of that surface.
EXPECTED_SCOPES: dict[str, tuple[str, str]] = {
    "test": ("any", "any"),
    "system.get": READ,
    "dashboard.get": READ,
    "mcp.status": READ,
    "gpu.list": READ,
    "models.list": READ,
    "models.get": READ,
    "models.add": ("admin.write", "mcp.models"),
    "models.register_local": ("admin.write", "mcp.models"),
    "models.register_huggingface": ("admin.write", "mcp.models"),
    "models.scan": ("admin.write", "mcp.models"),
    "models.delete": ("admin.write", "mcp.models"),
    "downloads.list": READ,
    "downloads.status": READ,
    "downloads.logs": READ,
    "downloads.start": ("admin.write", "mcp.models"),
    "downloads.retry": ("admin.write", "mcp.models"),
    "downloads.cancel": ("admin.write", "mcp.models"),
    "runtime.status": READ,
    "runtime.logs": READ,
    "runtime.start": ("admin.write", "mcp.runtime"),
    "runtime.restart": ("admin.write", "mcp.runtime"),
    "runtime.switch": ("admin.write", "mcp.runtime"),
    "runtime.stop": ("admin.write", "mcp.runtime"),
    "deployments.list": READ,
    "deployments.get": READ,
    "deployments.create": ("admin.write", "mcp.runtime"),
    "deployments.update": ("admin.write", "mcp.runtime"),
    "deployments.delete": ("admin.write", "mcp.runtime"),
    "deployments.load": ("admin.write", "mcp.runtime"),
    "deployments.unload": ("admin.write", "mcp.runtime"),
    "deployments.sleep": ("admin.write", "mcp.runtime"),
    "deployments.wake": ("admin.write", "mcp.runtime"),
    "deployments.logs": READ,
    "api_keys.list": ("admin.read", "mcp.admin"),
    "api_keys.create": ("admin.write", "mcp.admin"),
    "api_keys.update": ("admin.write", "mcp.admin"),
    "api_keys.enable": ("admin.write", "mcp.admin"),
    "api_keys.disable": ("admin.write", "mcp.admin"),
    "api_keys.delete": ("admin.write", "mcp.admin"),
    "settings.list": READ,
    "settings.update": ("admin.write", "mcp.admin"),
    "settings.delete": ("admin.write", "mcp.admin"),
    "requests.recent": READ,
    "streams.list": ("admin.read", "mcp.admin"),
    "streams.cancel": ("admin.write", "mcp.admin"),
    "usage.summary": READ,
}
SCOPES = ("admin.read", "admin.write", "mcp.read", "mcp.models", "mcp.runtime", "mcp.admin", "inference")
IDENTITIES = ("admin-token", *SCOPES)
METHODS = [m.name for m in build_registry()]
PLACEHOLDERS = {"id": "A" * 24, "key": "no-such-setting", "name": "no-such-deployment"}


def expected_api(method: str, who: str) -> int | str:
    """401 (not a credential on /api), 403 (missing scope) or "allowed"."""
    if who == "admin-token":
        return "allowed"
    if not who.startswith("admin."):
        return 401
    needed = EXPECTED_SCOPES[method][0]
    return "allowed" if needed in ("any", who) else 403


def expected_mcp(method: str, who: str) -> int | str:
    """401 (not a credential on /mcp), "hidden" (unknown tool) or "allowed"."""
    if not who.startswith("mcp."):
        return 401
    needed = EXPECTED_SCOPES[method][1]
    return "allowed" if who == "mcp.admin" or needed in ("any", who) else "hidden"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    server = start_server(tmp_path_factory.mktemp("scopes") / "data")
    tokens = {"admin-token": ADMIN_TOKEN}
    for scope in SCOPES:
        tokens[scope] = server.create_key(scope, name=f"only {scope}")[1]
    yield server, tokens
    server.stop()


def test_every_registered_method_has_an_expected_scope_row_and_a_route() -> None:
    routed = {r.method for r in ROUTES}
    for name in METHODS:
        assert name in EXPECTED_SCOPES, f"{name} is registered but has no row in EXPECTED_SCOPES"
        assert name in routed, f"{name} has no /api route"


def api_request(server: Server, method: str, token: str) -> Any:
    route = next(r for r in ROUTES if r.method == method)
    path = route.path.format(**PLACEHOLDERS)
    body: Any = None
    if route.body == "object":
        body = {}
    elif route.body:
        body = []
    return server.fetch(path, route.verb, json=body, token=token)


@pytest.mark.parametrize("who", IDENTITIES)
@pytest.mark.parametrize("method", METHODS)
def test_api_scope_matrix(matrix: tuple[Server, dict[str, str]], method: str, who: str) -> None:
    server, tokens = matrix
    r = api_request(server, method, tokens[who])
    expected = expected_api(method, who)
    if expected == "allowed":
        assert r.status_code not in (401, 403), (method, who, r.text)
    else:
        assert r.status_code == expected, (method, who, r.text)


@pytest.mark.parametrize("who", IDENTITIES)
@pytest.mark.parametrize("method", METHODS)
def test_mcp_scope_matrix(matrix: tuple[Server, dict[str, str]], method: str, who: str) -> None:
    server, tokens = matrix
    r = server.mcp("tools/call", {"name": method, "arguments": {}}, token=tokens[who])
    expected = expected_mcp(method, who)
    if expected == 401:
        assert r.status_code == 401, (method, who, r.text)
        return
    body = r.json()
    if expected == "hidden":
        assert body["error"]["code"] == -32602, (method, who, body)
        assert body["error"]["message"] == f"Unknown tool: {method}"
    else:
        assert "result" in body, (method, who, body)


@pytest.mark.parametrize("who", [s for s in SCOPES if s.startswith("mcp.")])
def test_tools_list_shows_exactly_the_allowed_tools(matrix: tuple[Server, dict[str, str]], who: str) -> None:
    server, tokens = matrix
    r = server.mcp("tools/list", token=tokens[who])
    listed = {t["name"] for t in r.json()["result"]["tools"]}
    assert listed == {m for m in METHODS if expected_mcp(m, who) == "allowed"}


def test_unknown_tool_and_forbidden_tool_look_the_same(matrix: tuple[Server, dict[str, str]]) -> None:
    server, tokens = matrix
    unknown = server.mcp("tools/call", {"name": "no.such_tool", "arguments": {}}, token=tokens["mcp.read"])
    forbidden = server.mcp("tools/call", {"name": "api_keys.list", "arguments": {}}, token=tokens["mcp.read"])
    assert unknown.status_code == forbidden.status_code
    assert unknown.json()["error"]["code"] == forbidden.json()["error"]["code"]


@pytest.mark.parametrize("who", ["mcp.read", "mcp.admin"])
def test_mcp_status_counts_the_tools_this_key_sees(matrix: tuple[Server, dict[str, str]], who: str) -> None:
    server, tokens = matrix
    listed = server.mcp("tools/list", token=tokens[who]).json()["result"]["tools"]
    status = server.mcp("tools/call", {"name": "mcp.status", "arguments": {}}, token=tokens[who]).json()
    assert status["result"]["structuredContent"]["tool_count"] == len(listed)
    over_api = server.fetch("/api/mcp").json()
    assert over_api["tool_count"] == len(METHODS)  # the console's "N in all"

"""`POST /mcp` (docs/mcp.md) against a real server child: the official MCP client, then the wire rules
by hand."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import tornado.httpserver
import tornado.netutil
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

from handlers.base import BODY_LIMIT
from handlers.mcp import allowed_hosts, host_allowed
from tests.fakes import fake_vllm_bin
from tests.support.server import ADMIN_TOKEN, Server, free_port, start_server
from vllm_use import __version__
from vllm_use.abilities import build_registry
from vllm_use.app import build_context, make_app, shutdown
from vllm_use.config import build_parser, load
from vllm_use.executor import Executor
from vllm_use.registry import NoArgs, Result
from vllm_use.scopes import ADMIN_TOKEN_IDENTITY, READ, Scope, Surface

VERSION = "2026-07-28"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
REGISTRY = build_registry()
READ_TOOLS = [m.name for m in REGISTRY if m.public or m.scope.mcp is Scope.MCP_READ]
MCP_TOOLS = [m.name for m in REGISTRY if m.public or m.scope.mcp is not None]


@pytest.fixture(scope="module")
def keys(shared_server: Server) -> dict[str, str]:
    """One secret per scope set used below, created once for the module."""
    return {
        "read": shared_server.create_key("mcp.read")[1],
        "admin": shared_server.create_key("mcp.admin")[1],
    }


# --- the official client --------------------------------------------------------------------------


@asynccontextmanager
async def mcp_client(server: Server, secret: str, mode: str = VERSION) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx2.AsyncClient(headers=headers, trust_env=False, timeout=30) as http:
        transport = streamable_http_client(server.base_url + "/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(fn)


def test_read_key_lists_exactly_the_read_tools(shared_server: Server, keys: dict[str, str]) -> None:
    async def main() -> list[str]:
        async with mcp_client(shared_server, keys["read"]) as client:
            return [t.name for t in (await client.list_tools()).tools]

    names = run(main)
    assert names == READ_TOOLS
    assert {"test", "system.get", "settings.list"} <= set(names)
    assert not {"api_keys.list", "api_keys.create", "settings.update"} & set(names)


def test_admin_key_lists_every_mcp_tool_with_the_api_schemas(
    shared_server: Server, keys: dict[str, str]
) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["admin"]) as client:
            return (await client.list_tools()).tools

    tools = run(main)
    assert [t.name for t in tools] == MCP_TOOLS == [m.name for m in REGISTRY]
    for tool in tools:
        method = REGISTRY.get(tool.name)
        assert method is not None
        assert tool.description == method.description
        assert tool.input_schema == method.input_schema()
        assert tool.output_schema == method.output_schema()


def test_client_calls_test_and_gets_structured_content(shared_server: Server, keys: dict[str, str]) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["read"]) as client:
            return await client.call_tool("test", {"message": "hi"})

    result = run(main)
    assert result.is_error is False
    assert result.structured_content == {"ok": True, "message": "hi", "protocol": "mcp"}
    assert json.loads(result.content[0].text) == result.structured_content
    assert result.meta[SERVER_INFO_KEY]["name"] == "vllm-use"


def test_client_validates_system_get_against_its_output_schema(
    shared_server: Server, keys: dict[str, str]
) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["read"]) as client:
            # The client checks structuredContent against the listed outputSchema ($defs/$ref included).
            return await client.call_tool("system.get", {})

    result = run(main)
    assert result.is_error is False
    assert result.structured_content["version"]
    assert {t["name"] for t in result.structured_content["tools"]} == {"vllm", "hf", "nvidia-smi"}


def test_auto_mode_client_discovers_2026_without_initialize(
    shared_server: Server, keys: dict[str, str]
) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["read"], mode="auto") as client:
            session = client.session
            assert session.initialize_result is None
            assert session.protocol_version == VERSION
            tools = (await client.list_tools()).tools
            return session.discover_result, len(tools)

    discovered, count = run(main)
    assert discovered.supported_versions == [VERSION]
    assert discovered.capabilities.tools is not None
    assert discovered.cache_scope == "private"
    assert discovered.instructions
    assert count == len(READ_TOOLS)


def test_business_failure_is_an_is_error_result(shared_server: Server, keys: dict[str, str]) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["admin"]) as client:
            return await client.call_tool("api_keys.enable", {"id": "A" * 24})

    result = run(main)
    assert result.is_error is True
    assert result.structured_content is None  # it would have to match the tool's outputSchema
    assert result.content[0].text.startswith("not_found: ")
    assert json.loads(result.content[1].text)["error"]["code"] == "not_found"


def test_invalid_arguments_are_an_is_error_result(shared_server: Server, keys: dict[str, str]) -> None:
    async def main() -> Any:
        async with mcp_client(shared_server, keys["read"]) as client:
            return await client.call_tool("test", {"message": 123})

    result = run(main)
    assert result.is_error is True
    error = json.loads(result.content[1].text)["error"]
    assert error["code"] == "invalid_arguments"
    assert error["errors"][0]["loc"] == ["message"]


def test_client_sees_unknown_and_forbidden_tools_as_the_same_error(
    shared_server: Server, keys: dict[str, str]
) -> None:
    async def main() -> list[tuple[int, str]]:
        errors = []
        async with mcp_client(shared_server, keys["read"]) as client:
            for name in ("api_keys.list", "no_such.tool"):
                with pytest.raises(MCPError) as caught:
                    await client.call_tool(name, {})
                errors.append((caught.value.error.code, caught.value.error.message.replace(name, "<name>")))
        return errors

    forbidden, unknown = run(main)
    assert forbidden == unknown == (-32602, "Unknown tool: <name>")


# --- the wire, by hand --------------------------------------------------------------------------


def meta(version: Any = VERSION) -> dict[str, Any]:
    return {
        PROTOCOL_VERSION_META_KEY: version,
        CLIENT_CAPABILITIES_META_KEY: {},
        CLIENT_INFO_META_KEY: {"name": "vllm-use tests", "version": "0"},
    }


def request_body(method: str, params: dict[str, Any] | None = None, *, id: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": {"_meta": meta(), **(params or {})}}
    if id is not None:
        body["id"] = id
    return body


def routing_headers(method: str, name: str | None = None) -> list[tuple[str, str | bytes]]:
    headers: list[tuple[str, str | bytes]] = [("MCP-Protocol-Version", VERSION), ("Mcp-Method", method)]
    if name is not None:
        headers.append(("Mcp-Name", name))
    return headers


def post(
    server: Server,
    secret: str | None,
    body: Any,
    headers: list[tuple[str, str | bytes]],
    *,
    raw: bytes | None = None,
) -> httpx.Response:
    sent: list[tuple[str, str | bytes]] = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        *headers,
    ]
    if secret is not None:
        sent.append(("Authorization", f"Bearer {secret}"))
    content = raw if raw is not None else json.dumps(body).encode()
    return server.client.post(server.base_url + "/mcp", content=content, headers=sent)


def rpc(
    server: Server,
    secret: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    headers: list[tuple[str, str | bytes]] | None = None,
) -> httpx.Response:
    name = (params or {}).get("name") if method == "tools/call" else None
    return post(
        server,
        secret,
        request_body(method, params),
        routing_headers(method, name) if headers is None else headers,
    )


def assert_rpc_error(response: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    assert "result" not in body
    assert body["error"]["code"] == code, body
    return body


def test_raw_results_carry_result_type_server_info_and_cache_hints(
    shared_server: Server, keys: dict[str, str]
) -> None:
    results = {}
    for method, params in (("server/discover", None), ("tools/list", None), ("tools/call", {"name": "test"})):
        response = rpc(shared_server, keys["read"], method, params)
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("application/json")
        body = response.json()
        assert body["id"] == 1
        result = results[method] = body["result"]
        assert result["resultType"] == "complete"
        assert result["_meta"][SERVER_INFO_KEY] == {"name": "vllm-use", "version": __version__}
    for cacheable in ("server/discover", "tools/list"):
        assert results[cacheable]["cacheScope"] == "private"
        assert results[cacheable]["ttlMs"] >= 0
    assert results["server/discover"]["supportedVersions"] == [VERSION]
    assert results["server/discover"]["capabilities"] == {"tools": {"listChanged": False}}
    assert results["tools/call"]["structuredContent"] == {"ok": True, "message": "", "protocol": "mcp"}


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        pytest.param([("Mcp-Method", "tools/list")], -32020, id="missing"),
        pytest.param(
            [("MCP-Protocol-Version", VERSION)] * 2 + [("Mcp-Method", "tools/list")], -32020, id="repeated"
        ),
        pytest.param(
            [("MCP-Protocol-Version", f"{VERSION}, {VERSION}"), ("Mcp-Method", "tools/list")],
            -32022,
            id="joined",
        ),
        pytest.param(
            [("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Method", "tools/list")], -32022, id="older"
        ),
        pytest.param(
            [("MCP-Protocol-Version", f"{VERSION}x"), ("Mcp-Method", "tools/list")], -32022, id="suffix"
        ),
        pytest.param(
            [("MCP-Protocol-Version", "2026 -07-28"), ("Mcp-Method", "tools/list")], -32022, id="inner-space"
        ),
        pytest.param(
            [("MCP-Protocol-Version", VERSION.encode() + b"\xa0"), ("Mcp-Method", "tools/list")],
            -32022,
            id="nbsp",
        ),
    ],
)
def test_bad_protocol_version_header_is_400_naming_the_version(
    shared_server: Server, keys: dict[str, str], headers: list[tuple[str, str | bytes]], code: int
) -> None:
    response = rpc(shared_server, keys["read"], "tools/list", headers=headers)
    body = assert_rpc_error(response, 400, code)
    assert VERSION in body["error"]["message"]
    assert body["id"] == 1
    if code == -32022:
        sent = dict(headers)["MCP-Protocol-Version"]
        requested = sent.decode("latin-1") if isinstance(sent, bytes) else sent
        assert body["error"]["data"] == {"supported": [VERSION], "requested": requested}


def test_notification_with_an_unsupported_version_is_refused(
    shared_server: Server, keys: dict[str, str]
) -> None:
    body = request_body("notifications/cancelled", {"requestId": 7}, id=None)
    response = post(shared_server, keys["read"], body, [("MCP-Protocol-Version", "2025-11-25")])
    error = assert_rpc_error(response, 400, -32022)
    assert VERSION in error["error"]["message"]


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([("MCP-Protocol-Version", VERSION)], id="missing"),
        pytest.param([("MCP-Protocol-Version", VERSION), ("Mcp-Method", "tools/call")], id="mismatch"),
        pytest.param([("MCP-Protocol-Version", VERSION), ("Mcp-Method", "Tools/List")], id="case"),
        pytest.param([("MCP-Protocol-Version", VERSION)] + [("Mcp-Method", "tools/list")] * 2, id="repeated"),
    ],
)
def test_bad_mcp_method_header_is_header_mismatch(
    shared_server: Server, keys: dict[str, str], headers: list[tuple[str, str | bytes]]
) -> None:
    assert_rpc_error(rpc(shared_server, keys["read"], "tools/list", headers=headers), 400, -32020)


def b64(text: str) -> str:
    return f"=?base64?{base64.b64encode(text.encode()).decode()}?="


@pytest.mark.parametrize(
    ("body_name", "header_names"),
    [
        pytest.param("test", [], id="missing"),
        pytest.param("test", ["system.get"], id="mismatch"),
        pytest.param("test", ["test", "test"], id="repeated"),
        pytest.param("tést", ["tést".encode().decode("latin-1")], id="raw-non-ascii"),
        pytest.param("tést", [b64("tèst")], id="base64-other-name"),
        pytest.param("test", ["=?base64?dGVzdA=?="], id="base64-malformed"),
        pytest.param("tesu", ["=?base64?dGVzdR==?="], id="base64-non-canonical"),
        pytest.param("test", ["=?BASE64?dGVzdA==?="], id="sentinel-case"),
    ],
)
def test_bad_mcp_name_header_is_header_mismatch(
    shared_server: Server, keys: dict[str, str], body_name: str, header_names: list[str]
) -> None:
    headers = routing_headers("tools/call") + [("Mcp-Name", n.encode("latin-1")) for n in header_names]
    response = rpc(shared_server, keys["read"], "tools/call", {"name": body_name}, headers=headers)
    assert_rpc_error(response, 400, -32020)


def test_base64_mcp_name_is_decoded_before_comparison(shared_server: Server, keys: dict[str, str]) -> None:
    headers = routing_headers("tools/call", b64("test"))
    response = rpc(shared_server, keys["read"], "tools/call", {"name": "test"}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["isError"] is False


def test_base64_non_ascii_mcp_name_reaches_the_tool_lookup(
    shared_server: Server, keys: dict[str, str]
) -> None:
    headers = routing_headers("tools/call", b64("outil-été"))
    response = rpc(shared_server, keys["read"], "tools/call", {"name": "outil-été"}, headers=headers)
    body = assert_rpc_error(response, 400, -32602)
    assert body["error"]["message"] == "Unknown tool: outil-été"


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(None, id="no-params"),
        pytest.param({}, id="no-meta"),
        pytest.param({"_meta": "2026-07-28"}, id="meta-not-object"),
        pytest.param({"_meta": {PROTOCOL_VERSION_META_KEY: VERSION}}, id="no-capabilities"),
        pytest.param({"_meta": {CLIENT_CAPABILITIES_META_KEY: {}}}, id="no-version"),
    ],
)
def test_missing_meta_is_invalid_params(
    shared_server: Server, keys: dict[str, str], params: dict[str, Any] | None
) -> None:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    if params is not None:
        body["params"] = params
    response = post(shared_server, keys["read"], body, routing_headers("tools/list"))
    assert assert_rpc_error(response, 400, -32602)["id"] == 3


def test_meta_version_differing_from_the_header_is_header_mismatch(
    shared_server: Server, keys: dict[str, str]
) -> None:
    body = request_body("tools/list")
    body["params"]["_meta"][PROTOCOL_VERSION_META_KEY] = "2025-11-25"
    assert_rpc_error(post(shared_server, keys["read"], body, routing_headers("tools/list")), 400, -32020)


def test_malformed_params_are_invalid_params(shared_server: Server, keys: dict[str, str]) -> None:
    response = rpc(
        shared_server, keys["read"], "tools/call", {"name": 5}, headers=routing_headers("tools/call", "5")
    )
    assert_rpc_error(response, 400, -32602)


def test_notification_is_accepted_with_202_and_no_body(shared_server: Server, keys: dict[str, str]) -> None:
    body = request_body("notifications/cancelled", {"requestId": 7}, id=None)
    response = post(shared_server, keys["read"], body, routing_headers("notifications/cancelled"))
    assert response.status_code == 202
    assert response.content == b""


def test_unknown_method_is_404_method_not_found(shared_server: Server, keys: dict[str, str]) -> None:
    for method in ("resources/list", "initialize", "no/such"):
        assert_rpc_error(rpc(shared_server, keys["read"], method), 404, -32601)


def test_unknown_tool_and_out_of_scope_tool_get_the_same_error(
    shared_server: Server, keys: dict[str, str]
) -> None:
    answers = []
    for name in ("api_keys.create", "models.nonexistent"):
        response = rpc(shared_server, keys["read"], "tools/call", {"name": name, "arguments": {"name": "x"}})
        body = assert_rpc_error(response, 400, -32602)
        answers.append(json.dumps(body).replace(name, "<name>"))
    assert answers[0] == answers[1]
    assert "method=api_keys.create" in shared_server.log()  # refused by the executor, logged, not run


def test_bad_json_is_parse_error(shared_server: Server, keys: dict[str, str]) -> None:
    for raw in (b'{"jsonrpc": "2.0", "id": 1,', b"\xff\xfe", b'{"id": NaN}'):
        response = post(shared_server, keys["read"], None, routing_headers("tools/list"), raw=raw)
        assert assert_rpc_error(response, 400, -32700)["id"] is None


def test_batch_and_malformed_envelopes_are_invalid_request(
    shared_server: Server, keys: dict[str, str]
) -> None:
    for body in (
        [request_body("tools/list")],
        {**request_body("tools/list"), "jsonrpc": "1.0"},
        {**request_body("tools/list"), "id": True},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        "tools/list",
    ):
        assert_rpc_error(post(shared_server, keys["read"], body, routing_headers("tools/list")), 400, -32600)


@pytest.mark.parametrize("verb", ["GET", "DELETE", "PUT"])
def test_other_verbs_are_405(shared_server: Server, keys: dict[str, str], verb: str) -> None:
    response = shared_server.fetch("/mcp", verb, token=keys["read"])
    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"
    assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([("Origin", "http://evil.example")], id="foreign"),
        pytest.param([("Origin", "null")], id="null"),
        pytest.param([("Sec-Fetch-Site", "cross-site")], id="cross-site-without-origin"),
        pytest.param([("Origin", "http://evil.example"), ("Origin", "http://evil.example")], id="repeated"),
    ],
)
def test_cross_origin_request_is_403(
    shared_server: Server, keys: dict[str, str], headers: list[tuple[str, str | bytes]]
) -> None:
    response = rpc(shared_server, keys["read"], "tools/list", headers=routing_headers("tools/list") + headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_own_origin_is_served(shared_server: Server, keys: dict[str, str]) -> None:
    own = [("Origin", shared_server.base_url), ("Sec-Fetch-Site", "same-origin")]
    assert (
        rpc(
            shared_server, keys["read"], "tools/list", headers=routing_headers("tools/list") + own
        ).status_code
        == 200
    )


def test_trusted_origin_is_served(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--trusted-origins", "http://console.example:9000")
    try:
        _, secret = server.create_key("mcp.read")
        trusted = [("Origin", "http://console.example:9000"), ("Sec-Fetch-Site", "cross-site")]
        response = rpc(server, secret, "tools/list", headers=routing_headers("tools/list") + trusted)
        assert response.status_code == 200, response.text
        as_named = [("Host", "console.example:9000"), *trusted]  # reached under the trusted name
        response = rpc(server, secret, "tools/list", headers=routing_headers("tools/list") + as_named)
        assert response.status_code == 200, response.text
        other = [("Origin", "http://console.example:9001")]
        assert (
            rpc(server, secret, "tools/list", headers=routing_headers("tools/list") + other).status_code
            == 403
        )
    finally:
        server.stop()


@pytest.mark.parametrize(
    "hosts",
    [
        pytest.param(["evil.example"], id="foreign-name"),
        pytest.param(["evil.example:{port}"], id="foreign-name-our-port"),
        pytest.param(["127.0.0.1.evil.example:{port}"], id="loopback-lookalike"),
        pytest.param(["10.1.2.3:{port}"], id="other-ip-on-loopback-listener"),
    ],
)
def test_a_host_this_server_is_not_is_403_before_credentials(shared_server: Server, hosts: list[str]) -> None:
    # DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends its own Host.
    port = shared_server.base_url.rsplit(":", 1)[1]
    headers = [*routing_headers("tools/list"), *(("Host", h.format(port=port)) for h in hosts)]
    response = post(shared_server, None, request_body("tools/list"), headers)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "permission_denied"


@pytest.mark.parametrize("hosts", [["localhost:{port}", "evil.example"], ["user@localhost:{port}"]])
def test_a_repeated_or_malformed_host_never_reaches_mcp(shared_server: Server, hosts: list[str]) -> None:
    port = int(shared_server.base_url.rsplit(":", 1)[1])
    body = json.dumps(request_body("tools/list")).encode()
    lines = ["POST /mcp HTTP/1.1", *(f"Host: {h.format(port=port)}" for h in hosts)]
    lines += [f"{k}: {v}" for k, v in routing_headers("tools/list")] + [f"Content-Length: {len(body)}"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # httpx sends one Host only
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        status_line = sock.makefile("rb").readline()
    assert status_line.split()[1] in (b"400", b"403"), status_line  # Tornado answers 400 for some itself


@pytest.mark.parametrize(
    "host", ["localhost:{port}", "127.0.0.1:{port}", "127.0.0.5", "LocalHost", "[::1]:{port}"]
)
def test_loopback_hosts_are_served(shared_server: Server, keys: dict[str, str], host: str) -> None:
    port = shared_server.base_url.rsplit(":", 1)[1]
    headers = [*routing_headers("tools/list"), ("Host", host.format(port=port))]
    assert rpc(shared_server, keys["read"], "tools/list", headers=headers).status_code == 200


def test_the_host_rule_on_a_wildcard_listener_takes_ip_literals_but_no_other_names() -> None:
    for listen in ("0.0.0.0", "::"):  # noqa: S104 - a listen address, not a bind
        allowed = allowed_hosts(listen, ("https://console.example",))
        assert host_allowed("192.168.1.20:8080", listen, allowed)
        assert host_allowed("[fe80::1]:8080", listen, allowed)
        assert host_allowed("console.example", listen, allowed)
        assert not host_allowed("evil.example", listen, allowed)
    named = allowed_hosts("box.lan", ())
    assert host_allowed("box.lan:8080", "box.lan", named) and host_allowed("127.0.0.1", "box.lan", named)
    assert not host_allowed("192.168.1.20", "box.lan", named)


def test_admin_token_is_401_with_www_authenticate(shared_server: Server) -> None:
    assert shared_server.admin_token is not None
    response = rpc(shared_server, shared_server.admin_token, "tools/call", {"name": "test"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("scopes", [("admin.read",), ("admin.read", "admin.write"), ("inference",)])
def test_key_without_an_mcp_scope_is_401(shared_server: Server, scopes: tuple[str, ...]) -> None:
    _, secret = shared_server.create_key(*scopes)
    response = rpc(shared_server, secret, "tools/call", {"name": "test"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_missing_credential_is_401_even_for_test(shared_server: Server) -> None:
    response = post(
        shared_server,
        None,
        request_body("tools/call", {"name": "test"}),
        routing_headers("tools/call", "test"),
    )
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_body_is_capped_at_one_mib(shared_server: Server, keys: dict[str, str]) -> None:
    body = json.dumps(request_body("tools/call", {"name": "test"})).encode()
    headers = [*routing_headers("tools/call", "test"), ("Authorization", f"Bearer {keys['read']}")]

    def send(content: bytes | Iterator[bytes]) -> httpx.Response:
        # A fresh connection each: after a 413 the server drops the connection.
        with httpx.Client(trust_env=False, timeout=30) as client:
            return client.post(shared_server.base_url + "/mcp", content=content, headers=headers)

    at_limit = body + b" " * (BODY_LIMIT - len(body))  # JSON allows trailing whitespace
    assert send(at_limit).status_code == 200
    assert send(at_limit + b" ").status_code == 413
    assert send(iter([at_limit, b" "])).status_code == 413  # chunked: no Content-Length to refuse early


def test_every_response_is_no_store(shared_server: Server, keys: dict[str, str]) -> None:
    responses = [
        rpc(shared_server, keys["read"], "tools/list"),  # 200
        post(shared_server, keys["read"], request_body("x", id=None), routing_headers("x")),  # 202
        rpc(shared_server, keys["read"], "tools/list", headers=[]),  # 400
        rpc(shared_server, "vu_" + "A" * 48, "tools/list"),  # 401
        rpc(shared_server, keys["read"], "tools/list", headers=[("Origin", "http://evil.example")]),  # 403
        rpc(shared_server, keys["read"], "no/such"),  # 404
        shared_server.fetch("/mcp", "GET", token=keys["read"]),  # 405
    ]
    assert [r.status_code for r in responses] == [200, 202, 400, 401, 403, 404, 405]
    for response in responses:
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["Pragma"] == "no-cache"


def test_unexpected_exception_is_an_internal_error_result_and_a_logged_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In process, with one extra registry method that fails in a way nobody planned for."""
    args = build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path / "data"), "--admin-token", ADMIN_TOKEN]
    )
    context = build_context(load(args, environ={}))

    @context.registry.method("boom", "Fails unexpectedly.", NoArgs, Result, READ)
    async def boom(call: Any, args: NoArgs) -> dict[str, Any]:
        raise RuntimeError("detail-for-the-log-only")

    async def main() -> httpx.Response:
        executor = Executor(context.registry, context)
        created = await executor.call(
            "api_keys.create", {"name": "t", "scopes": ["mcp.read"]}, ADMIN_TOKEN_IDENTITY, Surface.API
        )
        [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(make_app(context))
        server.add_sockets([sock])
        headers = [*routing_headers("tools/call", "boom"), ("Authorization", f"Bearer {created['secret']}")]
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
                return await client.post(
                    url, json=request_body("tools/call", {"name": "boom"}), headers=headers
                )
        finally:
            server.stop()

    try:
        with caplog.at_level(logging.INFO):
            response = asyncio.run(main())
    finally:
        shutdown(context)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["isError"] is True
    assert "structuredContent" not in result
    assert result["content"][0]["text"].startswith("internal_error: ")
    assert "detail-for-the-log-only" not in response.text
    assert "RuntimeError: detail-for-the-log-only" in caplog.text


# --- long operations --------------------------------------------------------------------------------


@pytest.fixture
def loading_server(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    """A server whose fake vLLM loads for a minute, with one ready model; yields it and the model id."""
    fake = fake_vllm_bin(tmp_path / "bin", load_seconds=60, max_lifetime=120)
    server = start_server(tmp_path / "data", "--vllm-bin", str(fake), "--runtime-port", str(free_port()))
    (server.data_dir / "models" / "alpha").mkdir(parents=True)
    (server.data_dir / "models" / "alpha" / "config.json").write_text("{}")
    r = server.fetch("/api/models/local", "POST", json={"name": "alpha", "path": "alpha"})
    assert r.status_code == 201, r.text
    yield server, r.json()["model"]["id"]
    server.fetch("/api/runtime/stop", "POST")
    server.stop()


def test_runtime_switch_over_mcp_returns_while_vllm_still_loads(loading_server: tuple[Server, str]) -> None:
    """An agent's tool call is never held for the load (MCP clients commonly give up after 60 s)."""
    server, model_id = loading_server
    _, secret = server.create_key("mcp.runtime", "mcp.read", name="agent")

    async def main() -> list[Any]:
        async with mcp_client(server, secret) as client:  # the client checks each outputSchema
            begun = await client.call_tool("runtime.switch", {"model_id": model_id})
            busy = await client.call_tool("runtime.switch", {"model_id": model_id})
            stopped = await client.call_tool("runtime.stop", {})
            waited = await client.call_tool("runtime.switch", {"model_id": model_id, "wait": 1})
            return [begun, busy, stopped, waited]

    begun, busy, stopped, waited = run(main)
    assert begun.is_error is False
    assert begun.structured_content["state"] == "starting"  # the fake loads for a minute
    assert begun.structured_content["start_timeout_s"] == 900
    assert busy.is_error is True and busy.content[0].text.startswith("conflict: a start of ")
    assert stopped.structured_content["state"] == "stopped"
    assert waited.is_error is False and waited.structured_content["state"] == "starting"  # wait ran out

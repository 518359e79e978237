"""Fail-closed by construction: every route of the real Application needs credentials,
except an explicit allowlist. Runs the app in-process with pytest-tornado."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from handlers.api import ROUTES
from vllm_use import app as app_mod
from vllm_use import config as config_mod

PUBLIC = {"/healthz", "/(.*)", "/api/signin-hint"}  # liveness, the console's static files, its sign-in hint
NOT_FOUND = {r"/(?:api|v1)(?:/.*)?", r"/(?:mcp|tools)/.+"}  # JSON 404s: nothing to protect, nothing runs


@pytest.fixture
def app(tmp_path: Path):
    # With a tool enabled, so /tools is served (off, it is a 404 for everyone: docs/tools.md).
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--tools", "get_datetime"]
    args = config_mod.build_parser().parse_args(argv)
    config = config_mod.load(args, environ={"VLLM_USE_ADMIN_TOKEN": "route-test-admin-token-0123"})
    context = app_mod.build_context(config)
    yield app_mod.make_app(context)
    app_mod.shutdown(context)


def _example(pattern: str) -> str:
    path = re.sub(r"\(\?P<\w+>\[\^/\]\+\)", "A" * 24, pattern)
    path = re.sub(r"\(([^|()]+)\|[^()]*\)", r"\1", path)  # an alternation: its first branch
    return path.replace("/?", "").replace("\\.", ".").replace("\\/", "/").rstrip("$")


@pytest.mark.gen_test
async def test_every_route_refuses_requests_without_credentials(app, http_client, base_url) -> None:
    patterns = [rule.matcher.regex.pattern.rstrip("$") for rule in app.wildcard_router.rules]
    checked = 0
    for pattern in patterns:
        if pattern in PUBLIC or pattern in NOT_FOUND:
            continue
        path = _example(pattern)
        for verb in ("GET", "POST", "PUT", "DELETE"):
            body = b"{}" if verb in ("POST", "PUT") else None
            r = await http_client.fetch(base_url + path, method=verb, body=body, raise_error=False)
            assert r.code in (401, 405), (verb, path, r.code)
            if r.code == 401:
                checked += 1
    # every /api route (docs/api_methods.md) was reached, plus /api/methods, /api/openapi.json, /mcp,
    # /tools and /metrics
    assert checked >= len(ROUTES) + 5


@pytest.mark.gen_test
async def test_unknown_surface_paths_never_fall_back_to_the_console(app, http_client, base_url) -> None:
    for path in ("/api/x", "/v1/no-such-endpoint", "/mcp/x", "/api", "/tools/x"):
        r = await http_client.fetch(base_url + path, raise_error=False)
        assert r.code == 404
        assert r.headers["Content-Type"].startswith("application/json")
    r = await http_client.fetch(base_url + "/anything/else", raise_error=False)
    assert r.code == 200
    assert b"<title>vllm-use</title>" in r.body

"""Key policy (docs/observability.md, "Key limits"; docs/auth.md): expiry, the model list and the
limits (rpm, max_concurrent, tokens_per_day), each at its edge, with the 429 headers OpenAI's and
Anthropic's SDKs read, and `api_keys.update` over /api and MCP.

The gateway runs in this process against the fake upstream (tests/fakes/upstream.py), which
records what reached it and answers with usage, which fills the tokens of the day; the model list's
"as if unknown" needs router mode, so a second server has two deployments that never load
(`--no-autoload`). What a client cannot see (the refusal counters, a deleted key's state, the
stored policy's validation) is in tests/test_key_limits_unit.py.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support import deployments
from tests.support.server import Client, Server, eventually, start_app, start_server

try:  # anthropic ≥ 2 is built on httpx2 and refuses httpx clients
    import httpx2 as anthropic_httpx
except ImportError:  # pragma: no cover - older anthropic SDKs
    anthropic_httpx = httpx  # type: ignore[no-redef]

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}]}
STREAM = {**CHAT, "stream": True}
GO_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s")


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Client]:
    srv = start_app(
        tmp_path_factory.mktemp("limits") / "data", "--upstream", upstream.url, "--model-aliases", "fast=tiny"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Router mode: `llama` (alias `lm`) and `other`, never loaded; a name neither has is ours to 404."""
    srv = start_server(tmp_path_factory.mktemp("router") / "data", "--no-autoload")
    deployments.add_deployment(srv, "llama", aliases=["lm"])
    deployments.add_deployment(srv, "other")
    yield srv
    srv.stop()


def new_key(server: Client, scopes: tuple[str, ...] = ("inference",), **policy: Any) -> tuple[str, str]:
    r = server.fetch("/api/keys", "POST", json={"name": "limited", "scopes": list(scopes), **policy})
    assert r.status_code == 201, r.text
    return r.json()["key"]["id"], r.json()["secret"]


def chat(server: Client, secret: str, body: Any = CHAT) -> httpx.Response:
    return server.fetch("/v1/chat/completions", "POST", json=body, token=secret)


def key_of(server: Client, key_id: str) -> dict[str, Any]:
    return next(k for k in server.fetch("/api/keys").json()["keys"] if k["id"] == key_id)


def in_seconds(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat()


def seconds_of(duration: str) -> int:
    match = GO_DURATION.fullmatch(duration)
    assert match, duration
    hours, minutes, secs = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + secs


def ratelimit_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("x-ratelimit-")}


class HeldStream:
    """A streamed chat completion held open by the fake after its first chunk, read in a thread;
    `finished` is set once the client has read its end (or lost it)."""

    def __init__(self, server: Client, secret: str) -> None:
        self.first = threading.Event()
        self.finished = threading.Event()
        self.status: int | None = None
        self._thread = threading.Thread(target=self._run, args=(server, secret), daemon=True)
        self._thread.start()
        assert self.first.wait(30), "the held stream's first chunk never came"
        assert self.status == 200

    def _run(self, server: Client, secret: str) -> None:
        url, headers = server.base_url + "/v1/chat/completions", {"Authorization": f"Bearer {secret}"}
        try:
            with httpx.Client(trust_env=False, timeout=60) as client:
                with client.stream("POST", url, json=STREAM, headers=headers) as r:
                    self.status = r.status_code
                    chunks = r.iter_raw()
                    next(chunks, None)
                    self.first.set()
                    for _ in chunks:
                        pass
        finally:
            self.first.set()
            self.finished.set()


# --- rpm ------------------------------------------------------------------------------------------


def test_rpm_admits_n_requests_a_minute_and_refuses_the_next_with_openai_headers(
    gw: Client, upstream: FakeUpstream
) -> None:
    _, secret = new_key(gw, rpm=3)
    for remaining in (2, 1, 0):
        r = chat(gw, secret)
        assert r.status_code == 200, r.text
        assert ratelimit_headers(r) == {
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": "1m0s",  # the request just made leaves the window in 60 s
        }
    refused = chat(gw, secret)
    assert refused.status_code == 429
    # Retry-After: until the first of the three leaves the window; reset: until the last one does.
    assert 45 < int(refused.headers["retry-after"]) <= 60
    headers = ratelimit_headers(refused)
    assert 45 < seconds_of(headers.pop("x-ratelimit-reset-requests")) <= 60
    assert headers == {"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0"}
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "requests"  # OpenAI's type for a request limit
    assert "3 requests per minute" in refused.json()["error"]["message"]
    assert len(upstream.requests) == 3  # the refused one never reached the upstream


def test_rpm_window_survives_an_edit_of_the_key(gw: Client) -> None:
    key_id, secret = new_key(gw, rpm=2)
    assert [chat(gw, secret).status_code for _ in range(3)] == [200, 200, 429]
    r = gw.fetch(f"/api/keys/{key_id}", "PATCH", json={"name": "renamed"})
    assert r.status_code == 200 and r.json()["key"]["name"] == "renamed" and r.json()["key"]["rpm"] == 2
    assert chat(gw, secret).status_code == 429  # the two requests of this minute still count
    assert gw.fetch(f"/api/keys/{key_id}", "PATCH", json={"rpm": 3}).json()["key"]["rpm"] == 3
    ok = chat(gw, secret)
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "0"
    assert chat(gw, secret).status_code == 429
    cleared = gw.fetch(f"/api/keys/{key_id}", "PATCH", json={"rpm": None})
    assert cleared.json()["key"]["rpm"] is None
    free = chat(gw, secret)
    assert free.status_code == 200 and not ratelimit_headers(free)  # no limit, no headers


def test_openai_sdk_raises_rate_limit_error(gw: Client) -> None:
    _, secret = new_key(gw, rpm=1)
    client = openai.OpenAI(
        api_key=secret,
        base_url=gw.base_url + "/v1",
        http_client=httpx.Client(trust_env=False, timeout=30),
        max_retries=0,
    )
    client.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**CHAT)
    assert caught.value.status_code == 429
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "1"


def test_anthropic_sdk_raises_rate_limit_error_on_messages(gw: Client) -> None:
    _, secret = new_key(gw, rpm=1)
    message = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with anthropic_httpx.Client(trust_env=False, timeout=30) as http:
        client = anthropic.Anthropic(base_url=gw.base_url, http_client=http, max_retries=0, api_key=secret)
        client.messages.create(**message)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(**message)
    assert caught.value.status_code == 429
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert int(caught.value.response.headers["retry-after"]) >= 1


# --- max_concurrent -------------------------------------------------------------------------------


def test_max_concurrent_admits_n_at_once_and_gives_the_slot_back_however_a_request_ends(
    gw: Client, upstream: FakeUpstream
) -> None:
    _, secret = new_key(gw, max_concurrent=2)
    released = threading.Event()
    upstream.hold_after_first = released
    held = [HeldStream(gw, secret), HeldStream(gw, secret)]
    refused = chat(gw, secret)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert not ratelimit_headers(refused)  # concurrency has no OpenAI header; the key has no rpm
    assert "2 requests running" in refused.json()["error"]["message"]
    assert len(upstream.requests) == 2
    released.set()
    for stream in held:
        assert stream.finished.wait(30)
    upstream.hold_after_first = None
    # Every end gives the slot back: a success, an error answer (twice: with a leak, the next is 429)…
    assert eventually(lambda: chat(gw, secret).status_code == 200, timeout=10)
    for _ in range(2):
        assert chat(gw, secret, {**CHAT, "model": "no-such-model"}).status_code == 404  # the upstream's
    assert chat(gw, secret).status_code == 200
    # …and a client that leaves mid-stream.
    upstream.endless = True
    url, headers = gw.base_url + "/v1/chat/completions", {"Authorization": f"Bearer {secret}"}
    for _ in range(2):
        with httpx.Client(trust_env=False, timeout=30) as client:
            with client.stream("POST", url, json=STREAM, headers=headers) as r:
                assert r.status_code == 200
                next(r.iter_raw())
    upstream.endless = False
    assert eventually(lambda: chat(gw, secret).status_code == 200, timeout=10)


def test_openai_sdk_retries_after_retry_after_and_succeeds_once_the_stream_ended(
    gw: Client, upstream: FakeUpstream
) -> None:
    _, secret = new_key(gw, max_concurrent=1)
    released = threading.Event()
    upstream.hold_after_first = released
    held = HeldStream(gw, secret)
    seen: list[tuple[str, float, int | None]] = []

    def on_request(request: httpx.Request) -> None:
        seen.append(("request", time.monotonic(), None))

    def on_response(response: httpx.Response) -> None:
        seen.append(("response", time.monotonic(), response.status_code))
        if response.status_code == 429:
            assert response.headers["retry-after"] == "1"
            released.set()  # the running stream ends now, well within the Retry-After second
            assert held.finished.wait(30)

    hooks = {"request": [on_request], "response": [on_response]}
    client = openai.OpenAI(
        api_key=secret,
        base_url=gw.base_url + "/v1",
        http_client=httpx.Client(trust_env=False, timeout=30, event_hooks=hooks),
        max_retries=1,
    )
    completion = client.chat.completions.create(**CHAT)
    assert completion.choices[0].message.content == upstream.reply
    assert [(kind, status) for kind, _, status in seen] == [
        ("request", None),
        ("response", 429),
        ("request", None),
        ("response", 200),
    ]
    assert seen[2][1] - seen[1][1] >= 1.0  # the retry waited the Retry-After second


# --- tokens_per_day -------------------------------------------------------------------------------


def test_tokens_per_day_admits_while_the_days_tokens_are_below_the_limit(gw: Client) -> None:
    """Each answer's usage (streamed or not) counts once the request ended; the request that
    crosses the limit completes, the next one is refused."""
    _, probe = new_key(gw)
    usage = chat(gw, probe).json()["usage"]
    cost = usage["prompt_tokens"] + usage["completion_tokens"]
    assert cost > 0
    for limit, admitted in ((2 * cost, 2), (2 * cost + 1, 3)):
        _, secret = new_key(gw, tokens_per_day=limit)
        answers = []
        for n in range(admitted + 1):
            if n % 2:
                answers.append(chat(gw, secret))
            else:  # a stream's tokens count as much as the same answer's in one piece
                answers.append(chat(gw, secret, STREAM))
        assert [r.status_code for r in answers] == [200] * admitted + [429], limit
        left = [r.headers["x-ratelimit-remaining-tokens"] for r in answers]
        assert left == [str(limit - n * cost) for n in range(admitted)] + ["0"]
        assert {r.headers["x-ratelimit-limit-tokens"] for r in answers} == {str(limit)}
        refused = answers[-1]
        assert refused.json()["error"]["type"] == "tokens"
        midnight = 86_400 - int(time.time()) % 86_400
        assert abs(int(refused.headers["retry-after"]) - midnight) <= 2
        assert abs(seconds_of(refused.headers["x-ratelimit-reset-tokens"]) - midnight) <= 2


def test_the_days_tokens_survive_a_restart(tmp_path: Path, upstream: FakeUpstream) -> None:
    """Today's tokens per key start again from the day's rollups when vllm-use starts (the ledger's
    seed: docs/observability.md, "Token accounting"): a restart does not give a key a fresh day."""
    data, flags = tmp_path / "data", ("--upstream", upstream.url)
    srv = start_server(data, *flags)
    try:
        _, probe = new_key(srv)
        usage = chat(srv, probe).json()["usage"]
        cost = usage["prompt_tokens"] + usage["completion_tokens"]
        _, secret = new_key(srv, tokens_per_day=3 * cost)
        before = [chat(srv, secret) for _ in range(2)]
        assert [r.status_code for r in before] == [200, 200]
        assert [r.headers["x-ratelimit-remaining-tokens"] for r in before] == [str(3 * cost), str(2 * cost)]
    finally:
        srv.stop()  # SIGTERM: the audit's last batch and its rollups are written on the way out
    srv = start_server(data, *flags)
    try:
        after = [chat(srv, secret) for _ in range(2)]
        assert [r.status_code for r in after] == [200, 429]
        assert [r.headers["x-ratelimit-remaining-tokens"] for r in after] == [str(cost), "0"]
        assert after[1].json()["error"]["type"] == "tokens"
    finally:
        srv.stop()


# --- expiry ---------------------------------------------------------------------------------------


def test_key_works_until_it_expires_then_is_refused_like_a_disabled_one(gw: Client) -> None:
    key_id, secret = new_key(gw, expires_at=in_seconds(2))
    listed = key_of(gw, key_id)
    assert listed["expired"] is False and listed["usable"] is True
    assert abs(datetime.fromisoformat(listed["expires_at"]).timestamp() - time.time() - 2) < 2
    assert chat(gw, secret).status_code == 200  # now cached as verified
    refused = eventually(lambda: (r := chat(gw, secret)).status_code == 401 and r, timeout=10)
    disabled_id, disabled = new_key(gw)
    gw.fetch(f"/api/keys/{disabled_id}/disable", "POST")
    like_disabled = chat(gw, disabled)
    assert refused.json() == like_disabled.json()
    assert refused.json()["error"]["message"] == "unknown credential"
    assert refused.headers["www-authenticate"] == like_disabled.headers["www-authenticate"]
    assert key_of(gw, key_id)["expired"] is True and key_of(gw, key_id)["usable"] is False
    assert gw.fetch("/api/system", token=secret).status_code == 401  # every surface
    # Moving the expiry into the future gives the key back.
    r = gw.fetch(f"/api/keys/{key_id}", "PATCH", json={"expires_at": in_seconds(3600)})
    assert r.status_code == 200 and r.json()["key"]["expired"] is False
    assert chat(gw, secret).status_code == 200


# --- the model list -------------------------------------------------------------------------------


def test_model_outside_the_list_is_answered_exactly_as_an_unknown_one(router: Server) -> None:
    _, listed = new_key(router, models=["llama"])
    _, free = new_key(router)
    # n: the listed deployment, by name and by alias, passes the list (then: not loaded, 409).
    for model in ("llama", "lm"):
        r = chat(router, listed, {**CHAT, "model": model})
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_loaded", r.text
    # n+1: a deployment outside the list is a 404 byte for byte as a name nothing has.
    hidden = chat(router, listed, {**CHAT, "model": "other"})
    unknown = chat(router, free, {**CHAT, "model": "ghost"})
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.content.replace(b"other", b"X") == unknown.content.replace(b"ghost", b"X")
    assert hidden.json()["error"]["code"] == "model_not_found"
    varying = {"date", "x-request-id"}
    assert {k: v for k, v in hidden.headers.items() if k not in varying} == {
        k: v for k, v in unknown.headers.items() if k not in varying
    }  # "other" and "ghost" are both 5 letters: the same Content-Length too
    # Nor does GET /v1/models show it.
    listed_models = router.fetch("/v1/models", token=listed).json()["data"]
    assert sorted(m["id"] for m in listed_models) == ["llama", "lm"]
    assert {"llama", "lm", "other"} <= {
        m["id"] for m in router.fetch("/v1/models", token=free).json()["data"]
    }
    # A list that names the alias admits the deployment's own name too.
    _, by_alias = new_key(router, models=["lm"])
    assert chat(router, by_alias, {**CHAT, "model": "llama"}).status_code == 409
    assert chat(router, by_alias, {**CHAT, "model": "other"}).status_code == 404


def test_model_list_admits_a_model_alias_of_the_upstream(gw: Client, upstream: FakeUpstream) -> None:
    _, secret = new_key(gw, models=["tiny"])
    for model in ("tiny", "fast"):  # --model-aliases fast=tiny
        assert chat(gw, secret, {**CHAT, "model": model}).status_code == 200
    refused = chat(gw, secret, {**CHAT, "model": "other"})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert len(upstream.requests) == 2
    _, free = new_key(gw)
    upstream.models = ("tiny", "other")
    try:
        every = gw.fetch("/v1/models", token=free).json()["data"]
        mine = gw.fetch("/v1/models", token=secret).json()["data"]
    finally:
        upstream.models = ("tiny",)
    assert sorted(m["id"] for m in every) == ["fast", "other", "tiny"]
    assert sorted(m["id"] for m in mine) == ["fast", "tiny"]  # "other" does not exist for this key


# --- the policy's bounds and api_keys.update ------------------------------------------------------

EDGES = [
    ("rpm", 100_000, 100_001),
    ("max_concurrent", 10_000, 10_001),
    ("tokens_per_day", 10**12, 10**12 + 1),
    ("models", [f"m{i}" for i in range(64)], [f"m{i}" for i in range(65)]),
    ("models", ["a" * 256], ["a" * 257]),
]


@pytest.mark.parametrize(("field", "ok", "over"), EDGES)
def test_policy_bounds_at_their_edges(gw: Client, bounded: str, field: str, ok: Any, over: Any) -> None:
    """Create and update take the same policy fields: n passes, n+1 (and 0) is a 400 naming it."""
    low = 0 if field != "models" else []
    r = gw.fetch(f"/api/keys/{bounded}", "PATCH", json={field: ok})
    assert r.status_code == 200 and r.json()["key"][field] == ok and key_of(gw, bounded)[field] == ok
    for bad in (over, low):
        for method, path in (("POST", "/api/keys"), ("PATCH", f"/api/keys/{bounded}")):
            body = {field: bad, **({"name": "x", "scopes": ["inference"]} if method == "POST" else {})}
            r = gw.fetch(path, method, json=body)
            assert r.status_code == 400 and r.json()["error"]["errors"][0]["loc"][0] == field, r.text
    assert key_of(gw, bounded)[field] == ok


@pytest.fixture(scope="module")
def bounded(gw: Client) -> str:
    return new_key(gw)[0]


@pytest.fixture(scope="module")
def edited(gw: Client) -> str:
    """A key the refused edits leave as it was."""
    return new_key(gw, rpm=7, models=["tiny"])[0]


@pytest.mark.parametrize(
    "change",
    [
        {"rpm": 0},
        {"rpm": "5"},
        {"rpm": True},
        {"max_concurrent": 10_001},
        {"models": ["llama", "llama"]},
        {"models": ["bad name"]},
        {"expires_at": "2020-01-01T00:00:00Z"},
        {"expires_at": "2099-01-01T00:00:00"},
        {"expires_at": "tomorrow"},
        {"name": None},
        {"name": ""},
        {"scopes": ["admin.write"]},
        {"rpm": 5, "tokens_per_day": -1},
    ],
)
def test_update_validation_errors_change_nothing(gw: Client, edited: str, change: dict[str, Any]) -> None:
    key_id = edited
    before = key_of(gw, key_id)
    r = gw.fetch(f"/api/keys/{key_id}", "PATCH", json=change)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_arguments"
    assert key_of(gw, key_id) == before


def test_update_of_an_unknown_key_is_404(gw: Client) -> None:
    assert gw.fetch("/api/keys/" + "Z" * 24, "PATCH", json={"rpm": 5}).status_code == 404


@pytest.mark.parametrize(
    ("expires_at", "ok"),
    [
        ("past", False),
        ("9999-12-31T23:59:59Z", True),  # the last time an answer can show
        ("9999-12-31T23:59:59-00:01", False),  # a minute later, in the year 10000
    ],
)
def test_create_takes_an_expiry_in_the_future_up_to_year_9999(gw: Client, expires_at: str, ok: bool) -> None:
    given = in_seconds(-1) if expires_at == "past" else expires_at
    r = gw.fetch("/api/keys", "POST", json={"name": "x", "scopes": ["inference"], "expires_at": given})
    if ok:
        assert r.status_code == 201 and r.json()["key"]["expires_at"] == "9999-12-31T23:59:59.000Z"
    else:
        assert r.status_code == 400 and r.json()["error"]["errors"][0]["loc"] == ["expires_at"]


def test_mcp_admin_edits_a_key_and_mcp_read_cannot(gw: Client) -> None:
    key_id, _ = new_key(gw, rpm=5)
    _, admin = new_key(gw, ("mcp.admin",))
    _, reader = new_key(gw, ("mcp.read",))
    call = {"name": "api_keys.update", "arguments": {"id": key_id, "rpm": 9, "models": ["tiny"]}}
    r = gw.mcp("tools/call", call, token=admin)
    assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text
    assert r.json()["result"]["structuredContent"]["key"]["rpm"] == 9
    assert key_of(gw, key_id)["rpm"] == 9 and key_of(gw, key_id)["models"] == ["tiny"]
    denied = gw.mcp("tools/call", {**call, "arguments": {"id": key_id, "rpm": 1}}, token=reader)
    assert denied.json()["error"]["message"] == "Unknown tool: api_keys.update"
    assert key_of(gw, key_id)["rpm"] == 9
    # Over MCP, an admin key is out of reach, as for enable/disable/delete.
    admin_id, _ = new_key(gw, ("admin.read",))
    out = gw.mcp("tools/call", {**call, "arguments": {"id": admin_id, "rpm": 1}}, token=admin)
    assert out.json()["result"]["isError"] is True
    assert key_of(gw, admin_id)["rpm"] is None

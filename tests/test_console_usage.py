"""The Usage page, key limits on the API keys page and the overview's request rate, in a real
Chromium (docs/observability.md, "The Usage page"; docs/console.md).

One real server with the fake upstream (tests/fakes/upstream.py, whose answers carry `usage` as
vLLM's do); real /v1 requests with two keys, alice (3) and bob (1), and a third key, carol, that
sends none. What a user would notice: the charts hold those counts (read from the uPlot instance
each chart keeps on its element, not from pixels), the key and deployment filters narrow them, both themes draw
(screenshots `usage-light.png`, `usage-dark.png`), an empty range says so; a key's limits and
today's use on the API keys page, an edit that a reload shows, a refused value named under its
field with nothing changed; the overview's request rate after requests.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fakes.upstream import FakeUpstream, running
from tests.support.browser import Watched, new_page, screenshot, settled, sign_in
from tests.support.server import Server, eventually, start_server


def chat(server: Server, secret: str, text: str) -> dict[str, int]:
    """One non-streamed chat request; the token counts its answer reports."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    r = server.client.post(
        server.base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
    )
    assert r.status_code == 200, r.text
    return r.json()["usage"]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("data"), "--upstream", upstream.url)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def used(server: Server) -> dict[str, Any]:
    """Keys alice, bob, carol (and their ids); alice's 3 requests and bob's 1, with the tokens each
    answer reported, once /api/usage counts all four."""
    keys, secrets = {}, {}
    for name in ("alice", "bob", "carol"):
        keys[name], secrets[name] = server.create_key("inference", name=name)
    tokens = {name: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0} for name in ("alice", "bob")}
    for name, text in (
        ("alice", "hi"),
        ("alice", "tell me more about it"),
        ("alice", "ok"),
        ("bob", "hello there"),
    ):
        usage = chat(server, secrets[name], text)
        tokens[name]["requests"] += 1
        tokens[name]["prompt_tokens"] += usage["prompt_tokens"]
        tokens[name]["completion_tokens"] += usage["completion_tokens"]
    eventually(lambda: server.fetch("/api/usage").json()["totals"]["requests"] == 4)
    return {"keys": keys, "secrets": secrets, "tokens": tokens}


@pytest.fixture
def watched(browser: Browser, server: Server) -> Iterator[Watched]:
    page = new_page(browser, server.base_url, color_scheme="light")
    yield page
    page.page.context.close()
    page.assert_clean()


def chart_data(page: Page, chart: str) -> list[list[float | None]] | None:
    """What the chart draws: uPlot's columns, [days (s), series 1, …]; None when the element found
    was a chart being replaced (a new filter's answer arrived meanwhile)."""
    return page.locator(f'.usage-chart[data-chart="{chart}"]').evaluate(
        "(el) => el.uplot ? el.uplot.data : null"
    )


def series_colour(page: Page, chart: str, index: int) -> str:
    return page.locator(f'.usage-chart[data-chart="{chart}"]').evaluate(
        "(el, i) => el.uplot.series[i].stroke(el.uplot, i)", index
    )


def today_values(page: Page, chart: str) -> list[float | None]:
    """Each series' value on the last day (today, UTC)."""
    data = chart_data(page, chart)
    assert data is not None
    return [column[-1] for column in data[1:]]


def test_the_usage_page_charts_each_keys_requests_and_tokens_in_both_themes(
    watched: Watched, server: Server, used: dict[str, Any]
) -> None:
    page = watched.page
    alice, bob = used["tokens"]["alice"], used["tokens"]["bob"]
    sign_in(watched, server.admin_token or "", "/usage")
    expect(page.get_by_role("heading", name="Usage", level=1)).to_be_visible()
    expect(page.get_by_role("link", name="Usage", exact=True)).to_have_attribute("aria-current", "page")
    settled(page)

    # The last 30 UTC days, today last: every request and token of both keys.
    days = (chart_data(page, "requests") or [[]])[0]
    assert len(days) == 30 and days[-1] == time.time() // 86400 * 86400, days[-3:]
    assert today_values(page, "requests") == [4]
    assert today_values(page, "tokens") == [
        alice["prompt_tokens"] + bob["prompt_tokens"],
        alice["completion_tokens"] + bob["completion_tokens"],
    ]
    # The top keys, most tokens first.
    rows = page.locator(".usage-keys-table tbody tr")
    expect(rows).to_have_count(2)
    assert sum(alice.values()) > sum(bob.values())  # 3 requests against 1
    expect(rows.nth(0).locator("td")).to_have_text(
        ["alice", str(alice["requests"]), str(alice["prompt_tokens"]), str(alice["completion_tokens"])]
    )
    expect(rows.nth(1).locator("td").first).to_have_text("bob")
    screenshot(page, "usage-light")

    # The dark theme draws again, in its colours.
    light = series_colour(page, "requests", 1)
    button = page.locator("#theme-button")
    while page.locator("html").get_attribute("data-theme") != "dark":
        button.click()
    eventually(lambda: series_colour(page, "requests", 1) != light, timeout=5)
    assert today_values(page, "requests") == [4]
    screenshot(page, "usage-dark")

    # The key filter narrows the charts and the table to bob's, and is kept in the address.
    page.get_by_label("Key", exact=True).select_option(label="bob")
    expect(page).to_have_url(re.compile(r"key_id=" + used["keys"]["bob"]))
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td").first).to_have_text("bob")
    assert today_values(page, "requests") == [1]
    assert today_values(page, "tokens") == [bob["prompt_tokens"], bob["completion_tokens"]]
    # A shorter range: seven days.
    page.get_by_label("Range").select_option(label="Last 7 days")
    expect(page).to_have_url(re.compile(r"days=7"))
    eventually(lambda: len((chart_data(page, "requests") or [[]])[0]) == 7, timeout=5)
    assert today_values(page, "requests") == [1]


def test_a_key_without_requests_shows_an_empty_state_not_an_empty_chart(
    watched: Watched, server: Server, used: dict[str, Any]
) -> None:
    page = watched.page
    sign_in(watched, server.admin_token or "", f"/usage?key_id={used['keys']['carol']}")
    expect(page.get_by_text("No requests match these filters")).to_be_visible()
    expect(page.locator(".usage-chart")).to_have_count(0)
    expect(page.locator(".usage-totals .stat-value")).to_have_text(["0", "0", "0"])
    # All keys again: the charts are back.
    page.get_by_label("Key", exact=True).select_option(label="All keys")
    expect(page.locator(".usage-chart")).to_have_count(2)


def key_row(page: Page, name: str) -> Any:
    return page.locator(
        ".keys-table tbody tr", has=page.locator("td.key-name", has_text=re.compile(f"^{name}$"))
    )


def test_the_keys_page_shows_limits_and_todays_use_and_edits_a_limit(
    watched: Watched, server: Server, used: dict[str, Any]
) -> None:
    page = watched.page
    alice = used["tokens"]["alice"]
    alice_id = used["keys"]["alice"]
    # A key with every limit, and one whose expiry is past (written into the database: the API
    # refuses an expiry in the past, the store one before the key's creation).
    limited = server.fetch(
        "/api/keys",
        "POST",
        json={
            "name": "limited",
            "scopes": ["inference"],
            "models": ["tiny"],
            "rpm": 60,
            "max_concurrent": 2,
            "tokens_per_day": 50000,
            "expires_at": "2099-01-01T00:00:00Z",
        },
    )
    assert limited.status_code == 201, limited.text
    old_id, _ = server.create_key("inference", name="old")
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:  # a millisecond after its creation
        db.execute("UPDATE api_keys SET expires_at = created_at + 1 WHERE id = ?", (old_id,))

    sign_in(watched, server.admin_token or "", "/keys")
    settled(page)
    # The metrics scope is offered, with what it reads.
    expect(page.get_by_role("checkbox", name="metrics", exact=True)).to_be_visible()

    row = key_row(page, "limited")
    limits = row.locator("dl.key-limit-list dd")
    expect(limits).to_have_text([re.compile("2099"), "tiny", "60", "2", "50,000"])
    expect(key_row(page, "old").get_by_text("expired", exact=True).first).to_be_visible()
    # With its limits, the table still fits 1280 px: every row's actions in sight, no sideways scroll.
    sizes = page.locator(".keys-card .table-wrap").evaluate("(el) => [el.scrollWidth, el.clientWidth]")
    assert sizes[0] <= sizes[1], f"the keys table is {sizes[0]} px wide in a {sizes[1]} px box"
    # Alice: no limits, and what she used today.
    expect(key_row(page, "alice").locator("dl.key-limit-list dd")).to_have_text(
        ["never", "any", "no limit", "no limit", "no limit"]
    )
    today = alice["prompt_tokens"] + alice["completion_tokens"]
    expect(key_row(page, "alice").locator(".key-today")).to_have_text(f"{today:,} tokens3 requests")

    # Edit: 30 requests per minute; a reload shows it.
    key_row(page, "alice").get_by_role("button", name="Edit").click()
    dialog = page.get_by_role("dialog", name="Edit “alice”")
    dialog.get_by_label("Requests per minute").fill("30")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(key_row(page, "alice").locator('dd[data-limit="Requests/min"]')).to_have_text("30")
    page.reload()
    expect(key_row(page, "alice").locator('dd[data-limit="Requests/min"]')).to_have_text("30")
    assert next(k for k in server.fetch("/api/keys").json()["keys"] if k["id"] == alice_id)["rpm"] == 30

    # A refused value: named under its field, nothing changed.
    key_row(page, "alice").get_by_role("button", name="Edit").click()
    dialog = page.get_by_role("dialog", name="Edit “alice”")
    watched.expect_http_error(400)
    dialog.get_by_label("Requests per minute").fill("0")
    dialog.get_by_label("Tokens per day").fill("1000")
    dialog.get_by_role("button", name="Save").click()
    error = dialog.locator(".field", has=page.get_by_label("Requests per minute")).locator(".field-error")
    expect(error).to_be_visible()
    expect(dialog).to_be_visible()
    stored = next(k for k in server.fetch("/api/keys").json()["keys"] if k["id"] == alice_id)
    assert (stored["rpm"], stored["tokens_per_day"]) == (30, None)
    # Emptied, the limit is cleared.
    dialog.get_by_label("Requests per minute").fill("")
    dialog.get_by_label("Tokens per day").fill("")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(key_row(page, "alice").locator('dd[data-limit="Requests/min"]')).to_have_text("no limit")
    stored = next(k for k in server.fetch("/api/keys").json()["keys"] if k["id"] == alice_id)
    assert stored["rpm"] is None


def test_the_overview_shows_the_request_rate_after_requests(
    watched: Watched, server: Server, used: dict[str, Any]
) -> None:
    page = watched.page
    chat(server, used["secrets"]["bob"], "one more")  # within the last minute, whatever ran before
    sign_in(watched, server.admin_token or "", "/")
    rate = page.locator('.traffic-card [data-stat="rate"] .stat-value')
    expect(rate).to_have_text(re.compile(r"^\d+(\.\d+)? req/s$"))
    assert float(rate.inner_text().split()[0]) > 0
    expect(page.locator('.traffic-card [data-stat="streams"] .stat-value')).to_have_text("0")


def test_the_create_form_gives_a_new_key_its_limits(watched: Watched, server: Server) -> None:
    page = watched.page
    sign_in(watched, server.admin_token or "", "/keys")
    form = page.locator("form.key-form")
    form.get_by_label("Name", exact=True).fill("nightly")
    form.get_by_role("checkbox", name="inference", exact=True).check()
    form.get_by_label("Tokens per day").fill("1000")
    form.get_by_label("Models", exact=True).fill("tiny, other")
    form.get_by_role("button", name="Create key").click()
    page.get_by_role("dialog", name="Your new key").get_by_role("button", name="Done").click()
    expect(key_row(page, "nightly").locator("dl.key-limit-list dd")).to_have_text(
        ["never", "tiny, other", "no limit", "no limit", "1,000"]
    )
    stored = next(k for k in server.fetch("/api/keys").json()["keys"] if k["name"] == "nightly")
    assert (stored["tokens_per_day"], stored["models"], stored["rpm"]) == (1000, ["tiny", "other"], None)


def shows_today(page: Page, chart: str, values: list[float]) -> bool:
    """Whether `chart` is drawn (not being replaced) with `values` on its last day."""
    data = chart_data(page, chart)
    return data is not None and [column[-1] for column in data[1:]] == values


def test_the_deployment_filter_narrows_the_charts_to_one_deployment(
    watched: Watched, server: Server, used: dict[str, Any]
) -> None:
    """This server runs with `--upstream`, so its requests named no deployment; a day of dana's on a
    deployment `llama` is written into the rollups as the gateway of a router would have. The filter
    lists both, each narrows the charts to its own rows, and the choice is kept in the address."""
    dana, _ = server.create_key("inference", name="dana")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    with sqlite3.connect(server.data_dir / "vllm-use.db") as db:
        db.execute(
            "INSERT INTO usage_daily (day, key_id, deployment, requests, prompt_tokens, completion_tokens)"
            " VALUES (?, ?, 'llama', 5, 100, 50)",
            (today, dana),
        )
    page = watched.page
    all_requests = server.fetch("/api/usage").json()["totals"]["requests"]
    sign_in(watched, server.admin_token or "", "/usage")
    settled(page)
    picker = page.get_by_label("Deployment", exact=True)
    expect(picker.locator("option")).to_have_count(3)
    assert sorted(picker.locator("option").all_inner_texts()) == [
        "(no deployment)",
        "All deployments",
        "llama",
    ]
    assert today_values(page, "requests") == [all_requests]

    picker.select_option(label="llama")
    expect(page).to_have_url(re.compile(r"deployment=llama"))
    eventually(
        lambda: shows_today(page, "requests", [5]) and shows_today(page, "tokens", [100, 50]), timeout=5
    )
    rows = page.locator(".usage-keys-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td")).to_have_text(["dana", "5", "100", "50"])

    picker.select_option(label="(no deployment)")
    eventually(lambda: shows_today(page, "requests", [all_requests - 5]), timeout=5)
    expect(page).to_have_url(re.compile(r"deployment=(&|$)"))
    expect(page.locator(".usage-keys-table tbody tr", has_text="dana")).to_have_count(0)
    expect(rows.first).to_be_visible()

"""The Requests page (issue 17, finding 10; docs/console.md): key names instead of ids, filters the
server applies (key, model, status, time), no sideways scroll at 1280 px with paths on one line;
and tables on narrow screens: at 390 px every row is a card, so no action button sits off-screen
(here on the API keys and Requests pages).

A real server, real /v1 calls through its gateway to the fake upstream (keys "alice", "bob" and one
deleted since), a record with a long model name and one with a long request id, plus two rows
written straight into the database: a long path, and an old record for the time filter.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fakes.upstream import FakeUpstream, running
from tests.support.browser import Watched, new_page, screenshot, sign_in
from tests.support.server import Server, eventually, start_server

LONG_MODEL = "acme-research/an-unusually-long-model-repository-name-that-would-widen-the-table-v2"
LONG_REQUEST_ID = "trace-" + "0123456789abcdef" * 7
LONG_PATH = "/v1/chat/completions/" + "/".join(f"segment-{i}" for i in range(25))
OLD_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def chat(server: Server, secret: str, model: str, request_id: str | None = None) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {secret}"}
    if request_id:
        headers["X-Request-ID"] = request_id
    return server.client.post(
        server.base_url + "/v1/chat/completions", json=body, headers=headers
    ).status_code


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    """8 records: alice 3× (tiny 200, long model 404, tiny 200 with a long request id), bob 2×
    (tiny 200, nope 404), a deleted key 1× (tiny 200); alice's long path (200) and old one (503)."""
    srv = start_server(tmp_path_factory.mktemp("data"), "--upstream", upstream.url)
    try:
        keys, secrets = {}, {}
        for name in ("alice", "bob", "gone"):
            keys[name], secrets[name] = srv.create_key("inference", name=name)
        assert chat(srv, secrets["alice"], "tiny") == 200
        assert chat(srv, secrets["alice"], LONG_MODEL) == 404
        assert chat(srv, secrets["alice"], "tiny", LONG_REQUEST_ID) == 200
        assert chat(srv, secrets["bob"], "tiny") == 200
        assert chat(srv, secrets["bob"], "nope") == 404
        assert chat(srv, secrets["gone"], "tiny") == 200
        eventually(lambda: len(srv.fetch("/api/requests/recent").json()["requests"]) == 6)
        assert srv.fetch(f"/api/keys/{keys['gone']}", "DELETE").status_code == 200
        with sqlite3.connect(srv.data_dir / "vllm-use.db") as db:
            for audit_id, path, status, created in (
                ("au_" + "a" * 24, LONG_PATH, 200, int(time.time() * 1000)),
                ("au_" + "b" * 24, "/v1/chat/completions", 503, OLD_MS),
            ):
                db.execute(
                    "INSERT INTO audit_records (audit_id, request_id, key_id, method, path, model, status,"
                    " duration_ms, stream, created_at) VALUES (?, ?, ?, 'POST', ?, 'tiny', ?, 12.5, 1, ?)",
                    (audit_id, audit_id, keys["alice"], path, status, created),
                )
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def watched(browser: Browser, server: Server) -> Iterator[Watched]:
    """A signed-in page on /requests at 1280 px, in UTC (the time filter's inputs are local time)."""
    page = new_page(browser, server.base_url, timezone_id="UTC")
    sign_in(page, server.admin_token or "", "/requests")
    expect(page.page.get_by_role("heading", name="Requests", level=1)).to_be_visible()
    yield page
    page.page.context.close()
    page.assert_clean()


def rows(page: Page) -> Any:
    return page.locator(".requests-table tbody tr")


def key_cells(page: Page) -> list[str]:
    return [text.strip() for text in page.locator(".requests-table tbody td.requests-key").all_inner_texts()]


def test_keys_are_shown_by_name_and_the_table_fits_1280_px(watched: Watched) -> None:
    page = watched.page
    assert page.locator("body").get_attribute("data-page") == "requests"
    expect(rows(page)).to_have_count(8)
    names = key_cells(page)
    assert names.count("alice") == 5 and names.count("bob") == 2, names
    others = [n for n in names if n not in ("alice", "bob")]
    assert len(others) == 1 and others[0].startswith("deleted key "), names  # with its id
    gone = page.locator(".requests-table td.requests-key", has_text="deleted key")
    expect(gone).to_have_count(1)
    assert "id " in (gone.get_attribute("title") or "")

    # No sideways scroll: the table is no wider than its box.
    wrap = page.locator(".requests-table")
    sizes = wrap.evaluate("(el) => [el.scrollWidth, el.clientWidth]")
    assert sizes[0] <= sizes[1], f"the requests table is {sizes[0]} px wide in a {sizes[1]} px box"
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 1280

    # Long values stay on one line, cut with an ellipsis; the whole value is the cell's title.
    for text in (LONG_PATH, LONG_MODEL, LONG_REQUEST_ID):
        cell = page.locator(".requests-table td[title*='" + text[-20:] + "']").first
        expect(cell).to_be_visible()
        assert text in (cell.get_attribute("title") or "")
        # One line: the value's box is less than two of its lines high (a wrapped one is taller).
        height, size = cell.locator("code").evaluate(
            "(el) => [el.getBoundingClientRect().height, parseFloat(getComputedStyle(el).fontSize)]"
        )
        assert height < 2 * size, (text, height, size)
        text_width = cell.evaluate("(el) => [el.scrollWidth, el.clientWidth]")
        assert text_width[0] > text_width[1], f"{text[:30]}… is cut (ellipsis), not wrapped: {text_width}"
    screenshot(page, "requests-1280")


def test_filters_narrow_the_rows_and_stay_in_the_address(watched: Watched, server: Server) -> None:
    page = watched.page
    expect(rows(page)).to_have_count(8)
    key = page.get_by_label("Key", exact=True)
    expect(key.locator("option", has_text="bob")).to_have_count(1)
    key.select_option(label="bob")
    expect(rows(page)).to_have_count(2)
    assert set(key_cells(page)) == {"bob"}
    assert "key_id=" in page.url

    page.get_by_label("Status", exact=True).fill("4xx")
    page.get_by_label("Status", exact=True).press("Enter")
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first).to_have_attribute("data-status", "404")
    assert "status=4xx" in page.url

    # The address keeps the filters: a reload shows the same rows.
    page.reload()
    expect(rows(page)).to_have_count(1)
    expect(page.get_by_label("Status", exact=True)).to_have_value("4xx")
    expect(rows(page).first.locator("td.requests-model")).to_have_text("nope")

    page.get_by_role("button", name="Clear filters").first.click()
    expect(rows(page)).to_have_count(8)
    assert "?" not in page.url

    page.get_by_label("Model contains").fill("unusually-long")
    page.get_by_label("Model contains").press("Enter")
    expect(rows(page)).to_have_count(1)
    page.get_by_role("button", name="Clear filters").first.click()

    page.get_by_label("To", exact=True).fill("2023-11-15T00:00")
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first).to_have_attribute("data-status", "503")
    page.get_by_label("From", exact=True).fill("2023-11-14T23:00")  # an hour with no request
    expect(page.locator(".requests-body .empty:visible")).to_contain_text("No request matches these filters")
    expect(rows(page)).to_have_count(0)

    watched.expect_http_error(400)
    page.get_by_label("From", exact=True).fill("2023-11-15T01:00")  # after "To": said under "To"
    expect(page.locator(".requests-filters .field-error")).to_contain_text("is before since")
    expect(page.get_by_label("To", exact=True)).to_have_attribute("aria-invalid", "true")


def test_a_bad_status_is_named_under_its_field(watched: Watched) -> None:
    page = watched.page
    expect(rows(page)).to_have_count(8)
    watched.expect_http_error(400)
    status = page.get_by_label("Status", exact=True)
    status.fill("teapot")
    status.press("Enter")
    expect(page.locator(".requests-filters .field-error")).to_contain_text(
        "a status code (404) or class (4xx)"
    )
    expect(status).to_have_attribute("aria-invalid", "true")
    expect(rows(page)).to_have_count(8)  # the last good answer stays
    status.fill("5xx")
    status.press("Enter")
    expect(rows(page)).to_have_count(1)
    expect(page.locator(".requests-filters .field-error")).to_have_count(0)


def off_screen(page: Page, width: int) -> list[str]:
    """The visible buttons and table cells in <main> that end beyond the viewport's right edge (or
    start left of it), as "text: left–right"."""
    found: list[str] = page.locator("#page").evaluate(
        """(main, width) => [...main.querySelectorAll("button, a.button, .table-wrap td")]
            .filter((el) => el.getClientRects().length)
            .map((el) => [el, el.getBoundingClientRect()])
            .filter(([, r]) => r.width && (r.left < 0 || r.right > width + 0.5))
            .map(([el, r]) => `${el.textContent.trim().slice(0, 40)}: ${Math.round(r.left)}–${Math.round(r.right)}`)""",
        width,
    )
    return found


@pytest.mark.parametrize(
    ("path", "heading", "row"),
    [("/keys", "API keys", "tr[data-key-id]"), ("/requests", "Requests", "tr[data-audit-id]")],
)
def test_at_390_px_every_action_and_cell_is_on_screen(
    browser: Browser, server: Server, path: str, heading: str, row: str
) -> None:
    watched = new_page(browser, server.base_url)
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        sign_in(watched, server.admin_token or "", path)
        expect(page.get_by_role("heading", name=heading, level=1)).to_be_visible()
        expect(page.locator(row).first).to_be_visible()
        expect(page.locator(f"#page {row} td[data-label]").first).to_be_visible()
        if path == "/keys":
            expect(page.locator("[data-action=delete]")).to_have_count(2)  # alice, bob
        problems = off_screen(page, 390)
        assert not problems, f"{path} at 390 px, off-screen: {problems}"
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        # Each cell says which column it is.
        labels = (
            page.locator(f"#page {row}")
            .first.locator("td")
            .evaluate_all("(cells) => cells.map((c) => getComputedStyle(c, '::before').content)")
        )
        assert any("Status" in label for label in labels), labels
        screenshot(page, f"{path.strip('/')}-390")
    finally:
        page.context.close()
    watched.assert_clean()

"""The console's shell in a real Chromium: sign-in, where the credential lives, 401 → sign-in, theme, 360 px.

The server is the real one (tests/support/stack.py: fake `vllm`, real `hf` on a fake hub). Every test
asserts no console errors, no uncaught exceptions and no unexpected HTTP errors (tests/support/browser.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.support.browser import Watched, new_page, settled, sign_in
from tests.support.stack import Stack, console_stack

PAGES = [
    "/",
    "/models",
    "/downloads",
    "/deployments",
    "/runtime",  # not in the navigation, linked from the deployments page
    "/keys",
    "/requests",
    "/usage",
    "/settings",
    "/mcp-setup",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with console_stack(tmp_path_factory.mktemp("console-shell")) as running:
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    yield page
    page.page.context.close()
    page.assert_clean()


def storage(watched: Watched) -> dict[str, dict[str, str]]:
    return watched.page.evaluate(
        """() => ({session: Object.fromEntries(Object.entries(sessionStorage)),
                   local: Object.fromEntries(Object.entries(localStorage))})"""
    )


def test_signing_in_keeps_the_credential_for_the_tab_and_sends_it_only_as_a_bearer_header(
    watched: Watched, stack: Stack
) -> None:
    sent: list[tuple[str, str | None]] = []
    watched.page.on(
        "request",
        lambda r: sent.append((r.url, r.headers.get("authorization"))) if "/api/" in r.url else None,
    )
    token = stack.server.admin_token
    assert token
    sign_in(watched, token, "/models")
    expect(watched.page.get_by_role("heading", name="Models", level=1)).to_be_visible()
    assert watched.page.url == stack.url + "/models"  # back where the user was going
    kept = storage(watched)
    assert token in kept["session"].values() and token not in kept["local"].values()
    # The sign-in page's hint (where the token is: GET /api/signin-hint, public) goes before there is one.
    assert all(auth is None for url, auth in sent if url.endswith("/api/signin-hint"))
    sent = [(url, auth) for url, auth in sent if not url.endswith("/api/signin-hint")]
    assert sent and all(auth == f"Bearer {token}" for url, auth in sent)
    assert all(token not in url for url, _ in sent)
    # Reloading keeps the session; signing out forgets it.
    watched.page.reload()
    expect(watched.page.get_by_role("button", name="Sign out")).to_be_visible()
    watched.page.get_by_role("button", name="Sign out").click()
    expect(watched.page.get_by_label("Admin token or key")).to_be_visible()
    assert token not in str(storage(watched))


def test_remember_keeps_the_credential_in_local_storage_across_tabs(
    browser: Browser, watched: Watched, stack: Stack
) -> None:
    page = watched.page
    page.goto(stack.url + "/")
    page.get_by_label("Admin token or key").fill(stack.server.admin_token or "")
    page.get_by_label("Remember on this browser").check()
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    kept = storage(watched)
    assert stack.server.admin_token in kept["local"].values()
    assert stack.server.admin_token not in kept["session"].values()
    second = watched.page.context.new_page()
    second.goto(stack.url + "/keys")
    expect(second.get_by_role("heading", name="API keys", level=1)).to_be_visible()
    second.close()


def test_a_wrong_credential_is_refused_with_the_servers_reason_and_not_kept(
    watched: Watched, stack: Stack
) -> None:
    watched.expect_http_error(401)
    page = watched.page
    page.goto(stack.url + "/")
    page.get_by_label("Admin token or key").fill("vu_" + "A" * 48)
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("Not accepted")
    assert "vu_" not in str(storage(watched))
    # An empty field is caught before any request.
    page.get_by_label("Admin token or key").fill("")
    page.get_by_role("button", name="Sign in").click()
    expect(alert).to_contain_text("Paste a token or key first")


def test_a_401_anywhere_returns_to_sign_in_with_a_clear_message(watched: Watched, stack: Stack) -> None:
    key_id, secret = stack.server.create_key("admin.read", "admin.write", name="short-lived admin")
    sign_in(watched, secret)
    expect(watched.page.get_by_role("heading", name="Overview")).to_be_visible()
    assert stack.server.fetch(f"/api/keys/{key_id}", "DELETE").status_code in (200, 204)
    watched.expect_http_error(401)
    # The overview refreshes itself every 5 s: that request may meet the 401 before the click does
    # (then the navigation is gone already). Either way, the next request signs the page out.
    watched.page.evaluate("document.querySelector('nav a[data-route=\"/models\"]')?.click()")
    expect(watched.page.get_by_label("Admin token or key")).to_be_visible()
    expect(watched.page.get_by_role("alert")).to_contain_text("You were signed out")
    assert secret not in str(storage(watched))


def test_the_theme_follows_the_system_and_the_choice_survives_a_reload(
    browser: Browser, stack: Stack
) -> None:
    watched = new_page(browser, stack.url, color_scheme="dark")
    page = watched.page
    sign_in(watched, stack.server.admin_token or "")

    def background() -> str:
        return page.evaluate("getComputedStyle(document.body).backgroundColor")

    dark = background()
    assert dark == "rgb(15, 18, 22)"
    button = page.get_by_role("button", name="Theme: system (change)")
    button.click()  # system → light
    assert background() == "rgb(246, 247, 249)"
    page.reload()
    expect(page.get_by_role("button", name="Theme: light (change)")).to_be_visible()
    assert background() == "rgb(246, 247, 249)"
    page.get_by_role("button", name="Theme: light (change)").click()  # light → dark
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.context.close()
    watched.assert_clean()


def test_every_page_fits_360_px_and_the_menu_opens_from_the_keyboard(browser: Browser, stack: Stack) -> None:
    watched = new_page(browser, stack.url)
    page = watched.page
    page.set_viewport_size({"width": 360, "height": 740})
    sign_in(watched, stack.server.admin_token or "")
    for path in PAGES:
        page.goto(stack.url + path)
        settled(page)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360, f"{path} is {width} px wide at 360 px"
    menu = page.get_by_role("button", name="Menu")
    expect(page.get_by_role("link", name="Downloads")).to_be_hidden()
    menu.focus()
    page.keyboard.press("Enter")
    expect(menu).to_have_attribute("aria-expanded", "true")
    link = page.get_by_role("link", name="Downloads")
    link.focus()
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"  # focus is visible
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Downloads", level=1)).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "false")
    page.context.close()
    watched.assert_clean()


NAVIGATION = [
    "Overview",
    "Models",
    "Downloads",
    "Deployments",
    "Chat",
    "API keys",
    "Requests",
    "Usage",
    "Settings",
    "MCP",
]


def test_the_navigation_lists_deployments_where_the_runtime_was(watched: Watched, stack: Stack) -> None:
    sign_in(watched, stack.server.admin_token or "", "/deployments")
    links = watched.page.get_by_role("navigation").get_by_role("link")
    expect(links).to_have_text(NAVIGATION)
    expect(links.filter(has_text="Deployments")).to_have_attribute("aria-current", "page")
    # The top bar summarises every vLLM (none here) and leads to the deployments page.
    watched.page.get_by_role("link", name="Overview", exact=True).click()
    status = watched.page.locator("#topbar-status").get_by_role("link")
    expect(status).to_have_text("vLLM: none serving")
    status.click()
    expect(watched.page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()


def test_an_unknown_client_route_says_so(watched: Watched, stack: Stack) -> None:
    sign_in(watched, stack.server.admin_token or "")
    watched.page.goto(stack.url + "/nowhere")
    expect(watched.page.get_by_role("heading", name="Page not found")).to_be_visible()
    watched.page.get_by_role("link", name="Go to the overview.").click()
    expect(watched.page.get_by_role("heading", name="Overview")).to_be_visible()


def test_the_keys_create_form_reads_top_to_bottom_at_desktop_width(watched: Watched, stack: Stack) -> None:
    """Name, then the scopes, then "Create key", each starting at the form's left edge: no other
    page's stylesheet lays it out (chat.css once put Name top right, the button far from it)."""
    sign_in(watched, stack.server.admin_token or "", "/keys")
    form = watched.page.locator("form").filter(has=watched.page.get_by_role("heading", name="Create a key"))
    name = form.get_by_label("Name", exact=True)
    first_scope = form.get_by_role("checkbox").first
    button = form.get_by_role("button", name="Create key")
    boxes = [item.bounding_box() for item in (form, name, first_scope, button)]
    assert all(box is not None for box in boxes)
    whole, *parts = boxes
    assert [round(part["x"] - whole["x"]) < 40 for part in parts] == [True] * 3, boxes
    assert parts[0]["y"] < parts[1]["y"] < parts[2]["y"], boxes  # top to bottom

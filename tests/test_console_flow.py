"""The console end to end in a real Chromium (issue 6 acceptance), against a real server with the fake
`vllm` and the real `hf` on a fake hub (tests/support/stack.py).

One operator's day, in order: sign in → add a Hugging Face model, which downloads at once with live
progress → from the overview's first-run checklist ("Deploy"), through the deployments page to the Runtime page,
switch the runtime to it and see it ready (the start answers 202; the runtime's event stream brings
`ready` and the log; the top bar counts it once) → create an `inference` key and read its secret
once → the key works on /v1/models with curl → disable it in the console → the same curl gets 401
→ recent requests show the call that was let in and count the refused one. Then: bad input shows the
server's error next to its field, and a screenshot of every page in both themes (tests/support/browser.py
says where: `.cache/screenshots/` in a test run, `docs/screenshots/` under `make screenshots`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import Watched, new_page, screenshot, settled, sign_in
from tests.support.stack import SLOW_REPO, Stack, console_stack

PAGES = {
    "overview": "/",
    "models": "/models",
    "downloads": "/downloads",
    "runtime": "/runtime",
    "deployments": "/deployments",
    "keys": "/keys",
    "requests": "/requests",
    "settings": "/settings",
    "mcp": "/mcp-setup",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with console_stack(tmp_path_factory.mktemp("console-flow")) as running:
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    sign_in(page, stack.server.admin_token or "")
    yield page
    page.page.context.close()
    page.assert_clean()


def nav(page: Page, name: str) -> None:
    page.get_by_role("navigation").get_by_role("link", name=name, exact=True).click()
    expect(page.get_by_role("heading", name=name, level=1)).to_be_visible()


def to_runtime(page: Page) -> None:
    """The Runtime page is not in the navigation: the deployments page links to it."""
    nav(page, "Deployments")
    page.get_by_role("link", name="Runtime page", exact=True).click()
    expect(page.get_by_role("heading", name="Runtime", level=1)).to_be_visible()


def curl_models(stack: Stack, secret: str) -> int:
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--noproxy",
            "*",
            "-H",
            f"Authorization: Bearer {secret}",
            stack.url + "/v1/models",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout)


def test_an_operators_day_from_sign_in_to_a_disabled_key(watched: Watched, stack: Stack) -> None:
    page = watched.page
    # Add a Hugging Face model: its download starts at once, its row shows the progress live.
    nav(page, "Models")
    page.locator("form.add-model-form input[name='source']").fill(SLOW_REPO)
    page.get_by_role("button", name="Add model", exact=True).click()
    row = page.locator("tr", has_text=SLOW_REPO)
    expect(row.locator(".model-progress")).to_have_text(re.compile(r"^[1-9][0-9]? %$"), timeout=60_000)
    expect(row).to_have_attribute("data-status", "ready", timeout=60_000)
    expect(row.get_by_text("downloaded", exact=True)).to_be_visible()

    # Nothing runs: the overview's checklist leads to the deployments page ("Deploy"), which links to
    # the Runtime page, where one model runs alone.
    nav(page, "Overview")
    runtime_card = page.get_by_role("region", name="Runtime")
    expect(runtime_card.locator("dd").filter(has_text="none yet")).to_have_count(1)  # no deployment
    page.locator("section#first-run").get_by_role("link", name="Deploy", exact=True).click()
    expect(page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()
    page.get_by_role("link", name="Runtime page", exact=True).click()
    expect(page.get_by_role("heading", name="Runtime", level=1)).to_be_visible()

    # Switch the runtime to it: the start answers at once (202), the runtime's event stream says
    # when it is ready (the fake loads in 0.3 s; a busy machine may take longer).
    page.get_by_label("Model", exact=True).select_option(label=SLOW_REPO)
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.get_by_text(f"{SLOW_REPO} is serving.")).to_be_visible(timeout=60_000)  # the toast
    expect(page.locator("section.runtime-state")).to_have_attribute("data-state", "ready")
    expect(page.locator("pre.runtime-log")).to_contain_text("Uvicorn running on")  # the live log
    expect(page.locator("#topbar-status")).to_have_text("vLLM: 1 serving")  # its deployment, counted once

    # An inference key, its secret read once.
    nav(page, "API keys")
    page.get_by_label("Name", exact=True).fill("colleague")
    page.get_by_role("checkbox", name="inference", exact=True).check()
    page.get_by_role("button", name="Create key").click()
    dialog = page.get_by_role("dialog", name="Your new key")
    expect(dialog).to_be_visible()
    secret = dialog.get_by_label("Secret").input_value()
    assert secret.startswith("vu_")
    dialog.get_by_role("button", name="Done").click()
    expect(dialog).to_be_hidden()
    assert secret not in page.content()
    kept = page.evaluate("JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])")
    assert secret not in kept and secret not in page.url

    # The key works with curl; disabled in the console, the same curl gets 401.
    assert curl_models(stack, secret) == 200
    key_row = page.locator("tr", has_text="colleague")
    key_row.get_by_role("button", name="Disable").click()
    expect(key_row.get_by_text("disabled", exact=True)).to_be_visible()
    assert curl_models(stack, secret) == 401

    # Recent requests show the call that was let in; the refused one is counted, not recorded.
    nav(page, "Requests")
    rows = page.locator("tr[data-status]", has_text="/v1/models")
    expect(rows).to_have_count(1)
    expect(page.locator('tr[data-status="200"]', has_text="/v1/models")).to_have_count(1)
    expect(page.locator(".requests-failures")).to_contain_text("gateway 1")


def test_bad_input_shows_the_servers_error_next_to_the_field(watched: Watched) -> None:
    page = watched.page
    watched.expect_http_error(400)
    nav(page, "Models")
    form = page.locator("form.add-model-form")
    form.locator("input[name='source']").fill("acme/other")
    form.get_by_text("More options").click()
    form.get_by_label("Revision").fill("--help")
    form.get_by_role("button", name="Add model", exact=True).click()
    revision_error = form.locator(".field", has=page.get_by_label("Revision")).get_by_role("alert")
    expect(revision_error).to_contain_text("not starting with '-'")
    expect(form.get_by_label("Revision")).to_have_attribute("aria-invalid", "true")

    form.get_by_label("Revision").fill("main")
    form.get_by_label("Name (optional)").fill("n" * 300)
    form.get_by_role("button", name="Add model", exact=True).click()
    name_error = form.locator(".field", has=page.get_by_label("Name (optional)")).get_by_role("alert")
    expect(name_error).to_contain_text("at most 256 characters")
    expect(page.locator("tr", has_text="acme/other")).to_have_count(0)  # nothing was registered


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_screenshot_of_every_page_in_both_themes(browser: Browser, stack: Stack, theme: str) -> None:
    watched = new_page(browser, stack.url, color_scheme=theme)
    page = watched.page
    page.goto(stack.url + "/")
    screenshot(page, f"signin-{theme}")
    sign_in(watched, stack.server.admin_token or "")
    for name, path in PAGES.items():
        page.goto(stack.url + path)
        settled(page)
        screenshot(page, f"{name}-{theme}")
    page.context.close()
    watched.assert_clean()


def test_runtime_options_come_from_the_schema_and_server_errors_sit_by_their_field(
    watched: Watched, stack: Stack
) -> None:
    """Runs after the operator's day: a model is ready, so the button offers a switch with new options."""
    page = watched.page
    watched.expect_http_error(400)
    to_runtime(page)
    page.get_by_text("Options", exact=True).click()
    for label in ("Max model len", "GPU memory utilization", "Dtype", "Trust remote code"):
        expect(page.get_by_label(label, exact=True)).to_be_visible()  # generated from the JSON Schema
    utilization = page.get_by_label("GPU memory utilization", exact=True)
    utilization.fill("5")
    page.get_by_role("button", name="Switch", exact=True).click()
    error = page.locator(".field", has=utilization).locator(".field-error")
    expect(error).to_contain_text("less than or equal to 1")
    expect(page.locator("section.runtime-state")).to_have_attribute("data-state", "ready")  # nothing changed

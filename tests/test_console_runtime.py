"""The runtime page in a real Chromium while vLLM loads: a start answers 202 at once, the page follows
the runtime's event stream (no polling) and shows "starting…", then how the start ended; the top bar
counts the start once. The page is reached from the deployments page, not the navigation.

The fake vLLM here loads for a minute (so "starting" lasts until the test acts) and refuses a model
directory without config.json at once, like the real one (FAKE_VLLM_REQUIRE_CONFIG): `slow` loads,
`broken` fails with its last lines. The happy path to `ready` is in tests/test_console_flow.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import Watched, signed_in_on
from tests.support.stack import Stack, console_stack

START_TIMEOUT_MS = 30_000  # the fake refuses `broken` at once and shows `slow` loading at once


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    knobs = {"load_seconds": 60, "require_config": 1, "spawn_children": 2, "max_lifetime": 120}
    with console_stack(tmp_path_factory.mktemp("console-runtime"), vllm_knobs=knobs) as running:
        models = running.server.data_dir / "models"
        (models / "slow").mkdir(parents=True)
        (models / "slow" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (models / "broken").mkdir()
        (models / "broken" / "README.md").write_text("no config.json here")
        for name in ("slow", "broken"):
            r = running.server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
            assert r.status_code == 201, r.text
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    try:
        with signed_in_on(browser, stack.url, stack.server.admin_token or "", "/runtime", "Runtime") as page:
            yield page
    finally:
        stack.server.fetch("/api/runtime/stop", "POST")


def start(page: Page, model: str) -> None:
    page.get_by_label("Model", exact=True).select_option(label=model)
    page.get_by_role("button", name="Start", exact=True).click()


def test_a_start_shows_starting_and_the_live_log_until_a_stop_cancels_it(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    state = page.locator("section.runtime-state")
    start(page, "slow")

    expect(state).to_have_attribute("data-state", "starting")
    # The top bar counts it once: the runtime's events and its deployment's (runtime.switch saved one).
    topbar = page.locator("#topbar-status")
    expect(topbar).to_have_text("vLLM: 1 loading")
    expect(page.get_by_role("button", name="Starting…")).to_be_disabled()
    expect(state.get_by_text("Loading for", exact=True)).to_be_visible()
    expect(state).to_contain_text("of at most 15 min 0 s")  # the default start timeout, 900 s
    # vLLM's log arrives through the event stream while it loads.
    expect(page.locator("pre.runtime-log")).to_contain_text("Initializing a V1 LLM engine")
    assert stack.server.fetch("/api/runtime").json()["state"] == "starting"

    page.get_by_role("button", name="Stop", exact=True).click()
    dialog = page.get_by_role("dialog", name="Cancel the start?")
    dialog.get_by_role("button", name="Stop").click()

    expect(state).to_have_attribute("data-state", "stopped")
    expect(page.locator("form.run-form").get_by_role("alert")).to_contain_text("The start was canceled.")
    expect(page.get_by_role("button", name="Start", exact=True)).to_be_enabled()
    expect(topbar).to_have_text("vLLM: none serving")
    # Followed through the event streams: the page never asked for the log.
    sent: list[str] = watched.requests  # type: ignore[attr-defined]
    assert [r for r in sent if r.startswith("GET ") and r.endswith("/api/runtime/events")]
    assert [r for r in sent if r.startswith("GET ") and r.endswith("/api/runtime/events?log=false")]
    assert [r for r in sent if r.startswith("GET ") and r.endswith("/api/deployments/events")]
    assert not [r for r in sent if "/api/runtime/logs" in r]


def test_a_failed_start_shows_the_failure_with_its_last_lines(watched: Watched) -> None:
    page = watched.page
    start(page, "broken")

    failure = page.get_by_role("alert").filter(has=page.get_by_role("heading", name="vLLM failed"))
    expect(failure).to_be_visible(timeout=START_TIMEOUT_MS)
    expect(failure).to_contain_text("vllm exited with status 1")
    expect(failure.get_by_label("Last lines before the failure")).to_contain_text(
        "Invalid repository ID or local directory specified"
    )
    expect(page.locator("section.runtime-state")).to_have_attribute("data-state", "failed")
    expect(page.locator("form.run-form").get_by_role("alert")).to_contain_text("vLLM failed to start")
    expect(page.locator("#topbar-status")).to_have_text("vLLM: 1 failed")  # its deployment's, the same vLLM


def test_the_page_is_reached_from_the_deployments_page_and_links_back(watched: Watched) -> None:
    """Not in the navigation (Deployments took its place, and is marked while it is shown)."""
    page = watched.page
    navigation = page.get_by_role("navigation")
    expect(navigation.get_by_role("link", name="Runtime", exact=True)).to_have_count(0)
    deployments = navigation.get_by_role("link", name="Deployments", exact=True)
    expect(deployments).to_have_attribute("aria-current", "true")
    page.get_by_role("link", name="Deployments page", exact=True).click()
    expect(page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()
    expect(deployments).to_have_attribute("aria-current", "page")
    page.get_by_role("link", name="Runtime page", exact=True).click()
    expect(page.get_by_role("heading", name="Runtime", level=1)).to_be_visible()
    assert page.url.endswith("/runtime")

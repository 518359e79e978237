"""The downloads page in a real Chromium: the stalled marker, cancel, retry and the logs viewer.

The hub holds the big file after 1 MiB (`FakeHub.block`) and the server reports a download stalled
after 1 s without progress (`--download-stall-timeout 1`), so the marker can be seen coming and
going within a test. Everything else as in tests/test_console_flow.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.browser import Watched, new_page, sign_in
from tests.support.stack import FAST_REPO, SLOW_REPO, Stack, console_stack

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with console_stack(
        tmp_path_factory.mktemp("console-downloads"), "--download-stall-timeout", "1"
    ) as running:
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    sign_in(page, stack.server.admin_token or "", "/downloads")
    yield page
    page.page.context.close()
    page.assert_clean()


def start_blocked_download(stack: Stack, page: Page, repo: str, after_bytes: int) -> Locator:
    """Register `repo`, hold its weights file after `after_bytes`, start the download from the page."""
    stack.hub.block(repo, "model.safetensors", after_bytes=after_bytes)
    r = stack.server.fetch("/api/models/huggingface", "POST", json={"repository": repo})
    assert r.status_code == 201, r.text
    model_id = r.json()["model"]["id"]
    page.reload()
    page.get_by_label("Model", exact=True).select_option(model_id)
    page.get_by_role("button", name="Start download").click()
    card = page.locator(f"article.download[data-model-id='{model_id}']").first
    expect(card).to_have_attribute("data-status", "running")
    return card


def test_a_stalled_download_is_marked_and_the_marker_goes_when_bytes_flow_again(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    card = start_blocked_download(stack, page, SLOW_REPO, MiB)
    expect(card).to_have_attribute("data-stalled", "true", timeout=15_000)
    expect(card.get_by_text("stalled", exact=True)).to_be_visible()
    stack.hub.unblock()
    expect(card).to_have_attribute("data-status", "succeeded", timeout=30_000)
    expect(card).to_have_attribute("data-stalled", "false")
    expect(card.get_by_text("stalled", exact=True)).to_be_hidden()
    # The logs viewer shows what hf printed.
    card.get_by_role("button", name="Logs").click()
    expect(card.locator("pre.log")).to_be_visible()
    expect(card.locator("pre.log")).not_to_be_empty()


def test_cancel_asks_first_then_retry_finishes_the_download(watched: Watched, stack: Stack) -> None:
    page = watched.page
    card = start_blocked_download(stack, page, FAST_REPO, 1024)
    model_id = card.get_attribute("data-model-id")
    card.get_by_role("button", name="Cancel", exact=True).click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Keep downloading").click()  # asked, and nothing changed
    expect(card).to_have_attribute("data-status", "running")
    card.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel download").click()
    expect(card).to_have_attribute("data-status", "canceled", timeout=15_000)
    stack.hub.unblock()
    card.get_by_role("button", name="Retry").click()
    retried = page.locator(f"article.download[data-model-id='{model_id}'][data-status='succeeded']")
    expect(retried).to_have_count(1, timeout=30_000)

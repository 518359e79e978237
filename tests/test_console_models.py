"""The Models page in a real Chromium (issue 17, findings 1, 2 and 9; docs/console.md "Models"): one
"Add model" that checks the hub first and downloads at once, "Deploy" once downloaded, "Remove" for a
failed download, and the model that is served marked and protected before any dialog.

A real server with the fake `vllm` and the real `hf` on a fake hub (tests/support/stack.py), which
publishes acme/tiny-chat (24 MiB at about 8 MiB/s) and acme/instant; nothing else exists there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support import deployments
from tests.support.browser import Watched, new_page, screenshot, sign_in
from tests.support.server import eventually
from tests.support.stack import FAST_REPO, SLOW_REPO, Stack, console_stack

READY_WORD = re.compile(r"\bready\b")  # the API's word; the console says "downloaded" or "serving"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with console_stack(tmp_path_factory.mktemp("console-models")) as running:
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    sign_in(page, stack.server.admin_token or "", "/models")
    yield page
    page.page.context.close()
    page.assert_clean()


def models_named(stack: Stack, repository: str) -> list[dict[str, Any]]:
    return [m for m in stack.server.fetch("/api/models").json()["models"] if m["repository"] == repository]


def add_from_the_form(page: Page, source: str) -> None:
    form = page.locator("form.add-model-form")
    form.locator("input[name='source']").fill(source)
    form.get_by_role("button", name="Add model", exact=True).click()


def failed_download(stack: Stack, repository: str) -> str:
    """A model whose download failed, made the old way (register, then download): the hub has no
    such repository, so hf fails at once. Its id."""
    r = stack.server.fetch("/api/models/huggingface", "POST", json={"repository": repository})
    assert r.status_code == 201, r.text
    model_id = r.json()["model"]["id"]
    r = stack.server.fetch("/api/downloads", "POST", json={"model_id": model_id})
    assert r.status_code == 201, r.text
    eventually(
        lambda: stack.server.fetch(f"/api/models/{model_id}").json()["model"]["status"] == "failed",
        timeout=60,
    )
    return model_id


def test_add_model_downloads_at_once_and_the_row_offers_deploy(watched: Watched, stack: Stack) -> None:
    page = watched.page

    add_from_the_form(page, SLOW_REPO)

    row = page.locator("tr", has_text=SLOW_REPO)
    expect(row.get_by_text("downloading", exact=True)).to_be_visible()  # no separate Download step
    expect(row.locator(".model-progress")).to_have_text(re.compile(r"^(starting|queued|\d+ %|.*B)$"))
    screenshot(page, "models-add-downloading")
    expect(row).to_have_attribute("data-status", "ready", timeout=60_000)
    expect(row.get_by_text("downloaded", exact=True)).to_be_visible()
    (model,) = models_named(stack, SLOW_REPO)
    deploy = row.locator('a[data-action="deploy"]')
    expect(deploy).to_have_text("Deploy")
    expect(deploy).to_have_attribute("href", f"/deployments?model={model['id']}")
    expect(page.locator("table.models-table")).not_to_contain_text(READY_WORD)
    deploy.click()
    expect(page).to_have_url(re.compile(rf"/deployments\?model={model['id']}$"))


def test_a_mistyped_repository_shows_the_hubs_answer_and_registers_nothing(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    watched.expect_http_error(404)

    add_from_the_form(page, "acme/tiny-chatt")

    source_field = page.locator("form.add-model-form .field", has=page.locator("input[name='source']"))
    expect(source_field.get_by_role("alert")).to_contain_text(
        "acme/tiny-chatt was not found on the hub (check the spelling"
    )
    expect(page.locator("input[name='source']")).to_have_attribute("aria-invalid", "true")
    screenshot(page, "models-add-not-found")
    assert models_named(stack, "acme/tiny-chatt") == []
    expect(page.locator("tr", has_text="acme/tiny-chatt")).to_have_count(0)


def test_a_failed_download_offers_remove_which_removes_the_model_and_its_files(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    model_id = failed_download(stack, "acme/gone-before")
    row = page.locator(f"tr[data-model-id='{model_id}']")
    expect(row.get_by_text("failed", exact=True)).to_be_visible()
    expect(row.get_by_role("button", name="Retry")).to_be_visible()

    row.get_by_role("button", name="Remove").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Remove acme/gone-before?")
    dialog.get_by_role("button", name="Cancel").click()  # asked, and nothing changed
    expect(row).to_have_count(1)
    row.get_by_role("button", name="Remove").click()
    page.get_by_role("dialog").get_by_role("button", name="Remove").click()

    expect(row).to_have_count(0)
    assert stack.server.fetch(f"/api/models/{model_id}").status_code == 404
    assert not (stack.server.data_dir / "models" / model_id).exists()


def test_the_downloads_pages_failed_card_offers_remove_too(watched: Watched, stack: Stack) -> None:
    page = watched.page
    model_id = failed_download(stack, "acme/gone-again")
    page.get_by_role("navigation").get_by_role("link", name="Downloads", exact=True).click()
    card = page.locator(f"article.download[data-model-id='{model_id}']")
    expect(card).to_have_attribute("data-status", "failed")
    expect(card.get_by_text("failed", exact=True)).to_be_visible()

    card.get_by_role("button", name="Remove").click()
    page.get_by_role("dialog").get_by_role("button", name="Remove").click()

    expect(card.get_by_text("model no longer registered")).to_be_visible()
    expect(card.get_by_role("button", name="Remove")).to_be_hidden()
    assert stack.server.fetch(f"/api/models/{model_id}").status_code == 404


def test_the_served_model_is_marked_and_its_delete_is_refused_before_any_dialog(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    model_id = deployments.register(stack.server, "house-model")
    assert deployments.create(stack.server, {"name": "team-chat", "model_id": model_id}).status_code == 201
    r = deployments.load(stack.server, "team-chat")
    assert r.status_code == 200, r.text

    row = page.locator(f"tr[data-model-id='{model_id}']")
    expect(row).to_have_attribute("data-serving", "true")  # within one refresh
    expect(row.get_by_text("serving", exact=True)).to_be_visible()
    expect(row.locator(".model-users")).to_contain_text("team-chat")
    row.get_by_role("button", name="Delete").click()

    expect(row.get_by_role("alert")).to_contain_text(
        "house-model can't be deleted: it is used by the deployment team-chat"
    )
    expect(page.get_by_role("dialog")).to_have_count(0)
    assert model_id not in row.get_by_role("alert").inner_text()
    assert stack.server.fetch(f"/api/models/{model_id}").status_code == 200


def test_the_downloads_picker_says_when_every_model_is_downloaded_and_a_finished_card_offers_deploy(
    browser: Browser, tmp_path: Path
) -> None:
    with console_stack(tmp_path) as stack:
        r = stack.server.fetch("/api/models", "POST", json={"source": FAST_REPO})
        assert r.status_code == 201, r.text
        model_id = r.json()["model"]["id"]
        eventually(
            lambda: stack.server.fetch(f"/api/models/{model_id}").json()["model"]["status"] == "ready",
            timeout=60,
        )
        watched = new_page(browser, stack.url)
        sign_in(watched, stack.server.admin_token or "", "/downloads")
        page = watched.page

        form = page.locator("form.download-form")
        expect(form.get_by_role("status")).to_contain_text("Every registered model is downloaded.")
        expect(form.get_by_role("link", name="Add another model on the Models page")).to_have_attribute(
            "href", "/models"
        )
        expect(page.get_by_label("Model", exact=True)).to_contain_text("Every registered model is downloaded")
        card = page.locator(f"article.download[data-model-id='{model_id}']")
        expect(card.get_by_text("downloaded", exact=True)).to_be_visible()
        expect(card.locator('a[data-action="deploy"]')).to_have_attribute(
            "href", f"/deployments?model={model_id}"
        )
        expect(page.locator(".downloads-page")).not_to_contain_text(READY_WORD)
        page.context.close()
        watched.assert_clean()

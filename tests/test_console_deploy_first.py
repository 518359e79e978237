"""From a downloaded model to something serving, in a real Chromium (issue 17, findings 2, 8 and 9;
docs/router.md, "The Deployments page"):

- `/deployments?model=<id>` (the Models page's Deploy) opens the create form with that model, a
  valid name made from its name and, on this machine without GPUs (NVML missing), the CPU preset
  applied and the GPU options out of the way; "Create and load" creates and loads it, and the card
  goes loading → serving, then offers Chat and Connect a client;
- an option that needs another is refused by its field, and nothing is saved;
- a load that vLLM refuses says vLLM's reason right under the Load button;
- the Runtime page speaks the same words (serving, stopped; never "ready"), offers Chat and Connect
  a client while it serves, says why a start failed next to Start, and follows its event stream
  (no polling).

The fake vLLM (tests/fakes/vllm.py) loads for LOAD_S and, like the real one, reads the model's
config.json (max_position_embeddings) and refuses a directory without one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.browser import Watched, new_page, screenshot, sign_in, signed_in_on
from tests.support.deployments import register
from tests.support.gpus import gpu_server
from tests.support.server import free_port
from tests.support.stack import Stack, console_stack

LOAD_S = 1
START_TIMEOUT_MS = 30_000  # the fake is ready LOAD_S after its start; the bound only ends a hang
MODEL_NAME = "Tiny chat (v1)"
GPU_LABELS = ("Tensor parallel size", "Pipeline parallel size", "GPU IDs", "GPU memory utilization")
READY = re.compile(r"\bready\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    first = free_port()
    knobs = {"load_seconds": LOAD_S, "require_config": 1, "max_lifetime": 300}
    root = tmp_path_factory.mktemp("console-deploy-first")
    with console_stack(root, "--runtime-ports", f"{first}-{first + 9}", vllm_knobs=knobs) as running:
        models = running.server.data_dir / "models"
        (models / "tiny").mkdir(parents=True)
        (models / "tiny" / "config.json").write_text('{"max_position_embeddings": 2048}')
        (models / "tiny2").mkdir()
        (models / "tiny2" / "config.json").write_text('{"max_position_embeddings": 2048}')
        (models / "broken").mkdir()
        (models / "broken" / "README.md").write_text("no config.json here")
        for name, path in ((MODEL_NAME, "tiny"), ("tiny-two", "tiny2"), ("broken", "broken")):
            r = running.server.fetch("/api/models/local", "POST", json={"name": name, "path": path})
            assert r.status_code == 201, r.text
        yield running


def model_id(stack: Stack, name: str) -> str:
    [found] = [m for m in stack.server.fetch("/api/models").json()["models"] if m["name"] == name]
    return found["id"]


def saved(stack: Stack) -> list[dict[str, Any]]:
    r = stack.server.fetch("/api/deployments")
    assert r.status_code == 200, r.text
    return r.json()["deployments"]


def clean(stack: Stack) -> None:
    stack.server.fetch("/api/runtime/stop", "POST")
    for deployment in saved(stack):
        stack.server.fetch(f"/api/deployments/{quote(deployment['name'], safe='')}", "DELETE")


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    try:
        with signed_in_on(
            browser, stack.url, stack.server.admin_token or "", "/deployments", "Deployments"
        ) as page:
            yield page
    finally:
        clean(stack)


def card(page: Page, name: str) -> Locator:
    return page.get_by_role("article", name=name, exact=True)


def visible_text(page: Page) -> str:
    """What the page shows (innerText: closed disclosures and hidden elements are left out)."""
    return page.locator("main").inner_text()


def test_deploy_link_opens_the_form_with_the_cpu_preset_and_create_and_load_serves_it(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    tiny = model_id(stack, MODEL_NAME)
    page.goto(f"{stack.url}/deployments?model={tiny}")
    form = page.get_by_role("region", name="Create a deployment")
    expect(form.get_by_label("Model", exact=True)).to_have_value(tiny)
    expect(form.get_by_role("textbox", name="Name", exact=True)).to_have_value("Tiny-chat-v1")  # made valid
    # No GPU here (NVML missing): the CPU preset is on, and Options do not lead with GPU fields.
    preset = form.get_by_label("CPU preset", exact=True)
    expect(preset).to_be_checked()
    form.get_by_text("Options", exact=True).click()
    expect(form.get_by_label("Dtype", exact=True)).to_have_value("float32")
    expect(form.get_by_label("Max model len", exact=True)).to_have_value("2048")
    options = form.locator("details.deployment-options .schema-form")
    first_label = options.locator(".field label").first.inner_text().strip()
    assert first_label not in GPU_LABELS, first_label
    utilization = form.get_by_label("GPU memory utilization", exact=True)
    expect(utilization).to_be_hidden()  # under "GPU options", closed
    form.get_by_text("GPU options", exact=True).click()
    expect(utilization).to_be_visible()
    screenshot(page, "deployments-cpu-preset")
    # The toggle takes the preset back, and puts it again.
    preset.uncheck()
    expect(form.get_by_label("Dtype", exact=True)).to_have_value("")
    preset.check()
    expect(form.get_by_label("Dtype", exact=True)).to_have_value("float32")

    form.get_by_role("button", name="Create and load", exact=True).click()
    deployment = card(page, "Tiny-chat-v1")
    expect(deployment.locator(".badge")).to_have_text("loading")
    expect(deployment.locator(".badge")).to_have_text("serving", timeout=START_TIMEOUT_MS)
    [row] = saved(stack)
    assert row["model_id"] == tiny and row["instance"]["state"] == "ready"
    assert row["options"]["dtype"] == "float32" and row["options"]["max_model_len"] == 2048
    assert row["options"]["extra_args"] == [
        {"name": "--enforce-eager"},
        {"name": "--kv-cache-memory-bytes", "values": ["1G"]},
    ]

    # Next steps once it serves.
    chat = deployment.locator('a[data-action="chat"]')
    connect = deployment.locator('a[data-action="connect"]')
    expect(chat).to_have_text("Chat")
    expect(chat).to_have_attribute("href", "/chat?model=Tiny-chat-v1")
    expect(connect).to_have_text("Connect a client")
    expect(connect).to_have_attribute("href", "/?model=Tiny-chat-v1#connect")
    assert not READY.search(visible_text(page)), visible_text(page)

    deployment.get_by_role("button", name="Unload", exact=True).click()
    expect(deployment.locator(".badge")).to_have_text("deployed", timeout=START_TIMEOUT_MS)
    expect(chat).to_be_hidden()
    expect(connect).to_be_hidden()

    # Deploy again: the name made from the model's is free.
    page.goto(f"{stack.url}/deployments?model={tiny}")
    expect(form.get_by_role("textbox", name="Name", exact=True)).to_have_value("Tiny-chat-v1-2")


def test_an_option_that_needs_another_is_refused_by_its_field_and_nothing_is_saved(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    watched.expect_http_error(400)
    form = page.get_by_role("region", name="Create a deployment")
    form.get_by_role("textbox", name="Name", exact=True).fill("tools")
    form.get_by_text("Options", exact=True).click()
    form.get_by_label("Enable auto tool choice", exact=True).check()
    form.get_by_role("button", name="Create and load", exact=True).click()
    note = form.locator(".field", has=page.get_by_label("Enable auto tool choice", exact=True)).locator(
        ".field-error.server"
    )
    expect(note).to_contain_text("needs tool_call_parser")
    assert saved(stack) == []
    expect(page.get_by_role("article")).to_have_count(0)

    form.get_by_label("Tool call parser", exact=True).fill("hermes")
    form.get_by_role("button", name="Create", exact=True).click()
    expect(card(page, "tools")).to_be_visible()
    [row] = saved(stack)
    assert row["options"]["tool_call_parser"] == "hermes" and row["instance"]["state"] == "unloaded"


def test_a_refused_load_says_vllms_reason_right_under_the_load_button(watched: Watched, stack: Stack) -> None:
    page = watched.page
    # Above the model's 2048 positions: only vLLM can tell, at start.
    options = {"extra_args": [{"name": "--long-prefill-token-threshold", "values": ["4096"]}]}
    body = {"name": "too-long", "model_id": model_id(stack, MODEL_NAME), "options": options}
    assert stack.server.fetch("/api/deployments", "POST", json=body).status_code == 201
    deployment = card(page, "too-long")
    load = deployment.get_by_role("button", name="Load", exact=True)
    load.click()

    expect(deployment.locator(".badge")).to_have_text("failed", timeout=START_TIMEOUT_MS)
    reason = deployment.locator(".deployment-reason")
    expect(reason).to_contain_text(
        "long_prefill_token_threshold (4096) cannot be greater than the max_model_len (2048)"
    )
    # Next to the button that started it: the same block, right under it, both on the screen.
    control = deployment.locator(".deployment-control")
    expect(control.get_by_role("button", name="Load", exact=True)).to_be_visible()
    expect(control.locator(".deployment-reason")).to_be_visible()
    button_box, reason_box = load.bounding_box(), reason.bounding_box()
    assert button_box and reason_box
    assert 0 <= reason_box["y"] - (button_box["y"] + button_box["height"]) < 48, (button_box, reason_box)
    expect(reason).to_be_in_viewport()
    screenshot(page, "deployments-failed-load")
    expect(deployment.get_by_label("Last lines of too-long before the failure")).to_contain_text(
        "ValidationError"
    )


def test_the_runtime_page_says_serving_offers_next_steps_and_after_stop_nothing_serves(
    browser: Browser, stack: Stack
) -> None:
    with signed_in_on(browser, stack.url, stack.server.admin_token or "", "/runtime", "Runtime") as watched:
        page = watched.page
        state = page.locator("section.runtime-state")
        try:
            page.get_by_label("Model", exact=True).select_option(label="tiny-two")
            page.get_by_role("button", name="Start", exact=True).click()
            expect(state.locator(".badge")).to_have_text("serving", timeout=START_TIMEOUT_MS)
            expect(page.get_by_text("tiny-two is serving.")).to_be_visible()  # the toast
            served = stack.server.fetch("/api/runtime").json()["options"]["served_model_name"]
            chat = state.locator('a[data-action="chat"]')
            expect(chat).to_have_attribute("href", f"/chat?model={quote(served, safe='')}")
            expect(state.locator('a[data-action="connect"]')).to_have_attribute(
                "href", f"/?model={quote(served, safe='')}#connect"
            )
            assert not READY.search(visible_text(page)), visible_text(page)
            # vLLM's own port is labelled as internal: it skips keys and audit.
            expect(state).to_contain_text("(internal: clients use this server's /v1)")

            page.get_by_role("button", name="Stop", exact=True).click()
            page.get_by_role("dialog", name="Stop vLLM?").get_by_role("button", name="Stop").click()
            expect(state.locator(".badge")).to_have_text("stopped")
            expect(page.locator("#topbar-status")).to_have_text("vLLM: none serving")
            expect(chat).to_be_hidden()
            assert "serving" not in visible_text(page), visible_text(page)

            # A start vLLM refuses: its reason by the Start button, not only an exit status.
            page.get_by_label("Model", exact=True).select_option(label="broken")
            page.get_by_role("button", name="Start", exact=True).click()
            expect(page.locator("form.run-form").get_by_role("alert")).to_contain_text(
                "Invalid repository ID or local directory specified", timeout=START_TIMEOUT_MS
            )
            expect(state.locator(".state-note")).to_contain_text("Invalid repository ID or local directory")
            expect(state.locator(".badge")).to_have_text("failed")
        finally:
            clean(stack)
        # Followed through its event stream: the state was read once, never polled.
        sent: list[str] = watched.requests  # type: ignore[attr-defined]
        assert len([r for r in sent if r.startswith("GET ") and r.endswith("/api/runtime")]) == 1, sent


def test_where_nvml_shows_a_gpu_the_form_leads_with_gpu_options_and_the_preset_is_off_but_offered(
    browser: Browser, tmp_path: Path
) -> None:
    """On a GPU machine (faked: tests/support/gpus.py) the CPU preset is not applied by itself and the
    GPU options are where the schema puts them, first; the toggle still applies it on request."""
    server = gpu_server(tmp_path)
    try:
        alpha = register(server, "alpha")
        watched = new_page(browser, server.base_url)
        sign_in(watched, server.admin_token or "", f"/deployments?model={alpha}")
        page = watched.page
        form = page.get_by_role("region", name="Create a deployment")
        expect(form.get_by_role("textbox", name="Name", exact=True)).to_have_value("alpha")
        preset = form.get_by_label("CPU preset", exact=True)
        expect(preset).not_to_be_checked()
        form.get_by_text("Options", exact=True).click()
        expect(form.get_by_text("GPU options", exact=True)).to_have_count(0)
        options = form.locator("details.deployment-options .schema-form")
        assert options.locator(".field label").first.inner_text().strip() in GPU_LABELS
        expect(form.get_by_label("GPU memory utilization", exact=True)).to_be_visible()
        expect(form.get_by_label("Dtype", exact=True)).to_have_value("")
        preset.check()
        expect(form.get_by_label("Dtype", exact=True)).to_have_value("float32")
        form.get_by_role("button", name="Create", exact=True).click()
        expect(card(page, "alpha")).to_be_visible()
        [row] = server.fetch("/api/deployments").json()["deployments"]
        assert row["options"]["dtype"] == "float32" and row["instance"]["state"] == "unloaded"
        page.context.close()
        watched.assert_clean()
    finally:
        server.stop()

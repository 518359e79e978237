"""The console's first ten minutes (issue 17), in a real Chromium against a real server (the fake
`vllm`, the real `hf` on a fake hub: tests/support/stack.py): the sign-in page names the token file;
the Overview's first-run checklist follows the state and its machine card reports the machine;
"Connect a client" (on the Overview and in a new inference key's dialog) gives snippets that run as
written; the MCP page creates its key inline.

Snippets are read from the page and run as they are, in a subprocess: the Python ones with this
venv's python (which has `openai` and `anthropic`), the shell ones with bash and curl.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fakes import FAKE_VLLM
from tests.support.browser import new_page, screenshot, settled, signed_in_on
from tests.support.deployments import START_TIMEOUT_S, load, register
from tests.support.server import free_port, start_server
from tests.support.stack import FAST_REPO, HF, Stack, console_stack

ANSWER = "Echo: Say hello in one sentence."  # the fake vLLM echoes the snippets' prompt
DEPLOYMENT = "tiny"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A snippet as a user runs it; the bound only ends a hang (a request, and a Python start-up)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack with one deployment, `tiny`, loaded (serving)."""
    first = free_port()
    root = tmp_path_factory.mktemp("first-run-served")
    with console_stack(root, "--runtime-ports", f"{first}-{first + 9}") as stack:
        model_id = register(stack.server, "alpha")
        body = {"name": DEPLOYMENT, "model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}}
        r = stack.server.fetch("/api/deployments", "POST", json=body)
        assert r.status_code == 201, r.text
        r = load(stack.server, DEPLOYMENT)
        assert r.status_code == 200 and r.json()["state"] == "ready", r.text
        yield stack


def snippet(page: Page, kind: str, scope: str = "#connect") -> str:
    return page.locator(f'{scope} pre[data-snippet="{kind}"]').inner_text()


def test_the_sign_in_page_names_the_token_file_whose_token_signs_in(browser: Browser, tmp_path: Path) -> None:
    # As `make run` starts it: no VLLM_USE_ADMIN_TOKEN, so the server creates <data-dir>/admin-token.
    server = start_server(tmp_path / "data", "--vllm-bin", str(FAKE_VLLM), "--hf-bin", HF, admin_token=None)
    watched = new_page(browser, server.base_url)
    try:
        page = watched.page
        page.goto(server.base_url + "/")
        named = page.locator("code.token-file")
        expect(named).to_have_text(str(tmp_path / "data" / "admin-token"))
        expect(page.locator("code.token-read")).to_have_text(f"cat {tmp_path / 'data' / 'admin-token'}")
        screenshot(page, "signin-token-file")
        expect(page.get_by_text("VLLM_USE_ADMIN_TOKEN")).to_have_count(0)  # not set: not the way in
        token = Path(named.inner_text()).read_text().strip()  # the operator reads the file the page names
        page.get_by_label("Admin token or key").fill(token)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview", level=1)).to_be_visible()
        watched.page.context.close()
        watched.assert_clean()
    finally:
        server.stop()


def test_the_checklist_follows_a_fresh_data_dir_and_the_machine_is_shown(
    browser: Browser, tmp_path: Path
) -> None:
    with (
        console_stack(tmp_path) as stack,
        signed_in_on(browser, stack.url, stack.server.admin_token or "", "/", "Overview") as watched,
    ):
        page = watched.page
        checklist = page.locator("section#first-run")
        expect(checklist.locator('li[data-step="token"]')).to_have_attribute("data-done", "true")
        model_step = checklist.locator('li[data-step="model"]')
        expect(model_step).to_have_attribute("data-done", "false")
        for step in ("deployment", "key", "request"):
            expect(checklist.locator(f'li[data-step="{step}"]')).to_have_attribute("data-done", "false")
        # The first step is done in place: the add form is in the checklist, the Models page beside it.
        form = checklist.locator('.first-run-form[data-step="model"] form.add-model-form')
        expect(form.locator("input[name='source']")).to_be_editable()
        expect(model_step.get_by_role("link", name="Models page")).to_have_attribute("href", "/models")
        # No dead end: nothing offers "Start a model", and vLLM's own address is not the one to use.
        expect(page.get_by_text("Start a model")).to_have_count(0)
        runtime = page.get_by_role("region", name="Runtime")
        expect(runtime.get_by_text("Gateway upstream")).to_have_count(0)
        expect(runtime.locator("dd", has_text=stack.url + "/v1")).to_have_count(1)
        expect(runtime.get_by_text("internal: skips keys and audit")).to_be_visible()
        # The machine: CPUs, memory and free disk.
        machine = page.get_by_role("region", name="Machine")
        expect(machine.locator("dt", has_text="CPUs").locator("xpath=following-sibling::dd[1]")).to_have_text(
            str(os.cpu_count())
        )
        expect(machine.locator("dd", has_text="available of")).to_have_count(1)
        expect(machine.locator("dd", has_text="free of")).to_have_count(2)
        settled(page)
        screenshot(page, "first-run-checklist")
        page.get_by_role("link", name="Models page").click()
        expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()

        # A model is downloaded (through the API, as any client may): the step is done on the Overview.
        r = stack.server.fetch("/api/models/huggingface", "POST", json={"repository": FAST_REPO})
        assert r.status_code == 201, r.text
        model_id = r.json()["model"]["id"]
        r = stack.server.fetch("/api/downloads", "POST", json={"model_id": model_id})
        assert r.status_code == 201, r.text
        page.get_by_role("navigation").get_by_role("link", name="Overview", exact=True).click()
        # The overview refreshes every 5 s; the download of a few KiB ends within that.
        expect(model_step).to_have_attribute("data-done", "true", timeout=30_000)
        deploy = checklist.locator('li[data-step="deployment"]').get_by_role("link", name="Deploy")
        expect(deploy).to_have_attribute("href", f"/deployments?model={model_id}")


def test_connect_a_client_gives_an_openai_snippet_that_runs_as_written(
    browser: Browser, served: Stack
) -> None:
    with signed_in_on(
        browser, served.url, served.server.admin_token or "", f"/?model={DEPLOYMENT}#connect", "Overview"
    ) as watched:
        page = watched.page
        card = page.locator("section#connect.connect-card")
        expect(card).to_be_in_viewport()
        expect(card.locator("code.connect-url")).to_have_text(served.url + "/v1")
        expect(card.get_by_label("Model")).to_have_value(DEPLOYMENT)
        assert "<a key with the inference scope>" in snippet(page, "openai")  # no key yet: a placeholder
        expect(card.get_by_label("Key name")).to_have_value(
            f"client {datetime.datetime.now(datetime.UTC).date()}"
        )
        card.get_by_label("Key name").fill("laptop of a colleague")
        card.get_by_role("button", name="Create a key for this client").click()
        expect(card.get_by_text("Copy it now: it will not be shown again.")).to_be_visible()
        secret = card.get_by_label("Secret").input_value()
        assert secret.startswith("vu_")
        screenshot(page, "connect-a-client")
        code = snippet(page, "openai")
        assert secret in code and f'base_url="{served.url}/v1"' in code and f'model="{DEPLOYMENT}"' in code
        result = run([sys.executable, "-c", code])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == ANSWER
        # The other two, as written.
        result = run([sys.executable, "-c", snippet(page, "anthropic")])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == ANSWER
        result = run(["bash", "-c", snippet(page, "curl")])
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["choices"][0]["message"]["content"] == ANSWER
        # A model, a deployment, a key and a request: every first step is done, so the list is gone.
        expect(page.locator("section#first-run")).to_have_count(0, timeout=30_000)
    keys = {k["name"]: k for k in served.server.fetch("/api/keys").json()["keys"]}
    assert keys["laptop of a colleague"]["scopes"] == ["inference"]


def test_a_new_inference_keys_dialog_holds_the_snippet_with_its_secret(
    browser: Browser, served: Stack
) -> None:
    with signed_in_on(browser, served.url, served.server.admin_token or "", "/keys", "API keys") as watched:
        page = watched.page
        page.get_by_label("Name", exact=True).fill("ci runner")
        page.get_by_role("checkbox", name="inference", exact=True).check()
        page.get_by_role("button", name="Create key").click()
        dialog = page.get_by_role("dialog", name="Your new key")
        secret = dialog.get_by_label("Secret").first.input_value()
        expect(dialog.locator("code.connect-url")).to_have_text(served.url + "/v1")
        expect(dialog.get_by_label("Model")).to_have_value(DEPLOYMENT)
        code = snippet(page, "openai", scope="dialog")
        assert secret in code
        result = run([sys.executable, "-c", code])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == ANSWER
        dialog.get_by_role("button", name="Done").click()
        expect(dialog).to_be_hidden()
        assert secret not in page.content()  # gone with the dialog, snippets included

        # A key without the inference scope gets no client snippet: it could not call /v1.
        page.get_by_label("Name", exact=True).fill("watcher")
        page.get_by_role("checkbox", name="mcp.read", exact=True).check()
        page.get_by_role("button", name="Create key").click()
        expect(dialog).to_be_visible()
        expect(dialog.locator("pre[data-snippet]")).to_have_count(0)
        dialog.get_by_role("button", name="Done").click()


def test_the_mcp_page_creates_a_key_and_fills_it_into_its_examples(browser: Browser, served: Stack) -> None:
    with signed_in_on(browser, served.url, served.server.admin_token or "", "/mcp-setup", "MCP") as watched:
        page = watched.page
        card = page.get_by_role("region", name="A key for this agent")
        card.get_by_label("Key name").fill("my agent")
        card.get_by_label("Scopes").select_option("read")
        card.get_by_role("button", name="Create a key for this agent").click()
        expect(card.get_by_text("Copy it now: it will not be shown again.")).to_be_visible()
        secret = card.get_by_label("Secret").input_value()
        config = json.loads(page.locator("#mcp-config-json").inner_text())
        assert config["mcpServers"]["vllm-use"]["headers"]["Authorization"] == f"Bearer {secret}"
        result = run(["bash", "-c", page.locator("#mcp-curl-command").inner_text()])
        assert result.returncode == 0, result.stderr
        tools = {t["name"] for t in json.loads(result.stdout)["result"]["tools"]}
        assert "system.get" in tools and "api_keys.create" not in tools  # mcp.read's tools only
    keys = {k["name"]: k for k in served.server.fetch("/api/keys").json()["keys"]}
    assert keys["my agent"]["scopes"] == ["mcp.read"]

"""The deployments page in a real Chromium (docs/console.md, docs/router.md): create a deployment from the
form generated from deployments.create's schema, follow its instance live through
`GET /api/deployments/events` (no reload, no polling) as it loads and unloads, edit and delete it; bad
input shows the server's error by its field and saves nothing; a card's Log shows its instance's
output; Sleep and Wake act on a real instance where NVML shows GPUs (faked: tests/support/gpus.py).

The fake vLLM loads for LOAD_S seconds here, so `starting` lasts long enough to be seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.browser import Watched, new_page, settled, sign_in, signed_in_on
from tests.support.deployments import register
from tests.support.gpus import TOTAL, gpu_server, held
from tests.support.server import free_port
from tests.support.stack import Stack, console_stack
from vllm_use.deployments.instances import SLEEP_CHECK_S, WAKE_TIMEOUT_S

LOAD_S = 2
LONG_LINE = 3000
START_TIMEOUT_MS = 30_000  # the fake is ready LOAD_S after its start; the bound only ends a hang
BACKGROUND = {"light": "rgb(246, 247, 249)", "dark": "rgb(15, 18, 22)"}
SURFACE = {"light": "rgb(255, 255, 255)", "dark": "rgb(23, 27, 33)"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    first = free_port()
    knobs = {"load_seconds": LOAD_S, "max_lifetime": 300}
    # "talker" also prints lines of LONG_LINE bytes while it loads: its log must wrap them.
    talker = {"talker": {"lines": 3, "line_bytes": LONG_LINE}}
    flags = ("--runtime-ports", f"{first}-{first + 9}")
    root = tmp_path_factory.mktemp("console-deployments")
    with console_stack(root, *flags, vllm_knobs=knobs, vllm_by_name=talker) as running:
        for name in ("alpha", "beta"):
            directory = running.server.data_dir / "models" / name
            directory.mkdir(parents=True)
            (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
            r = running.server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
            assert r.status_code == 201, r.text
        yield running


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    try:
        with signed_in_on(
            browser, stack.url, stack.server.admin_token or "", "/deployments", "Deployments"
        ) as page:
            yield page
    finally:
        delete_all(stack)


def delete_all(stack: Stack) -> None:
    for deployment in saved(stack):
        r = stack.server.fetch(f"/api/deployments/{quote(deployment['name'], safe='')}", "DELETE")
        assert r.status_code == 200, r.text


def saved(stack: Stack) -> list[dict[str, Any]]:
    r = stack.server.fetch("/api/deployments")
    assert r.status_code == 200, r.text
    return r.json()["deployments"]


def card(page: Page, name: str) -> Locator:
    return page.get_by_role("article", name=name, exact=True)


def fact(deployment: Locator, label: str) -> Locator:
    return deployment.locator(".deployment-fact", has=deployment.page.get_by_text(label, exact=True)).locator(
        "dd"
    )


def create(page: Page, name: str, model: str = "alpha", **fields: str) -> None:
    form = page.get_by_role("region", name="Create a deployment")
    form.get_by_role("textbox", name="Name", exact=True).fill(name)
    form.get_by_label("Model", exact=True).select_option(label=model)
    for label, value in fields.items():
        form.get_by_label(label, exact=True).fill(value)
    form.get_by_role("button", name="Create", exact=True).click()


def test_create_load_and_unload_follow_the_events_without_a_reload(watched: Watched, stack: Stack) -> None:
    page = watched.page
    expect(page.get_by_text("No deployment yet")).to_be_visible()
    page.evaluate("window.sameDocument = true")  # gone if the page reloads

    create(page, "llama", Aliases="ll\nfast-llama", **{"Idle timeout (s)": "900"})
    llama = card(page, "llama")
    expect(llama).to_have_attribute("data-state", "unloaded")
    expect(fact(llama, "Aliases")).to_have_text("ll, fast-llama")
    expect(fact(llama, "Model")).to_have_text("alpha")
    expect(fact(llama, "When idle")).to_have_text("stop after 15 min 0 s idle")
    expect(page.get_by_text("No deployment yet")).to_be_hidden()
    [row] = saved(stack)
    assert row["name"] == "llama" and row["aliases"] == ["ll", "fast-llama"] and row["idle_timeout_s"] == 900
    assert row["instance"]["state"] == "unloaded"  # creating loads nothing

    llama.get_by_role("button", name="Load", exact=True).click()
    expect(llama).to_have_attribute("data-state", "starting")
    expect(llama.get_by_role("button", name="Unload", exact=True)).to_be_visible()  # it cancels a load
    expect(llama).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)
    port = saved(stack)[0]["instance"]["port"]
    expect(fact(llama, "Port")).to_have_text(str(port))
    expect(fact(llama, "In flight")).to_have_text("0")
    expect(fact(llama, "Idle deadline")).not_to_have_text("—")  # the idle timer runs from ready
    expect(llama.get_by_role("button", name="Load", exact=True)).to_be_hidden()
    # No instance here says it can sleep: no Sleep or Wake button.
    expect(llama.get_by_role("button", name="Sleep", exact=True)).to_have_count(0)
    expect(llama.get_by_role("button", name="Wake", exact=True)).to_have_count(0)

    llama.get_by_role("button", name="Unload", exact=True).click()
    expect(llama).to_have_attribute("data-state", "unloaded", timeout=START_TIMEOUT_MS)
    expect(fact(llama, "Port")).to_have_text("—")
    assert saved(stack)[0]["instance"]["state"] == "unloaded"

    assert page.evaluate("window.sameDocument") is True  # the page was never reloaded
    sent: list[str] = watched.requests  # type: ignore[attr-defined]
    assert [r for r in sent if r.startswith("GET ") and r.endswith("/api/deployments/events")]
    assert (
        len([r for r in sent if r.startswith("GET ") and r.endswith("/api/deployments")]) == 1
    )  # no polling


def test_bad_input_shows_the_fields_error_and_saves_nothing(watched: Watched, stack: Stack) -> None:
    page = watched.page
    watched.expect_http_error(400, 409)
    form = page.get_by_role("region", name="Create a deployment")
    name = form.get_by_role("textbox", name="Name", exact=True)

    create(page, "-starts-with-a-dash")
    expect(
        form.locator(".field", has=page.get_by_role("textbox", name="Name", exact=True)).locator(
            ".field-error"
        )
    ).to_contain_text("not of the expected form")
    expect(name).to_have_attribute("aria-invalid", "true")

    name.fill("ok")
    form.get_by_label("Idle timeout (s)", exact=True).fill("99999999")
    form.get_by_role("button", name="Create", exact=True).click()
    expect(
        form.locator(".field", has=page.get_by_label("Idle timeout (s)", exact=True)).locator(
            ".field-error.server"
        )
    ).to_contain_text("less than or equal to 604800")
    form.get_by_label("Idle timeout (s)", exact=True).fill("")
    form.get_by_label("Idle timeout (s)", exact=True).blur()  # the change event clears its note
    expect(form.locator(".field-error")).to_have_count(0)

    # An option of vLLM's, in the generated Options: its error sits by it, and Options opens. No GPU
    # here: the GPU options are under their own disclosure, at the end.
    form.get_by_text("Options", exact=True).click()
    form.get_by_text("GPU options", exact=True).click()
    utilization = form.get_by_label("GPU memory utilization", exact=True)
    utilization.fill("5")
    form.get_by_text("GPU options", exact=True).click()  # both closed again
    form.get_by_text("Options", exact=True).click()
    form.get_by_role("button", name="Create", exact=True).click()
    expect(
        form.locator(".field", has=page.get_by_label("GPU memory utilization", exact=True)).locator(
            ".field-error.server"
        )
    ).to_contain_text("less than or equal to 1")
    expect(utilization).to_be_visible()
    assert saved(stack) == []
    expect(page.get_by_role("article")).to_have_count(0)

    # A name taken by an alias: the server's message by the button.
    utilization.fill("")
    create(page, "first", Aliases="shared")
    expect(card(page, "first")).to_be_visible()
    create(page, "shared")
    expect(form.locator("p.error-text[role=alert]").last).to_contain_text(
        "the name shared is taken by deployment first"
    )
    assert [d["name"] for d in saved(stack)] == ["first"]


def test_edit_changes_the_saved_fields_and_a_loaded_one_says_restart_required(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    create(page, "org/gemma", Aliases="g")
    gemma = card(page, "org/gemma")
    expect(gemma).to_have_attribute("data-state", "unloaded")
    gemma.get_by_role("button", name="Load", exact=True).click()
    expect(gemma).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)

    gemma.get_by_role("button", name="Edit", exact=True).click()
    editor = page.get_by_role("form", name="Edit org/gemma")
    expect(editor.get_by_label("Aliases", exact=True)).to_have_value("g")  # filled from what is saved
    expect(editor.get_by_label("Model", exact=True)).to_have_value(saved(stack)[0]["model_id"])
    editor.get_by_label("Aliases", exact=True).fill("")  # no aliases left: an empty list is sent
    editor.get_by_label("Model", exact=True).select_option(label="beta")
    editor.get_by_label("Pinned", exact=True).check()
    editor.get_by_role("button", name="Save", exact=True).click()

    expect(editor).to_have_count(0)
    expect(gemma.get_by_text("restart required", exact=True)).to_be_visible()
    expect(fact(gemma, "Model")).to_have_text("beta")
    expect(fact(gemma, "Aliases")).to_have_text("—")
    expect(gemma.get_by_text("pinned", exact=True)).to_be_visible()
    [row] = saved(stack)
    assert row["aliases"] == [] and row["pinned"] is True and row["instance"]["restart_required"] is True

    # Unload and load again: it runs as saved now.
    gemma.get_by_role("button", name="Unload", exact=True).click()
    expect(gemma).to_have_attribute("data-state", "unloaded", timeout=START_TIMEOUT_MS)
    expect(gemma.get_by_text("restart required", exact=True)).to_have_count(0)

    gemma.get_by_role("button", name="Delete", exact=True).click()
    dialog = page.get_by_role("dialog", name="Delete org/gemma?")
    dialog.get_by_role("button", name="Delete").click()
    expect(gemma).to_have_count(0)
    assert saved(stack) == []
    expect(page.get_by_text("No deployment yet")).to_be_visible()


def test_sleep_and_wake_act_on_the_instance_where_nvml_shows_gpus(
    browser: Browser, watched: Watched, stack: Stack, tmp_path: Path
) -> None:
    """On a GPU machine (faked: tests/support/gpus.py, vLLM's sleep mode and NVML's memory check run
    for real against the fakes), Sleep puts the instance to sleep and Wake wakes the same process;
    on this machine as it is (no NVML), a deployment with idle_action sleep shows neither button."""
    plain = watched.page
    form = plain.get_by_role("region", name="Create a deployment")
    form.get_by_label("Idle action", exact=True).select_option("sleep")
    create(plain, "dozy-here")
    here = card(plain, "dozy-here")
    here.get_by_role("button", name="Load", exact=True).click()
    expect(here).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)
    assert (
        saved(stack)[0]["idle_action"] == "sleep" and saved(stack)[0]["instance"]["sleep_supported"] is False
    )
    expect(here.get_by_role("button", name="Sleep", exact=True)).to_have_count(0)
    expect(here.get_by_role("button", name="Wake", exact=True)).to_have_count(0)

    server = gpu_server(tmp_path)
    try:
        model_id = register(server, "alpha")
        options = {"start_timeout_s": START_TIMEOUT_MS // 1000, "gpu_memory_utilization": 0.5}
        body = {"name": "dozy", "model_id": model_id, "options": options, "idle_action": "sleep"}
        r = server.fetch("/api/deployments", "POST", json=body)
        assert r.status_code == 201, r.text
        gpu = new_page(browser, server.base_url)
        sign_in(gpu, server.admin_token or "", "/deployments")
        page = gpu.page
        dozy = card(page, "dozy")
        dozy.get_by_role("button", name="Load", exact=True).click()
        expect(dozy).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)
        pid = server.fetch("/api/deployments/dozy").json()["instance"]["pid"]
        expect(dozy.get_by_role("button", name="Wake", exact=True)).to_be_hidden()

        dozy.get_by_role("button", name="Sleep", exact=True).click()
        expect(dozy).to_have_attribute("data-state", "sleeping")
        expect(dozy.locator(".badge")).to_have_text("sleeping")
        expect(dozy.get_by_role("button", name="Sleep", exact=True)).to_be_hidden()
        # Wake appears once the sleep is done: vLLM says so and NVML shows its memory given back.
        expect(dozy.get_by_role("button", name="Wake", exact=True)).to_be_visible(
            timeout=SLEEP_CHECK_S * 1000
        )
        assert server.fetch("/api/deployments/dozy").json()["instance"]["asleep"] is True
        assert held(server, pid) < 0.1 * int(0.5 * TOTAL)

        dozy.get_by_role("button", name="Wake", exact=True).click()
        expect(dozy).to_have_attribute("data-state", "ready", timeout=WAKE_TIMEOUT_S * 1000)
        expect(dozy.get_by_role("button", name="Wake", exact=True)).to_be_hidden()
        expect(dozy.get_by_role("button", name="Sleep", exact=True)).to_be_visible()
        woken = server.fetch("/api/deployments/dozy").json()["instance"]
        assert woken["pid"] == pid and held(server, pid) == int(0.5 * TOTAL)  # the same process, awake
        page.context.close()
        gpu.assert_clean()
    finally:
        server.stop()


def test_a_cards_log_shows_its_instance_output_and_follows_its_events(watched: Watched, stack: Stack) -> None:
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    create(page, "talker")
    talker = card(page, "talker")
    expect(talker).to_have_attribute("data-state", "unloaded")
    toggle = talker.get_by_role("button", name="Log", exact=True)
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    panel = talker.get_by_role("region", name="Log of talker")
    expect(panel.get_by_text("No output yet", exact=False)).to_be_visible()  # never loaded

    # Opened before the load: the events (starting, then ready) bring its lines, no Refresh clicked.
    talker.get_by_role("button", name="Load", exact=True).click()
    expect(talker).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)
    log = panel.get_by_label("vLLM log of talker")
    expect(log).to_contain_text("Application startup complete")
    expect(log).to_contain_text("FAKE_VLLM_LAST_LINE")  # one of the LONG_LINE-byte lines
    # They wrap inside the box: neither the box nor the page is wider than the screen.
    box = log.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the deployments page is {width} px wide at 390 px with a log open"

    with page.expect_request(
        lambda r: r.method == "GET" and "/api/deployments/talker/logs" in r.url
    ) as asked:
        panel.get_by_role("button", name="Refresh", exact=True).click()
    assert "tail=" in asked.value.url
    expect(log).to_contain_text("Application startup complete")

    # Unloaded, it keeps its last start's lines; closed, it is hidden.
    talker.get_by_role("button", name="Unload", exact=True).click()
    expect(talker).to_have_attribute("data-state", "unloaded", timeout=START_TIMEOUT_MS)
    expect(log).to_contain_text("Application startup complete")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(panel).to_be_hidden()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_page_fits_390_px_in_both_themes(browser: Browser, stack: Stack, theme: str) -> None:
    watched = new_page(browser, stack.url, color_scheme=theme)
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(watched, stack.server.admin_token or "", "/deployments")
    try:
        create(page, "a-deployment-with-a-rather-long-name/for-a-narrow-screen", Aliases="x")
        long = card(page, "a-deployment-with-a-rather-long-name/for-a-narrow-screen")
        expect(long).to_have_attribute("data-state", "unloaded")
        long.get_by_role("button", name="Edit", exact=True).click()
        page.get_by_role("region", name="Create a deployment").get_by_text("Options", exact=True).click()
        settled(page)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the deployments page is {width} px wide at 390 px"
        # The theme's colours (static/css/console.css: --bg, --surface), not fixed ones.
        expect(page.locator("body")).to_have_css("background-color", BACKGROUND[theme])
        expect(long).to_have_css("background-color", SURFACE[theme])
        page.context.close()
        watched.assert_clean()
    finally:
        delete_all(stack)


def test_the_top_bar_counts_every_instance_and_the_runtimes_deployment_once(
    watched: Watched, stack: Stack
) -> None:
    """The top bar's "vLLM: …" (static/js/status.js) follows the deployments' events and the runtime's:
    a loaded deployment counts, a model that runtime.start runs from a path counts too (no deployment
    shows it), and the deployment that runtime.switch runs as the runtime counts once, not twice."""
    page = watched.page
    bar = page.locator("#topbar-status")
    try:
        expect(bar).to_have_text("vLLM: none serving")
        create(page, "one")
        one = card(page, "one")
        one.get_by_role("button", name="Load", exact=True).click()
        expect(bar).to_have_text("vLLM: 1 loading")
        expect(one).to_have_attribute("data-state", "ready", timeout=START_TIMEOUT_MS)
        expect(bar).to_have_text("vLLM: 1 serving")

        # A path run by runtime.start is no deployment: the runtime's events count it.
        path = str(stack.server.data_dir / "models" / "beta")
        wait = START_TIMEOUT_MS // 1000
        r = stack.server.fetch(
            f"/api/runtime/start?wait={wait}", "POST", json={"options": {"model": path}}, timeout=wait + 10
        )
        assert r.status_code == 200 and r.json()["state"] == "ready", r.text
        expect(bar).to_have_text("vLLM: 2 serving")

        # runtime.switch, from the Runtime page (linked from this one): beta's deployment runs alone,
        # as the runtime; both the runtime's events and the deployment's say it is ready.
        page.get_by_role("link", name="Runtime page", exact=True).click()
        expect(page.get_by_role("heading", name="Runtime", level=1)).to_be_visible()
        page.get_by_label("Model", exact=True).select_option(label="beta")
        page.get_by_role("button", name="Switch", exact=True).click()
        expect(page.get_by_text("beta is serving.")).to_be_visible(timeout=START_TIMEOUT_MS)  # the toast
        runtime = stack.server.fetch("/api/runtime").json()
        assert runtime["state"] == "ready" and runtime["deployment"] == "beta", runtime
        states = {d["name"]: d["instance"]["state"] for d in saved(stack)}
        assert states == {"beta": "ready", "one": "unloaded"}, states
        expect(bar).to_have_text("vLLM: 1 serving")

        # The bar links to the deployments page; unloading the runtime's deployment leaves none.
        bar.get_by_role("link").click()
        expect(page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()
        beta = card(page, "beta")
        expect(beta).to_have_attribute("data-state", "ready")
        beta.get_by_role("button", name="Unload", exact=True).click()
        expect(beta).to_have_attribute("data-state", "unloaded", timeout=START_TIMEOUT_MS)
        expect(bar).to_have_text("vLLM: none serving")
        assert stack.server.fetch("/api/runtime").json()["state"] == "stopped"
    finally:
        stack.server.fetch("/api/runtime/stop", "POST")

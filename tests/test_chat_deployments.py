"""The chat page in router mode (docs/chat.md, "Deployments in the picker"), in a real Chromium
against a real vllm-use whose deployments run the fake vLLM (tests/fakes/vllm.py), each deployment
with its own behaviour (`fake_vllm_bin(by_name=...)`): "qwen" loads slowly, "patient" more slowly,
"broken" fails to load, "spare" loads at once.

The picker lists every deployment with its status and follows it; an answer from a deployment that
is not loaded says "loading qwen…" while the gateway holds the request, then streams as usual; a
503 `model_loading` is asked again after its Retry-After; a failed load shows the API's message
once; a deployment deleted meanwhile leaves the picker, and a choice of it shows as unavailable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, expect

from tests.fakes import fake_vllm_bin
from tests.support.browser import Watched, new_page, sign_in
from tests.support.server import Server, eventually, free_port, start_server
from tests.test_chat import ASSISTANT, forgive_aborted, send
from tests.test_deployments import START_TIMEOUT_S, create, register

CHAT_PATH = "/v1/chat/completions"
QWEN_LOAD_S = 3  # long enough to be seen loading, well under the gateway's wait
PATIENT_LOAD_S = 10  # still loading after a reload of the page on a busy machine
NAMES = ("broken", "patient", "qwen", "spare")  # in the order /v1/models lists them
# An answer's deadline: the slowest load here, plus the fake's start-up on a busy machine.
ANSWER_TIMEOUT_MS = (START_TIMEOUT_S + 10) * 1000


def serve(root: Path, *flags: str, by_name: dict[str, dict[str, object]]) -> Server:
    vllm = fake_vllm_bin(root / "bin", max_lifetime=300, by_name=by_name)
    first = free_port()
    return start_server(
        root / "data",
        "--vllm-bin",
        str(vllm),
        "--runtime-ports",
        f"{first}-{first + 9}",
        "--max-loaded",
        "4",
        *flags,
    )


def deploy(server: Server, name: str, model: str) -> None:
    body = {"name": name, "model_id": model, "options": {"start_timeout_s": START_TIMEOUT_S}}
    r = create(server, body)
    assert r.status_code == 201, r.text


def state(server: Server, name: str) -> str:
    return server.fetch(f"/api/deployments/{name}").json()["instance"]["state"]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("chat-router")
    server = serve(
        root,
        by_name={
            "qwen": {"load_seconds": QWEN_LOAD_S},
            "patient": {"load_seconds": PATIENT_LOAD_S},
            "broken": {"fail_on_start": 1, "load_seconds": 0.5},
        },
    )
    try:
        model = register(server, "alpha")
        for name in NAMES:
            deploy(server, name, model)
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def all_unloaded(router: Server) -> Iterator[None]:
    """Each test starts with every deployment unloaded (the gateway's instances, not the page's)."""
    yield
    for name in NAMES:
        if state(router, name) != "unloaded":
            r = router.fetch(f"/api/deployments/{name}/unload", "POST", timeout=START_TIMEOUT_S)
            assert r.status_code == 200, r.text


def open_chat(browser: Browser, server: Server, width: int = 1280) -> Watched:
    watched = new_page(browser, server.base_url)
    page = watched.page
    page.set_viewport_size({"width": width, "height": 860})
    sign_in(watched, server.admin_token or "", "/chat")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    return watched


def labels(page: Page, name: str = "Model") -> list[str]:
    return (
        page.get_by_label(name, exact=True)
        .locator("option")
        .evaluate_all("os => os.map(o => o.textContent.trim())")
    )


def chat_posts(page: Page) -> list[Request]:
    posts: list[Request] = []
    page.on(
        "request", lambda r: posts.append(r) if r.method == "POST" and r.url.endswith(CHAT_PATH) else None
    )
    return posts


def fits(page: Page) -> None:
    """Nothing wider than the viewport: no sideways scrolling, the picker and its options in view."""
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than the viewport"
    box = page.get_by_label("Model", exact=True).bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"], box


# --- the tests ------------------------------------------------------------------------------------


def test_the_picker_lists_each_deployment_with_its_status_and_follows_it(
    browser: Browser, router: Server
) -> None:
    watched = open_chat(browser, router)
    page = watched.page
    try:
        picker = page.get_by_label("Model", exact=True)
        # By name, as /v1/models lists them.
        expect(picker.locator("option")).to_have_text([f"{name} — deployed" for name in NAMES])
        assert labels(page, "Compare with") == ["Off", *(f"{name} — deployed" for name in NAMES)]
        # Loaded behind the page's back: focusing the picker lists the models again.
        r = router.fetch(
            f"/api/deployments/spare/load?wait={START_TIMEOUT_S}", "POST", timeout=START_TIMEOUT_S + 10
        )
        assert r.status_code == 200 and r.json()["state"] == "ready", r.text
        page.get_by_label("Message", exact=True).focus()
        picker.focus()
        expect(picker.locator('option[value="spare"]')).to_have_text("spare — serving")
        expect(picker.locator('option[value="qwen"]')).to_have_text("qwen — deployed")
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_deleted_deployment_leaves_the_picker_and_a_choice_of_it_shows_unavailable(
    browser: Browser, router: Server
) -> None:
    model = router.fetch("/api/deployments/qwen").json()["model_id"]
    deploy(router, "doomed", model)
    watched = open_chat(browser, router)
    page = watched.page
    try:
        picker = page.get_by_label("Model", exact=True)
        expect(picker.locator('option[value="doomed"]')).to_have_text("doomed — deployed")
        picker.select_option("doomed")
        page.get_by_label("Compare with", exact=True).select_option("spare")
        assert router.fetch("/api/deployments/doomed", "DELETE").status_code == 200
        page.get_by_label("Message", exact=True).focus()
        picker.focus()
        gone = picker.locator('option[value="doomed"]')
        expect(gone).to_have_text("doomed — unavailable")
        expect(gone).to_be_disabled()
        expect(picker).to_have_value("doomed")  # not switched to another model behind the user's back
        expect(page.locator(".model-status")).to_contain_text(
            "doomed is not served any more: choose another model, or load one on the Deployments page."
        )
        # Nothing can be sent to it: Send is disabled and Enter does nothing.
        send_button = page.get_by_role("button", name="Send", exact=True)
        expect(send_button).to_be_disabled()
        page.get_by_label("Message", exact=True).fill("still there?")
        page.get_by_label("Message", exact=True).press("Enter")
        expect(page.locator(ASSISTANT)).to_have_count(0)
        # Gone from the other picker, where it is not chosen.
        assert "doomed" not in [label.split(" — ")[0] for label in labels(page, "Compare with")]
        # Choosing another model drops it from the picker and lets the message go.
        picker.select_option("qwen")
        expect(picker.locator('option[value="doomed"]')).to_have_count(0)
        expect(page.locator(".model-status")).to_be_hidden()
        expect(send_button).to_be_enabled()
        watched.assert_clean()
    finally:
        page.context.close()
        if router.fetch("/api/deployments/doomed").status_code == 200:
            router.fetch("/api/deployments/doomed", "DELETE")


@pytest.mark.parametrize("width", [1280, 390])
def test_an_unloaded_deployment_answers_after_loading_shown_as_loading(
    browser: Browser, router: Server, width: int
) -> None:
    assert state(router, "qwen") == "unloaded"
    watched = open_chat(browser, router, width)
    page = watched.page
    try:
        posts = chat_posts(page)
        page.get_by_label("Model", exact=True).select_option("qwen")
        answer = send(page, "hello from the picker")
        # Held by the gateway while qwen loads: the message says so, as a message and not an error.
        expect(answer.locator(".message-state")).to_have_text("loading qwen…")
        expect(answer).to_have_attribute("data-status", "streaming")
        expect(answer.locator(".message-state")).not_to_have_class(re.compile(r"\berror-text\b"))
        fits(page)
        expect(answer).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        expect(answer.locator(".message-body")).to_have_text("Echo: hello from the picker")
        expect(answer.locator(".message-stats")).to_be_visible()
        assert len(posts) == 1  # held, never refused and asked again
        # The answer's end lists the models again: qwen shows serving.
        expect(page.get_by_label("Model", exact=True).locator('option[value="qwen"]')).to_have_text(
            "qwen — serving"
        )
        fits(page)
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_reload_while_a_load_is_awaited_keeps_saying_loading_then_gets_the_answer(
    browser: Browser, router: Server
) -> None:
    """After a reload, the answer still waiting for its model is looked up and replayed, says
    "loading patient…" again, and gets the answer: the gateway keeps an attached session's request
    through the load after its page has left (docs/router.md, "Resumable streams")."""
    watched = open_chat(browser, router)
    page = watched.page
    try:
        page.get_by_label("Model", exact=True).select_option("patient")
        answer = send(page, "survive a reload")
        message_id = answer.get_attribute("data-message-id")
        expect(answer.locator(".message-state")).to_have_text("loading patient…")
        eventually(lambda: state(router, "patient") == "starting", timeout=START_TIMEOUT_S)
        page.reload()
        forgive_aborted(watched, CHAT_PATH)
        again = page.locator(f'{ASSISTANT}[data-message-id="{message_id}"]')
        expect(again.locator(".message-state")).to_have_text("loading patient…")
        expect(again).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        expect(again.locator(".message-body")).to_have_text("Echo: survive a reload")
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_failed_load_shows_the_apis_message_once(browser: Browser, router: Server) -> None:
    watched = open_chat(browser, router)
    watched.expect_http_error(502)
    page = watched.page
    try:
        posts = chat_posts(page)
        page.get_by_label("Model", exact=True).select_option("broken")
        answer = send(page, "will you load?")
        expect(answer).to_have_attribute("data-status", "error", timeout=ANSWER_TIMEOUT_MS)
        expect(answer.locator(".message-state")).to_have_text("the model broken failed to load")
        text = page.locator("main").inner_text()
        assert text.count("failed to load") == 1, text
        assert len(posts) == 1  # a failed load is not asked again
        expect(page.get_by_label("Model", exact=True).locator('option[value="broken"]')).to_have_text(
            "broken — failed"
        )
        watched.assert_clean()
    finally:
        page.context.close()


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[Server]:
    """A gateway that holds a request for a load 1 s at most, with a deployment that loads in 6."""
    server = serve(tmp_path, "--load-wait-timeout", "1", by_name={"slow": {"load_seconds": 6}})
    try:
        deploy(server, "slow", register(server, "alpha"))
        yield server
    finally:
        server.stop()


def retry_after(posts: list[Request], index: int) -> int:
    """The Retry-After of the `index`th request's answer, a 503 `model_loading`."""
    response = posts[index].response()
    assert response is not None and response.status == 503, response and response.status
    body: Any = response.json()
    assert body["error"]["code"] == "model_loading", body
    return int(response.headers["retry-after"])


def test_a_load_longer_than_the_gateways_wait_is_asked_again_until_it_answers(
    browser: Browser, impatient: Server
) -> None:
    watched = open_chat(browser, impatient)
    watched.expect_http_error(503)
    page = watched.page
    try:
        posts = chat_posts(page)
        answer = send(page, "take your time")
        state_text = answer.locator(".message-state")
        expect(state_text).to_have_text(re.compile(r"^loading slow… still loading; asking again in \d+ s$"))
        assert 1 <= retry_after(posts, 0) <= 60
        expect(answer).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        expect(answer.locator(".message-body")).to_have_text("Echo: take your time")
        assert len(posts) >= 2, "the 503 was not asked again"
        assert [p.response().status for p in posts[:-1]] == [503] * (len(posts) - 1)  # type: ignore[union-attr]
        watched.assert_clean()
    finally:
        page.context.close()


def test_stop_ends_the_wait_for_a_load_and_nothing_more_is_sent(browser: Browser, impatient: Server) -> None:
    watched = open_chat(browser, impatient)
    watched.expect_http_error(503)
    page = watched.page
    try:
        posts = chat_posts(page)
        answer = send(page, "never mind")
        expect(answer.locator(".message-state")).to_contain_text("asking again in")
        wait_s = retry_after(posts, 0)
        page.get_by_role("button", name="Stop", exact=True).click()
        expect(answer).to_have_attribute("data-status", "stopped")
        # Longer than the Retry-After the page was waiting out: no request follows the stop.
        page.wait_for_timeout((wait_s + 1) * 1000)
        assert len(posts) == 1, [p.url for p in posts]
        expect(answer).to_have_attribute("data-status", "stopped")
        watched.assert_clean()
    finally:
        page.context.close()
    # The load the page asked for goes on without it (docs/router.md).
    eventually(lambda: state(impatient, "slow") == "ready", timeout=START_TIMEOUT_S)

"""The chat's first use (issue 17, findings 4 and 6; docs/chat.md, "Key" and "Nothing serves the
model"), in a real Chromium against a real vllm-use whose runtime is the fake vLLM
(tests/fakes/vllm.py):

- the first message is answered with no key step: the page makes one playground key per browser
  profile, named after the browser and the day, and tabs opened at once share it;
- a key /v1 refuses (deleted) is replaced on the next send, which says so once;
- at 390 px the composer covers no control of the page;
- once the model is stopped, one banner links to the Deployments page, Send is disabled and no
  technical error is repeated; a deployment that is only unloaded still counts as served;
- `/chat?model=<name>` opens a new conversation with that model chosen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, Request, expect

from tests.support.browser import Watched, new_page, sign_in
from tests.support.deployments import START_TIMEOUT_S, create, register
from tests.support.server import Server, eventually
from tests.support.stack import Stack, console_stack
from tests.test_chat import ASSISTANT, send

MESSAGE = 'ol[aria-label="Messages"] li.message'
CHAT_PATH = "/v1/chat/completions"
ANSWER_TIMEOUT_MS = (START_TIMEOUT_S + 10) * 1000
PLAYGROUND = re.compile(r"^playground · [A-Za-z]+ · \d{4}-\d{2}-\d{2}$")
# Controls a user may press or type into (a <summary> opens its <details>).
CONTROLS = "button, input, select, textarea, a[href], summary"


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """No deployment: the runtime runs a model by path (runtime.start), served as "tiny". Its
    answers stream one word per 50 ms, so a long one is still streaming when a test stops it."""
    with console_stack(
        tmp_path_factory.mktemp("chat-first-use"), vllm_knobs={"token_seconds": 0.05}
    ) as running:
        model = running.server.data_dir / "models" / "tiny"
        model.mkdir(parents=True)
        (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        register(running.server, "shared")  # for the deployments, below
        yield running


@pytest.fixture
def tiny(stack: Stack) -> Iterator[Server]:
    """The runtime serving "tiny"; no keys left from an earlier test; stopped afterwards."""
    server = stack.server
    for key in keys(server):
        assert server.fetch(f"/api/keys/{key['id']}", "DELETE").status_code == 200
    start_tiny(server)
    yield server
    server.fetch("/api/runtime/stop", "POST")


def start_tiny(server: Server) -> None:
    options = {"model": str(server.data_dir / "models" / "tiny"), "served_model_name": "tiny"}
    r = server.fetch(
        f"/api/runtime/start?wait={START_TIMEOUT_S}",
        "POST",
        json={"options": options},
        timeout=START_TIMEOUT_S + 10,
    )
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text


def keys(server: Server) -> list[dict[str, Any]]:
    r = server.fetch("/api/keys")
    assert r.status_code == 200, r.text
    listed: list[dict[str, Any]] = r.json()["keys"]
    return listed


def playground_keys(server: Server) -> list[dict[str, Any]]:
    return [k for k in keys(server) if k["name"].startswith("playground")]


def kept_key(page: Page) -> str:
    return str(page.evaluate("() => localStorage.getItem('vllm-use.playground-key') || ''"))


def answered(message: Locator, text: str) -> None:
    expect(message).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
    expect(message.locator(".message-body")).to_have_text(text)


def chat_posts(page: Page) -> list[Request]:
    posts: list[Request] = []
    page.on(
        "request", lambda r: posts.append(r) if r.method == "POST" and r.url.endswith(CHAT_PATH) else None
    )
    return posts


def covered(page: Page) -> list[str]:
    """The visible controls outside the composer whose box meets the composer's box."""
    composer = page.locator("form.composer").bounding_box()
    assert composer, "no composer"
    found: list[str] = []
    for control in page.locator(CONTROLS).all():
        if not control.is_visible() or control.evaluate("el => Boolean(el.closest('form.composer'))"):
            continue
        box = control.bounding_box()
        if not box or box["width"] == 0 or box["height"] == 0:
            continue
        if (
            box["x"] < composer["x"] + composer["width"]
            and composer["x"] < box["x"] + box["width"]
            and box["y"] < composer["y"] + composer["height"]
            and composer["y"] < box["y"] + box["height"]
        ):
            found.append(f"{control.evaluate('el => el.outerHTML.slice(0, 120)')} at {box}")
    return found


def chat_with_a_key(watched: Watched, server: Server) -> None:
    """Signed in on /chat with an inference key already kept where the chat looks for it, so that
    the tests of what the chat shows about the model do not depend on how its key is made."""
    _, secret = server.create_key("inference", name="given")
    sign_in(watched, server.admin_token or "", "/keys")
    watched.page.evaluate(f"() => localStorage.setItem('vllm-use.playground-key', {json.dumps(secret)})")
    watched.page.goto(watched.origin + "/chat")
    expect(watched.page.get_by_role("button", name="Send", exact=True)).to_be_enabled()


# Every toast the page shows, in `window.toastsShown` (toasts fade after a few seconds).
RECORD_TOASTS = """
window.toastsShown = [];
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("toasts");
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.addedNodes) window.toastsShown.push(node.textContent);
  }).observe(box, { childList: true });
});
"""


# --- the key ------------------------------------------------------------------------------------


def test_the_first_message_is_answered_with_no_key_step(browser: Browser, stack: Stack, tiny: Server) -> None:
    """Signed in, the chat answers the first message at once: no key to create or paste first. The
    key it made is the profile's one playground key, inference only, named after the browser and
    the day; the paste form waits behind "Use another key"."""
    watched = new_page(browser, stack.url)
    page = watched.page
    try:
        sign_in(watched, tiny.admin_token or "", "/chat")
        expect(page.get_by_role("heading", name="Chat", level=1)).to_be_visible()
        answered(send(page, "hello there"), "Echo: hello there")
        made = playground_keys(tiny)
        assert len(made) == 1, made
        assert PLAYGROUND.match(made[0]["name"]), made[0]["name"]
        assert made[0]["scopes"] == ["inference"], made[0]
        assert kept_key(page).startswith("vu_")
        # The region to paste another key is there, closed, out of the way.
        region = page.get_by_role("region", name="Inference key")
        expect(region.locator("summary")).to_have_text("Use another key")
        expect(page.get_by_label("Inference key", exact=True)).to_be_hidden()
        # A reload (and another visit) keeps the same key.
        page.reload()
        expect(page.locator(ASSISTANT)).to_have_count(1)  # the conversation is shown again
        answered(send(page, "again"), "Echo: again")
        assert [k["id"] for k in playground_keys(tiny)] == [made[0]["id"]]
        watched.assert_clean()
    finally:
        page.context.close()


def open_tab(context: BrowserContext, origin: str) -> Watched:
    watched = Watched(context.new_page(), origin)
    watched.page.goto(origin + "/keys")
    expect(watched.page.get_by_role("heading", name="API keys", level=1)).to_be_visible()
    return watched


@pytest.mark.parametrize("locks", ["navigator.locks", "no navigator.locks"])
def test_two_tabs_opened_at_once_share_one_playground_key(
    browser: Browser, stack: Stack, tiny: Server, locks: str
) -> None:
    """Two tabs of one browser profile open the chat at the same moment: one key is made, both use
    it. Without navigator.locks (plain http beyond localhost) the localStorage lease does it."""
    first = new_page(browser, stack.url)
    context = first.page.context
    if locks == "no navigator.locks":
        context.add_init_script(
            "Object.defineProperty(Navigator.prototype, 'locks', { get: () => undefined });"
        )
    try:
        page = first.page
        page.goto(stack.url + "/keys")
        page.get_by_label("Admin token or key").fill(tiny.admin_token or "")
        page.get_by_label("Remember on this browser").check()  # so that a new tab is signed in too
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="API keys", level=1)).to_be_visible()
        assert page.evaluate("() => Boolean(navigator.locks)") is (locks == "navigator.locks")
        second = open_tab(context, stack.url)
        tabs = [first, second]
        # Both go to the chat at once (a click each, neither waiting for the other's page).
        for tab in tabs:
            tab.page.evaluate(
                "() => setTimeout(() => document.querySelector('a[data-route=\"/chat\"]').click(), 50)"
            )
        for tab in tabs:
            expect(tab.page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
        # Send is enabled before a key exists (a send waits for it): wait until both tabs keep one.
        eventually(lambda: all(kept_key(tab.page) for tab in tabs), timeout=ANSWER_TIMEOUT_MS / 1000)
        made = playground_keys(tiny)
        assert len(made) == 1, [k["name"] for k in made] + [t.page.locator("main").inner_text() for t in tabs]
        assert kept_key(first.page) == kept_key(second.page) != ""
        # Each tab chats with it.
        answered(send(second.page, "from the second tab"), "Echo: from the second tab")
        answered(send(first.page, "from the first tab"), "Echo: from the first tab")
        assert len(playground_keys(tiny)) == 1
        for tab in tabs:
            tab.assert_clean()
    finally:
        context.close()


def test_a_deleted_key_is_replaced_on_the_next_send_saying_so_once(
    browser: Browser, stack: Stack, tiny: Server
) -> None:
    watched = new_page(browser, stack.url)
    watched.expect_http_error(401)  # /v1 refusing the deleted key, once
    page = watched.page
    page.context.add_init_script(RECORD_TOASTS)
    try:
        sign_in(watched, tiny.admin_token or "", "/chat")
        answered(send(page, "first"), "Echo: first")
        (old,) = playground_keys(tiny)
        assert tiny.fetch(f"/api/keys/{old['id']}", "DELETE").status_code == 200
        # The next message is answered all the same, with a new key, and the page says so once.
        answered(send(page, "second"), "Echo: second")
        (new,) = playground_keys(tiny)
        assert new["id"] != old["id"] and PLAYGROUND.match(new["name"]), new
        expect(page.locator(ASSISTANT + '[data-status="error"]')).to_have_count(0)
        answered(send(page, "third"), "Echo: third")
        assert [k["id"] for k in playground_keys(tiny)] == [new["id"]]
        # Said once, in a toast (which fades: the page recorded each one shown), and nowhere else.
        toasts = page.evaluate("() => window.toastsShown")
        refused = [t for t in toasts if "key was refused" in t]
        assert len(refused) == 1 and new["name"] in refused[0], toasts
        assert "refused" not in page.locator("main").inner_text()
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_key_forgotten_by_sign_out_is_deleted_when_its_successor_is_made(
    browser: Browser, stack: Stack, tiny: Server
) -> None:
    """Sign-out forgets the key's secret in this browser (docs/chat.md); the next chat makes a new
    key and deletes the old one, so the profile still has one."""
    watched = new_page(browser, stack.url)
    page = watched.page
    try:
        sign_in(watched, tiny.admin_token or "", "/chat")
        answered(send(page, "before"), "Echo: before")
        (old,) = playground_keys(tiny)
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Admin token or key")).to_be_visible()
        assert kept_key(page) == ""
        sign_in(watched, tiny.admin_token or "", "/chat")
        # The conversation shown last comes back from IndexedDB: wait for it, so that `send` counts
        # its answers from there.
        expect(page.locator(ASSISTANT)).to_have_count(1)
        answered(send(page, "after"), "Echo: after")
        (new,) = playground_keys(tiny)
        assert new["id"] != old["id"]
        watched.assert_clean()
    finally:
        page.context.close()


# --- 390 px -------------------------------------------------------------------------------------


def test_at_390_px_the_composer_covers_no_control(browser: Browser, stack: Stack, tiny: Server) -> None:
    watched = new_page(browser, stack.url)
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        sign_in(watched, tiny.admin_token or "", "/chat")
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
        assert covered(page) == []
        # The composer is in view as the page opens (the conversation list starts folded).
        for name in ("Message", "Send"):
            box = page.get_by_role(
                "textbox" if name == "Message" else "button", name=name, exact=True
            ).bounding_box()
            assert box and box["y"] >= 0 and box["y"] + box["height"] <= 844, (name, box)
        page.get_by_role("region", name="Inference key").locator("summary").click()
        page.locator("details.parameters > summary").click()
        assert covered(page) == []
        for text in ("one", "two", "three", "four"):
            answered(send(page, text), f"Echo: {text}")
        # At the end of the conversation, at its start, and half way.
        assert covered(page) == []
        for where in (
            "0",
            "document.documentElement.scrollHeight / 2",
            "document.documentElement.scrollHeight",
        ):
            page.evaluate(f"() => window.scrollTo(0, {where})")
            assert covered(page) == [], where
        watched.assert_clean()
    finally:
        page.context.close()


# --- nothing serves the model -------------------------------------------------------------------


def technical_repeats(page: Page) -> dict[str, int]:
    """How often each technical phrase shows on the page (the main part and the toasts)."""
    text = (page.locator("main").inner_text() + "\n" + page.locator("#toasts").inner_text()).lower()
    phrases = ("no model is running", "not answering", "upstream", "runtime.switch", "stream is closed")
    return {p: text.count(p) for p in phrases if text.count(p) > 1}


def one_banner_to_deployments(page: Page) -> None:
    """What the page shows when nothing serves the model chosen: one link to the Deployments page,
    in one banner (docs/chat.md, `.chat-banner`); Send disabled; no technical phrase twice."""
    link = page.locator("main").get_by_role("link", name="Deployments page")
    expect(link).to_have_count(1)
    expect(link).to_have_attribute("href", "/deployments")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    banner = page.locator(".chat-banner")
    expect(banner).to_have_count(1)
    expect(banner).to_be_visible()
    expect(banner.get_by_role("link", name="Deployments page")).to_be_visible()
    assert technical_repeats(page) == {}, page.locator("main").inner_text()


def test_after_the_model_stops_one_banner_links_to_deployments_and_nothing_is_sent(
    browser: Browser, stack: Stack, tiny: Server
) -> None:
    watched = new_page(browser, stack.url)
    watched.expect_http_error(502)  # /v1/models while nothing runs
    page = watched.page
    try:
        posts = chat_posts(page)
        chat_with_a_key(watched, tiny)
        answered(send(page, "hi"), "Echo: hi")
        assert tiny.fetch("/api/runtime/stop", "POST").status_code == 200
        # The next message is not sent: the page lists the models first, and nothing serves tiny.
        page.get_by_label("Message", exact=True).fill("are you there?")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
        expect(page.locator(ASSISTANT)).to_have_count(1)
        assert len(posts) == 1
        one_banner_to_deployments(page)
        expect(page.get_by_label("Message", exact=True)).to_have_value("are you there?")  # kept
        # Enter does nothing either; the model chosen stays chosen, shown unavailable.
        page.get_by_label("Message", exact=True).press("Enter")
        expect(page.get_by_label("Model", exact=True)).to_have_value("tiny")
        expect(page.get_by_label("Model", exact=True).locator("option:checked")).to_have_text(
            "tiny — unavailable"
        )
        assert len(posts) == 1
        one_banner_to_deployments(page)
        # Served again: "Reload models" clears the banner and the message goes.
        start_tiny(tiny)
        page.get_by_role("button", name="Reload models").click()
        expect(page.locator(".chat-banner")).to_be_hidden()
        page.get_by_role("button", name="Send", exact=True).click()
        answered(page.locator(ASSISTANT).last, "Echo: are you there?")
        # The banner's link is a real one: it leads to the Deployments page.
        assert tiny.fetch("/api/runtime/stop", "POST").status_code == 200
        page.get_by_label("Model", exact=True).focus()
        one_banner_to_deployments(page)
        page.locator(".chat-banner").get_by_role("link", name="Deployments page").click()
        expect(page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_model_stopped_mid_answer_shows_its_error_once_then_the_banner(
    browser: Browser, stack: Stack, tiny: Server
) -> None:
    watched = new_page(browser, stack.url)
    watched.expect_http_error(502)
    page = watched.page
    try:
        chat_with_a_key(watched, tiny)
        answer = send(page, " ".join(f"w{i}" for i in range(200)))  # about 10 s of words
        expect(answer.locator(".message-body")).to_contain_text("w3")
        assert tiny.fetch("/api/runtime/stop", "POST").status_code == 200
        expect(answer).to_have_attribute("data-status", "error", timeout=ANSWER_TIMEOUT_MS)
        one_banner_to_deployments(page)
        expect(answer.locator(".message-body")).to_contain_text("w3")  # the partial answer is kept
        # What went wrong shows on the message, once on the whole page (toasts included).
        said = answer.locator(".message-state").inner_text().strip()
        assert said, "the failed answer says nothing"
        shown = page.locator("main").inner_text() + page.locator("#toasts").inner_text()
        assert shown.count(said) == 1, shown
        # The gateway cuts the page's connection after the error event, on purpose (docs/gateway.md),
        # which Chromium reports as an incomplete response.
        watched.problems[:] = [p for p in watched.problems if "ERR_INCOMPLETE_CHUNKED_ENCODING" not in p]
        watched.assert_clean()
    finally:
        page.context.close()


# --- router mode: deployments -------------------------------------------------------------------


@pytest.fixture
def deployed(stack: Stack) -> Iterator[Server]:
    """Two deployments of one model, "alpha" and "beta", both unloaded; deleted afterwards."""
    server = stack.server
    model = next(m["id"] for m in server.fetch("/api/models").json()["models"] if m["name"] == "shared")
    for name in ("alpha", "beta"):
        r = create(server, {"name": name, "model_id": model, "options": {"start_timeout_s": START_TIMEOUT_S}})
        assert r.status_code == 201, r.text
    try:
        yield server
    finally:
        server.fetch("/api/runtime/stop", "POST")
        for name in ("alpha", "beta"):
            server.fetch(f"/api/deployments/{name}", "DELETE")


def test_a_stopped_deployment_still_counts_as_served_and_loads_when_asked(
    browser: Browser, stack: Stack, deployed: Server
) -> None:
    """runtime.switch runs a deployment; after a stop it is only unloaded: the picker says
    "deployed", no banner, Send enabled, and a message loads it."""
    model = deployed.fetch("/api/deployments/beta").json()["model_id"]
    r = deployed.fetch(
        f"/api/runtime/switch?wait={START_TIMEOUT_S}",
        "POST",
        json={"model_id": model, "options": {"served_model_name": "beta"}},
        timeout=START_TIMEOUT_S + 10,
    )
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    watched = new_page(browser, stack.url)
    page = watched.page
    try:
        chat_with_a_key(watched, deployed)
        picker = page.get_by_label("Model", exact=True)
        expect(picker.locator('option[value="beta"]')).to_have_text("beta — serving")
        expect(picker.locator('option[value="alpha"]')).to_have_text("alpha — deployed")
        picker.select_option("beta")
        answered(send(page, "hi beta"), "Echo: hi beta")
        assert deployed.fetch("/api/runtime/stop", "POST").status_code == 200
        picker.focus()
        expect(picker.locator('option[value="beta"]')).to_have_text("beta — deployed")
        expect(page.locator(".chat-banner")).to_be_hidden()
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
        answered(send(page, "wake up"), "Echo: wake up")
        expect(picker.locator('option[value="beta"]')).to_have_text("beta — serving")
        watched.assert_clean()
    finally:
        page.context.close()


def test_chat_with_a_model_in_the_address_opens_a_new_conversation_with_it(
    browser: Browser, stack: Stack, deployed: Server
) -> None:
    """`/chat?model=beta` (the Deployments page's "Chat" link): a new conversation, beta chosen,
    even where another conversation was shown last."""
    watched = new_page(browser, stack.url)
    page = watched.page
    try:
        posts = chat_posts(page)
        chat_with_a_key(watched, deployed)
        answered(send(page, "to alpha"), "Echo: to alpha")  # alpha: the first listed
        page.goto(stack.url + "/chat?model=beta")
        picker = page.get_by_label("Model", exact=True)
        expect(picker).to_have_value("beta")
        expect(page.locator(MESSAGE)).to_have_count(0)  # a new conversation
        answered(send(page, "to beta"), "Echo: to beta")
        assert [json.loads(p.post_data or "{}")["model"] for p in posts] == ["alpha", "beta"]
        # The address is /chat again: a reload shows this conversation, not another new one.
        page.reload()
        expect(page.locator(ASSISTANT)).to_have_count(1)
        expect(page.locator(ASSISTANT + " .message-body")).to_have_text("Echo: to beta")
        watched.assert_clean()
    finally:
        page.context.close()

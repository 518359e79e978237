"""The chat page (`/chat`, issue 7 acceptance) in a real Chromium, against a real server whose `/v1`
forwards to a fake vLLM (tests/fakes/upstream.py) that streams as slowly as a test needs and records
what reached it: streaming, resume after a reload, stop, branches, safe Markdown, export/import,
reasoning, and the screenshots.

The page's contract (labels, buttons, DOM hooks) is docs/chat.md. Each test runs in a fresh browser
context, so it starts with an empty IndexedDB and an empty localStorage: the page makes its own
playground key.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.fakes.upstream import FakeUpstream, running
from tests.support.browser import Watched, new_page, screenshot, settled, sign_in
from tests.support.server import eventually
from tests.support.stack import Stack, console_stack

MESSAGE = 'ol[aria-label="Messages"] li.message'
ASSISTANT = MESSAGE + '[data-role="assistant"]'
USER = MESSAGE + '[data-role="user"]'
CHAT_PATH = "/v1/chat/completions"
# Thirty distinct words: a repeated or a lost piece shows in the final text.
LONG_REPLY = " ".join(f"w{i:02d}" for i in range(30)) + "."
DONE_TIMEOUT = 30_000


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Stack]:
    flags = ("--upstream", upstream.url, "--model-aliases", "fast=tiny")  # two names for "Compare with"
    with console_stack(tmp_path_factory.mktemp("chat"), *flags) as running_stack:
        yield running_stack


def open_chat(watched: Watched, token: str) -> Page:
    """Sign in on /chat; the page makes its playground key itself and lists the models, after which
    Send is enabled."""
    page = watched.page
    sign_in(watched, token, "/chat")
    expect(page.get_by_role("heading", name="Chat", level=1)).to_be_visible()
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    expect(page.get_by_label("Message", exact=True)).to_be_editable()
    return page


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    open_chat(page, stack.server.admin_token or "")
    yield page
    page.page.context.close()


def chat_requests(upstream: FakeUpstream) -> list[Any]:
    return [r for r in upstream.requests if r.method == "POST" and r.path == CHAT_PATH]


def send(page: Page, text: str) -> Locator:
    """Type `text` in the composer, send it, and return the new assistant message."""
    before = page.locator(ASSISTANT).count()
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator(ASSISTANT)).to_have_count(before + 1)
    return page.locator(ASSISTANT).last


def body(message: Locator) -> str:
    return message.locator(".message-body").inner_text().strip()


def finished(message: Locator, status: str = "done") -> None:
    expect(message).to_have_attribute("data-status", status, timeout=DONE_TIMEOUT)


def wait_for_words(message: Locator, words: int) -> str:
    """Wait until the streaming message shows at least `words` words; return its text then."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = message.get_attribute("data-status")
        assert status == "streaming", (
            f"the answer ended ({status}) before the test acted: {message.inner_text()!r}"
        )
        text = body(message)
        if len(text.split()) >= words:
            return text
        time.sleep(0.03)
    raise AssertionError(f"fewer than {words} words within 20 s")


def snapshot(page: Page) -> list[list[Any]]:
    """What the visible path shows: [role, status, text, branch index or None] per message."""
    return page.locator(MESSAGE).evaluate_all(
        """els => els.map(el => [
            el.dataset.role,
            el.dataset.status,
            (el.querySelector('.message-body')?.innerText ?? '').trim(),
            el.querySelector('.branch-index')?.textContent.trim() ?? null,
        ])"""
    )


def forgive_aborted(watched: Watched, *paths: str) -> None:
    """A reload aborts the page's in-flight `/v1` fetches on purpose, which Chromium reports as
    failed requests (net::ERR_ABORTED); tests/support/browser.py forgives that only for `/api/`."""
    watched.problems[:] = [
        p
        for p in watched.problems
        if not (
            p.startswith("request failed:")
            and "ERR_ABORTED" in p
            and any(f" {watched.origin}{path}" in p for path in paths)
        )
    ]


def export_conversation(page: Page, folder: Path) -> tuple[str, Any, Path]:
    """Click "Export"; return the suggested file name, the parsed JSON and where it was saved."""
    with page.expect_download() as info:
        page.get_by_role("button", name="Export", exact=True).click()
    download = info.value
    path = folder / f"{len(list(folder.iterdir()))}-{download.suggested_filename}"
    download.save_as(path)
    return download.suggested_filename, json.loads(path.read_text(encoding="utf-8")), path


_TIMESTAMP = re.compile(r"(?i)^(created|updated|modified|exported|imported)(_?at)?$|^(ts|time|timestamp)$")
_ID_KEY = re.compile(r"^id$|_id$|Id$")


def canonical(doc: Any) -> Any:
    """An exported conversation with its ids renamed in order of appearance (an import may give the
    conversation, or its messages, new ids as long as the links between them are kept) and its
    creation/update times dropped."""
    names: dict[str, str] = {}

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for k in sorted(value):
                if _ID_KEY.search(k) and isinstance(value[k], str):
                    names.setdefault(value[k], f"#{len(names)}")
                else:
                    collect(value[k])
        elif isinstance(value, list):
            for v in value:
                collect(v)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {names.get(k, k): walk(v) for k, v in sorted(value.items()) if not _TIMESTAMP.match(k)}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return names.get(value, value)
        return value

    collect(doc)
    return walk(doc)


def strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in strings(v)]
    return []


# --- the tests ------------------------------------------------------------------------------------


def test_nothing_is_sent_without_a_model_and_an_empty_list_says_why(
    browser: Browser, stack: Stack, upstream: FakeUpstream
) -> None:
    """With nothing running the gateway answers 502 to /v1/models: the page says so, keeps Send
    disabled and sends nothing; once a model runs, "Reload models" enables it."""
    upstream.down()
    down = True
    watched = new_page(browser, stack.url)
    watched.expect_http_error(502)
    try:
        page = watched.page
        sign_in(watched, stack.server.admin_token or "", "/chat")
        expect(page.locator(".model-status")).to_contain_text("No model is running")
        send_button = page.get_by_role("button", name="Send", exact=True)
        expect(send_button).to_be_disabled()
        composer = page.get_by_label("Message", exact=True)
        composer.fill("hello?")
        composer.press("Enter")
        expect(page.locator(ASSISTANT)).to_have_count(0)
        upstream.up()
        down = False
        page.get_by_role("button", name="Reload models").click()
        expect(send_button).to_be_enabled()
        expect(page.get_by_label("Model", exact=True)).to_have_value("tiny")
        send_button.click()
        finished(page.locator(ASSISTANT).last)
        assert [json.loads(r.body)["model"] for r in chat_requests(upstream)] == ["tiny"]
    finally:
        if down:
            upstream.up()
        watched.page.context.close()
    watched.assert_clean()


def test_an_answer_streams_in_and_ends_equal_to_what_the_upstream_sent(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    upstream.reply = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
    upstream.word_interval = 0.12
    sent: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: (
            sent.append({"headers": r.headers, "body": r.post_data}) if r.url.endswith(CHAT_PATH) else None
        ),
    )
    answer = send(page, "Tell me about the fox")
    partials: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and answer.get_attribute("data-status") == "streaming":
        text = body(answer)
        if text and (not partials or partials[-1] != text):
            partials.append(text)
        time.sleep(0.03)
    finished(answer)
    assert body(answer) == upstream.reply
    streamed = [p for p in partials if p != upstream.reply]
    assert len({len(p) for p in streamed}) >= 2, f"no incremental text was seen: {partials}"
    assert all(upstream.reply.startswith(p) for p in streamed), partials
    expect(answer.locator(".message-stats")).to_be_visible()
    # One request, streamed, carrying the assistant message's id as its conversation id.
    assert len(chat_requests(upstream)) == 1
    assert len(sent) == 1 and json.loads(sent[0]["body"])["stream"] is True
    message_id = answer.get_attribute("data-message-id")
    assert message_id and sent[0]["headers"].get("x-conversation-id", "").split("::")[0] == message_id
    watched.assert_clean()


def test_a_reload_mid_stream_continues_the_same_answer_without_sending_it_again(
    watched: Watched, upstream: FakeUpstream, tmp_path: Path
) -> None:
    page = watched.page
    upstream.reply = LONG_REPLY
    upstream.word_interval = 0.15
    answer = send(page, "Count for me")
    message_id = answer.get_attribute("data-message-id")
    before = wait_for_words(answer, 5)
    assert LONG_REPLY.startswith(before) and before != LONG_REPLY
    resumed: list[str] = []
    page.on("request", lambda r: resumed.append(r.url) if "/v1/stream" in r.url else None)
    page.reload()
    forgive_aborted(watched, CHAT_PATH, "/v1/stream")
    again = page.locator(f'{ASSISTANT}[data-message-id="{message_id}"]')
    expect(again).to_have_count(1)
    finished(again)
    assert body(again) == LONG_REPLY
    expect(page.locator(ASSISTANT)).to_have_count(1)
    # Resumed from the gateway's buffer: the upstream got one request and was never cut off.
    assert len(chat_requests(upstream)) == 1
    assert not upstream.closes
    assert any(u.split("?")[0].endswith("/v1/streams/lookup") for u in resumed), resumed
    offsets = [
        int(parse_qs(urlsplit(u).query).get("from", ["0"])[0])
        for u in resumed
        if urlsplit(u).path == "/v1/stream"
    ]
    assert offsets and max(offsets) > 0, f"not resumed from a saved offset: {resumed}"
    # The kept text itself (not only its rendering) is the reply, once.
    _, exported, _ = export_conversation(page, tmp_path)
    assert [m["content"] for m in exported["messages"] if m.get("role") == "assistant"] == [LONG_REPLY]
    # And it stays that way.
    page.reload()
    finished(page.locator(f'{ASSISTANT}[data-message-id="{message_id}"]'))
    assert body(page.locator(ASSISTANT).last) == LONG_REPLY
    watched.assert_clean()


class CuttingProxy:
    """A TCP relay in front of the server whose `cut()` drops every open connection at once, as a
    flaky network does; new connections keep working."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self.lock:
            doomed, self.open = self.open, []
        for sock in doomed:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_dropped_connection_mid_stream_resumes_from_the_saved_offset(
    browser: Browser, stack: Stack, upstream: FakeUpstream
) -> None:
    proxy = CuttingProxy(int(urlsplit(stack.url).port or 0))
    origin = f"http://127.0.0.1:{proxy.port}"
    watched = new_page(browser, origin)
    try:
        page = open_chat(watched, stack.server.admin_token or "")
        upstream.reply = LONG_REPLY
        upstream.word_interval = 0.15
        answer = send(page, "Count for me")
        before = wait_for_words(answer, 5)
        assert LONG_REPLY.startswith(before) and before != LONG_REPLY
        proxy.cut()  # the stream (and anything else in flight) is cut off mid-way
        finished(answer)
        assert body(answer) == LONG_REPLY
        assert len(chat_requests(upstream)) == 1  # resumed from the gateway's buffer, not sent again
        assert not upstream.closes
        # The cut itself shows as failed requests and the browser's network errors; nothing else may.
        watched.problems[:] = [
            p
            for p in watched.problems
            if not (
                p.startswith("request failed:") or re.search(r"net::ERR_(INCOMPLETE|CONNECTION|EMPTY)", p)
            )
        ]
        watched.assert_clean()
    finally:
        watched.page.context.close()
        proxy.close()


def test_stop_cancels_the_upstream_and_keeps_the_partial_answer_marked_stopped(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    upstream.reply = LONG_REPLY
    upstream.word_interval = 0.2
    answer = send(page, "Count slowly")
    wait_for_words(answer, 3)
    clicked = time.monotonic()
    page.get_by_role("button", name="Stop", exact=True).click()
    closes = eventually(lambda: [c for c in upstream.closes if c.path == CHAT_PATH], timeout=5)
    assert closes[0].at - clicked < 1.0, (
        f"the upstream saw the cancel {closes[0].at - clicked:.2f} s after Stop"
    )
    finished(answer, "stopped")
    kept = body(answer)
    assert kept and LONG_REPLY.startswith(kept) and kept != LONG_REPLY, kept
    expect(answer.get_by_text("Stopped", exact=True)).to_be_visible()
    time.sleep(0.5)
    assert body(answer) == kept  # nothing more arrives after the stop
    forgive_aborted(watched, CHAT_PATH, "/v1/stream")
    # Still so after a reload.
    page.reload()
    again = page.locator(ASSISTANT).last
    finished(again, "stopped")
    assert body(again) == kept
    expect(again.get_by_text("Stopped", exact=True)).to_be_visible()
    assert len(chat_requests(upstream)) == 1
    watched.assert_clean()


def test_edit_makes_a_branch_regenerate_a_sibling_and_both_survive_a_reload(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    upstream.reply = "Paris is the capital of France."
    finished(send(page, "What is the capital of France?"))
    upstream.reply = "About two million people."
    finished(send(page, "How many people live there?"))
    old_path = snapshot(page)
    assert [(m[0], m[2]) for m in old_path] == [
        ("user", "What is the capital of France?"),
        ("assistant", "Paris is the capital of France."),
        ("user", "How many people live there?"),
        ("assistant", "About two million people."),
    ]

    # Edit the first question: a new branch with its own answer.
    first = page.locator(USER).first
    first.get_by_role("button", name="Edit", exact=True).click()
    page.get_by_label("Edit message", exact=True).fill("What is the capital of Italy?")
    upstream.reply = "Rome is the capital of Italy."
    page.get_by_role("button", name="Save and send", exact=True).click()
    expect(page.locator(MESSAGE)).to_have_count(2)
    finished(page.locator(ASSISTANT).last)
    expect(page.locator(USER).first.locator(".branch-index")).to_have_text("2/2")
    new_path = snapshot(page)
    assert [m[2] for m in new_path] == ["What is the capital of Italy?", "Rome is the capital of Italy."]

    # Back to the first branch: the old question and its whole path are intact.
    page.locator(USER).first.get_by_role("button", name="Previous branch").click()
    expect(page.locator(MESSAGE)).to_have_count(4)
    expect(page.locator(USER).first.locator(".branch-index")).to_have_text("1/2")
    assert [m[:3] for m in snapshot(page)] == [m[:3] for m in old_path]

    # Regenerate the last answer: a sibling.
    upstream.reply = "Roughly 2.1 million inhabitants."
    page.locator(ASSISTANT).last.get_by_role("button", name="Regenerate", exact=True).click()
    finished(page.locator(ASSISTANT).last)
    expect(page.locator(ASSISTANT).last.locator(".message-body")).to_have_text(upstream.reply)
    expect(page.locator(ASSISTANT).last.locator(".branch-index")).to_have_text("2/2")
    assert len(chat_requests(upstream)) == 4
    shown = snapshot(page)

    # Everything survives a reload: the same path, texts and branch indices, and both branches.
    page.reload()
    expect(page.locator(MESSAGE)).to_have_count(4)
    finished(page.locator(ASSISTANT).last)
    assert snapshot(page) == shown
    page.locator(ASSISTANT).last.get_by_role("button", name="Previous branch").click()
    expect(page.locator(ASSISTANT).last.locator(".message-body")).to_have_text("About two million people.")
    expect(page.locator(ASSISTANT).last.locator(".branch-index")).to_have_text("1/2")
    page.locator(USER).first.get_by_role("button", name="Next branch").click()
    expect(page.locator(MESSAGE)).to_have_count(2)
    assert [m[2:] for m in snapshot(page)] == [[m[2], m[3]] for m in new_path]
    watched.assert_clean()


def test_html_and_javascript_links_in_a_reply_render_inert(
    watched: Watched, upstream: FakeUpstream, stack: Stack
) -> None:
    page = watched.page
    dialogs: list[str] = []
    fetched: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("request", lambda r: fetched.append(r.url) if urlsplit(r.url).path.endswith("/x") else None)
    upstream.reply = "Look: <img src=x onerror=alert(1)> and [click](javascript:alert(1)) and <b onmouseover=alert(2)>bold</b>"
    answer = send(page, "Show me something")
    finished(answer)
    page.wait_for_timeout(500)  # time for an image load or a handler to fire, were there one
    answer.locator(".message-body").hover()
    found = answer.evaluate(
        """el => ({
            imgs: el.querySelectorAll('img').length,
            handlers: [...el.querySelectorAll('*')].flatMap(e =>
                [...e.attributes].filter(a => a.name.toLowerCase().startsWith('on')).map(a => e.tagName + ' ' + a.name)),
            scriptLinks: [...el.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))
                .filter(h => h.replace(/[\\s\\u0000-\\u001f]/g, '').toLowerCase().startsWith('javascript:')),
            scripts: el.querySelectorAll('script, iframe, object, embed').length,
        })"""
    )
    assert found == {"imgs": 0, "handlers": [], "scriptLinks": [], "scripts": 0}, found
    # Raw HTML is shown as text, never parsed (docs/chat.md "Safety").
    expect(answer.locator(".message-body")).to_contain_text("<img src=x onerror=alert(1)>")
    assert not dialogs and not fetched, (dialogs, fetched)
    # Reloaded from IndexedDB, it is rendered the same way.
    page.reload()
    again = page.locator(ASSISTANT).last
    finished(again)
    page.wait_for_timeout(300)
    assert again.locator("img, [onerror], [onmouseover], a[href^='javascript' i]").count() == 0
    assert not dialogs and not fetched, (dialogs, fetched)
    watched.assert_clean()


def test_export_then_import_gives_an_identical_conversation(
    watched: Watched, upstream: FakeUpstream, tmp_path: Path
) -> None:
    page = watched.page
    upstream.reply = "Hello! How can I help?"
    finished(send(page, "Hello there, model"))
    upstream.reply = "Here is a list:\n\n- one\n- two\n\nAnd `code`."
    finished(send(page, "Give me a list"))
    # A sibling answer, with the first one shown: the branches and the choice travel too.
    upstream.reply = "Another list:\n\n1. three\n2. four"
    page.locator(ASSISTANT).last.get_by_role("button", name="Regenerate", exact=True).click()
    finished(page.locator(ASSISTANT).last)
    page.locator(ASSISTANT).last.get_by_role("button", name="Previous branch").click()
    expect(page.locator(ASSISTANT).last.locator(".branch-index")).to_have_text("1/2")
    original_view = snapshot(page)
    conversations = page.get_by_role("region", name="Conversations").locator("li[data-conversation-id]")
    expect(conversations).to_have_count(1)
    original_id = conversations.first.get_attribute("data-conversation-id")

    name, exported, path = export_conversation(page, tmp_path)
    assert name.endswith(".json") and name.startswith("Hello there"), name
    texts = strings(exported)
    assert (
        "Hello there, model" in texts
        and upstream.reply in texts
        and "Here is a list:\n\n- one\n- two\n\nAnd `code`." in texts
    )

    page.get_by_label("Import conversation").set_input_files(path)
    expect(conversations).to_have_count(2)
    imported_li = page.get_by_role("region", name="Conversations").locator(
        f'li[data-conversation-id]:not([data-conversation-id="{original_id}"])'
    )
    expect(imported_li).to_have_count(1)
    imported_li.get_by_role("button").first.click()  # its title selects it
    expect(page.locator(MESSAGE)).to_have_count(4)
    assert snapshot(page) == original_view
    _, reexported, _ = export_conversation(page, tmp_path)
    assert canonical(reexported) == canonical(exported)
    watched.assert_clean()


def test_reasoning_is_shown_folded_apart_from_the_answer(watched: Watched, upstream: FakeUpstream) -> None:
    page = watched.page
    upstream.reasoning = "The user greets me, so I should greet them back politely."
    upstream.reply = "Hello to you too!"
    upstream.word_interval = 0.05
    answer = send(page, "Hello")
    finished(answer)
    details = answer.locator("details.reasoning")
    expect(details).to_have_count(1)
    expect(details).not_to_have_attribute("open", re.compile(".*"))
    expect(details.locator("summary")).to_have_text("Reasoning")
    shown = details.evaluate(
        "d => [...d.childNodes].filter(n => n.nodeName !== 'SUMMARY').map(n => n.textContent).join('').trim()"
    )
    assert shown == upstream.reasoning
    assert body(answer) == upstream.reply
    # Opened, it shows the reasoning.
    details.locator("summary").click()
    expect(details).to_contain_text(upstream.reasoning)
    watched.assert_clean()


def test_compare_sends_one_prompt_to_two_models_at_once_side_by_side(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    upstream.reply = "Same words from both."
    upstream.word_interval = 0.1
    page.get_by_label("Model", exact=True).select_option("tiny")
    page.get_by_label("Compare with", exact=True).select_option("fast")
    page.get_by_label("Message", exact=True).fill("Who are you?")
    page.get_by_role("button", name="Send", exact=True).click()
    pair = page.locator(".compare " + "li.message")
    expect(pair).to_have_count(2)
    # Both stream at the same time: each is seen streaming before either is done.
    expect(pair.nth(0)).to_have_attribute("data-status", "streaming")
    expect(pair.nth(1)).to_have_attribute("data-status", "streaming")
    for answer in (pair.nth(0), pair.nth(1)):
        finished(answer)
        assert body(answer) == upstream.reply
    assert [pair.nth(i).locator(".message-author").inner_text().strip() for i in range(2)] == ["tiny", "fast"]
    chats = chat_requests(upstream)
    assert len(chats) == 2
    assert {json.loads(r.body)["model"] for r in chats} == {"tiny"}  # "fast" is an alias of tiny
    starts = sorted(r.at for r in chats)
    assert starts[1] - starts[0] < 1.0  # sent together, not one after the other
    watched.assert_clean()


def test_conversations_can_be_searched_renamed_and_deleted_and_stay_so(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    sidebar = page.get_by_role("region", name="Conversations")
    items = sidebar.locator("li[data-conversation-id]")
    finished(send(page, "Alpha question"))
    sidebar.get_by_role("button", name="New chat").click()
    finished(send(page, "Beta question"))
    expect(items).to_have_count(2)

    sidebar.get_by_role("button", name="Rename Alpha question").click()
    sidebar.get_by_label("Title", exact=True).fill("Renamed first")
    sidebar.get_by_role("button", name="Save", exact=True).click()
    expect(sidebar.get_by_role("button", name="Rename Renamed first")).to_be_visible()

    search = sidebar.get_by_label("Search conversations")
    search.fill("renamed")
    expect(items.filter(visible=True)).to_have_count(1)
    expect(items.filter(visible=True)).to_contain_text("Renamed first")
    search.fill("")
    expect(items.filter(visible=True)).to_have_count(2)

    sidebar.get_by_role("button", name="Delete Beta question").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(items).to_have_count(1)
    page.reload()
    forgive_aborted(watched, "/v1/")
    expect(items).to_have_count(1)
    expect(items.first).to_contain_text("Renamed first")
    watched.assert_clean()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_screenshot_of_the_chat_in_both_themes(
    browser: Browser, stack: Stack, upstream: FakeUpstream, theme: str
) -> None:
    watched = new_page(browser, stack.url, color_scheme=theme)
    page = open_chat(watched, stack.server.admin_token or "")
    upstream.reply = (
        "Here is a function that adds two numbers:\n\n"
        "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\n\n"
        "Call it as `add(2, 3)`; it returns **5**."
    )
    upstream.word_interval = 0.03  # believable stats in the picture
    answer = send(page, "Write a Python function that adds two numbers")
    finished(answer)
    expect(answer.get_by_role("button", name="Copy code")).to_be_visible()
    expect(answer.locator(".message-stats")).to_be_visible()
    expect(page.locator("#toasts > *")).to_have_count(0, timeout=10_000)  # no toast in the picture
    # Sending scrolled the composer into view; a full-page picture wants the top (the header is sticky).
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    page.mouse.move(0, 0)
    settled(page)
    screenshot(page, f"chat-{theme}")
    watched.assert_clean()
    page.context.close()

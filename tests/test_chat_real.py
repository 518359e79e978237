"""The chat page against the real CPU vLLM serving a tiny local model (issue 7 acceptance, "once against
the real CPU vLLM"): the answer streams in and ends equal to what the model generated. vLLM runs with
its tool-call parser (hermes) and the console with `--tools get_datetime`, so a message sent with a
tool selected goes through vLLM's tool path; whatever the tiny model answers, the turn ends cleanly
(issue 15).

vLLM is served directly (tests/support/real_vllm.py, ~20-60 s to start) and the console's gateway forwards
`/v1` to it with `--upstream`. At temperature 0 the model is greedy, so the same request sent again
without streaming, through the gateway with the page's own playground key, gives the same text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.support.browser import new_page
from tests.support.real_vllm import SHARED_KEY, SharedVllm, VllmServer
from tests.support.stack import Stack, console_stack
from tests.test_chat import (
    ASSISTANT,
    CHAT_PATH,
    body,
    export_conversation,
    finished,
    open_chat,
    send,
    strings,
)
from tests.test_chat_tools import ask, choose_tools


@pytest.fixture(scope="module")
def vllm(shared_vllm: SharedVllm) -> VllmServer:
    return shared_vllm.get()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, vllm: VllmServer) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("chat-real")
    key = root / "upstream-key"  # the shared vLLM checks a key (SHARED_ARGS)
    key.write_text(SHARED_KEY)
    key.chmod(0o600)
    flags = ("--upstream", vllm.base_url, "--upstream-api-key-file", str(key), "--tools", "get_datetime")
    with console_stack(root, *flags) as running:
        yield running


def playground_key(page: Any) -> str:
    kept = page.evaluate(
        "() => sessionStorage.getItem('vllm-use.playground-key') ?? localStorage.getItem('vllm-use.playground-key')"
    )
    assert kept, "the playground key is not kept under vllm-use.playground-key"
    if kept.startswith(("{", '"')):  # stored as JSON
        value = json.loads(kept)
        kept = value if isinstance(value, str) else value.get("secret") or value.get("key")
    return kept


def test_the_real_models_answer_streams_in_and_equals_what_it_generated(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    watched = new_page(browser, stack.url)
    page = open_chat(watched, stack.server.admin_token or "")
    expect(page.get_by_label("Model", exact=True)).to_have_value("tiny")
    page.locator("details summary", has_text="Parameters").click()
    page.get_by_label("Temperature", exact=True).fill("0")
    page.get_by_label("Max tokens", exact=True).fill("16")
    sent: list[dict[str, Any]] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith(CHAT_PATH) else None)

    answer = send(page, "Once upon a time")
    expect(answer.locator(".message-body")).not_to_be_empty(timeout=60_000)
    finished(answer)
    expect(answer.locator(".message-stats")).to_be_visible()
    assert len(sent) == 1
    request = sent[0]
    assert request["stream"] is True and request["temperature"] == 0 and request["max_tokens"] == 16

    # The same request, not streamed, through the gateway with the page's key.
    replay = {k: v for k, v in request.items() if k not in ("stream", "stream_options")}
    with httpx.Client(trust_env=False, timeout=120) as client:
        r = client.post(
            stack.url + CHAT_PATH,
            json=replay,
            headers={"Authorization": f"Bearer {playground_key(page)}"},
        )
    assert r.status_code == 200, r.text
    generated = r.json()["choices"][0]["message"]["content"]
    assert generated

    # What the page keeps is exactly that text (the raw Markdown, in the exported conversation) ...
    _, exported, _ = export_conversation(page, tmp_path)
    assert generated in strings(exported), (generated, exported)
    # ... and what it shows is that text: exactly, unless the random model wrote Markdown syntax.
    shown = body(answer)
    if _MARKDOWN.search(generated):
        assert _letters(shown) == _letters(generated), (shown, generated)
    else:
        assert shown == " ".join(generated.split()), (shown, generated)
    expect(page.locator(ASSISTANT)).to_have_count(1)
    watched.assert_clean()
    page.context.close()


def test_a_message_with_a_tool_selected_ends_its_turn_without_an_error(
    browser: Browser, stack: Stack
) -> None:
    watched = new_page(browser, stack.url)
    watched.expect_http_error(401)  # GET /tools asked first without a tool key (docs/chat.md, Tools)
    page = open_chat(watched, stack.server.admin_token or "")
    page.locator("details summary", has_text="Parameters").click()
    page.get_by_label("Temperature", exact=True).fill("0")
    page.get_by_label("Max tokens", exact=True).fill("16")
    choose_tools(page, "get_datetime")
    sent: list[dict[str, Any]] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith(CHAT_PATH) else None)

    finished(ask(page, "What time is it? Use the get_datetime tool."))
    # The turn is over once nothing streams or runs (a tool call, if the model made one, ran and
    # its answer came): Send is enabled again. Every answer of it ended `done`.
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled(timeout=120_000)
    statuses = page.locator(ASSISTANT).evaluate_all("els => els.map(e => e.dataset.status)")
    assert statuses and all(s == "done" for s in statuses), statuses
    expect(page.locator(".tool-call[data-state='failed']")).to_have_count(0)
    assert sent and sent[0]["tools"][0]["function"]["name"] == "get_datetime"
    watched.assert_clean()
    page.context.close()


_MARKDOWN = re.compile(r"[\\`*_#\[\]()<>!|~&=+-]|^\s*\d+[.)]|\n", re.MULTILINE)


def _letters(text: str) -> str:
    """The letters and digits of `text`, in order: what any rendering of its Markdown keeps."""
    return "".join(ch for ch in text if ch.isalnum())

"""The chat page's tool calls (issue 15, "The chat page" → "Tool calls"; docs/chat.md "Tools") in a
real Chromium, against a real server started with tools on, whose `/v1` forwards to the fake vLLM
(tests/fakes/upstream.py). The fake answers a script of turns in vLLM's streamed tool-call shape and
records every request body, so the tests see what the `tool` messages carried to the model; the
tools run for real (POST /tools), writing under a temporary tools root.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.fakes.shapes import ToolCall
from tests.fakes.upstream import FakeUpstream, running
from tests.support.browser import Watched, new_page, screenshot, settled
from tests.support.stack import Stack, console_stack
from tests.test_chat import (
    ASSISTANT,
    CHAT_PATH,
    body,
    canonical,
    export_conversation,
    finished,
    forgive_aborted,
    open_chat,
)
from vllm_use.tools.base import PARAMS_MAX_BYTES

TOOLS = "get_datetime,write_file,read_file"
CALL = ".tool-call"
DENIED = json.dumps({"error": "the user denied this call"}, separators=(",", ":"))
MAX_ROUNDS = 10  # static/js/chat/toolloop.js


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


@pytest.fixture(scope="module")
def tools_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tools-root")


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream, tools_root: Path
) -> Iterator[Stack]:
    flags = ("--upstream", upstream.url, "--tools", TOOLS, "--tools-root", str(tools_root))
    with console_stack(tmp_path_factory.mktemp("chat-tools"), *flags) as running_stack:
        yield running_stack


@pytest.fixture
def watched(browser: Browser, stack: Stack) -> Iterator[Watched]:
    page = new_page(browser, stack.url)
    open_chat(page, stack.server.admin_token or "")
    # Opening "Tools" with no tool key yet asks GET /tools without one first: 401 says tools are on.
    page.expect_http_error(401)
    yield page
    page.page.context.close()


def chat_bodies(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests if r.method == "POST" and r.path == CHAT_PATH]


def choose_tools(page: Page, *names: str) -> None:
    """Open "Tools" and check `names` (the listing has come once the checkboxes are there)."""
    page.locator("details.chat-tools > summary").click()
    for name in names:
        box = page.locator(f'li.tool-option[data-tool="{name}"] input[type="checkbox"]')
        box.check()
        expect(box).to_be_checked()


def call_of(page: Page, name: str, n: int = 0) -> Locator:
    return page.locator(f"{ASSISTANT} {CALL}").filter(has=page.locator(".tool-name", has_text=name)).nth(n)


def ask(page: Page, text: str) -> Locator:
    """Send `text`; return the first answer to it. (test_chat's send() expects exactly one more
    answer, but a tool loop may add the next ones before it looks.)"""
    before = page.locator(ASSISTANT).count()
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    first = page.locator(ASSISTANT).nth(before)
    expect(first).to_be_attached()
    return first


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


# --- the tests ------------------------------------------------------------------------------------


def test_the_tools_section_lists_the_enabled_tools_with_their_cost_and_write_mark(
    watched: Watched, stack: Stack
) -> None:
    page = watched.page
    page.locator("details.chat-tools > summary").click()
    options = page.locator("li.tool-option")
    expect(options).to_have_count(len(TOOLS.split(",")))
    assert sorted(options.evaluate_all("els => els.map(e => e.dataset.tool)")) == sorted(TOOLS.split(","))
    listed = stack.server.fetch("/tools", token=tools_key(page))
    assert listed.status_code == 200, listed.text
    for tool in listed.json():
        option = page.locator(f'li.tool-option[data-tool="{tool["tool"]}"]')
        expect(option.locator("label")).to_have_text(tool["display_name"])
        # ≈ the definition's JSON length / 4 (JavaScript's Math.round: halves go up)
        cost = math.floor(
            len(json.dumps(tool["definition"], separators=(",", ":"), ensure_ascii=False)) / 4 + 0.5
        )
        expect(option.locator(".tool-cost")).to_have_text(f"~{cost} tokens")
        expect(option.locator(".tool-write")).to_have_count(1 if tool["permissions"]["write"] else 0)
    expect(page.locator('li.tool-option[data-tool="write_file"] .tool-write')).to_have_text("write")
    watched.assert_clean()


def test_a_read_tool_runs_and_the_next_request_carries_its_output(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime")
    upstream.script = [[ToolCall("get_datetime", "{}")], "It is late."]
    upstream.word_interval = 0.02  # the arguments stream in pieces
    first = ask(page, "What time is it?")
    call = call_of(page, "get_datetime")
    expect(call).to_have_attribute("data-state", "done", timeout=20_000)
    expect(call.locator(".tool-output")).to_contain_text("UTC:")
    final = page.locator(ASSISTANT).nth(1)
    finished(final)
    assert body(final) == "It is late."
    finished(first)

    bodies = chat_bodies(upstream)
    assert len(bodies) == 2
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["get_datetime"]
    assert bodies[1]["tools"] == bodies[0]["tools"]
    said = [m for m in bodies[1]["messages"] if m["role"] == "assistant"][-1]
    assert said["content"] is None
    (asked,) = said["tool_calls"]
    assert asked["type"] == "function" and asked["function"] == {"name": "get_datetime", "arguments": "{}"}
    assert asked["id"].startswith("chatcmpl-tool-")
    (result,) = tool_messages(bodies[1])
    assert result["tool_call_id"] == asked["id"]
    assert result["content"] == call.locator(".tool-output").inner_text()
    assert result["content"].startswith("local: ")
    watched.assert_clean()


def test_a_write_call_waits_then_deny_sends_the_refusal_and_allow_writes(
    watched: Watched, upstream: FakeUpstream, tools_root: Path
) -> None:
    page = watched.page
    choose_tools(page, "write_file")
    denied = tools_root / "denied.txt"
    upstream.script = [
        [ToolCall("write_file", json.dumps({"path": "denied.txt", "content": "nope"}))],
        "Fine.",
    ]
    ask(page, "Write denied.txt")
    call = call_of(page, "write_file")
    expect(call).to_have_attribute("data-state", "waiting")
    expect(call.locator(".tool-arguments")).to_contain_text('"path": "denied.txt"')
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    assert len(chat_bodies(upstream)) == 1  # nothing goes on while the call waits
    call.get_by_role("button", name="Deny", exact=True).click()
    expect(call).to_have_attribute("data-state", "denied")
    finished(page.locator(ASSISTANT).nth(1))
    (refusal,) = tool_messages(chat_bodies(upstream)[1])
    assert refusal["content"] == DENIED
    assert not denied.exists()

    upstream.script = [
        [ToolCall("write_file", json.dumps({"path": "notes/allowed.txt", "content": "yes, written"}))],
        "Done.",
    ]
    ask(page, "Now write notes/allowed.txt")
    call = call_of(page, "write_file", 1)
    expect(call).to_have_attribute("data-state", "waiting")
    call.get_by_role("button", name="Allow", exact=True).click()
    expect(call).to_have_attribute("data-state", "done")
    # The fourth answer: `.last` would be the call's own answer until the next one is attached.
    finished(page.locator(ASSISTANT).nth(3))
    assert body(page.locator(ASSISTANT).nth(3)) == "Done."
    assert (tools_root / "notes" / "allowed.txt").read_text() == "yes, written"
    last = chat_bodies(upstream)[-1]
    (written,) = tool_messages(last)[-1:]
    assert written["content"] == call.locator(".tool-output").inner_text() and written["content"] != DENIED
    watched.assert_clean()


def test_stop_while_a_write_call_waits_ends_the_loop_without_running_it(
    watched: Watched, upstream: FakeUpstream, tools_root: Path
) -> None:
    page = watched.page
    choose_tools(page, "write_file")
    upstream.script = [
        [ToolCall("write_file", json.dumps({"path": "stopped.txt", "content": "never"}))],
        "Not sent.",
    ]
    ask(page, "Write stopped.txt")
    call = call_of(page, "write_file")
    expect(call).to_have_attribute("data-state", "waiting")
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(call).to_have_attribute("data-state", "skipped")
    expect(page.locator(f"{ASSISTANT} .tool-note")).to_have_text(
        "Stopped: the remaining tool calls were not run."
    )
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    expect(call.get_by_role("button")).to_have_count(0)
    assert len(chat_bodies(upstream)) == 1 and not (tools_root / "stopped.txt").exists()
    watched.assert_clean()


def test_a_reload_while_a_write_call_waits_keeps_it_and_the_loop_goes_on(
    watched: Watched, upstream: FakeUpstream, tools_root: Path
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime", "write_file")
    arguments = json.dumps({"path": "after-reload.txt", "content": "kept across a reload"})
    upstream.script = [[ToolCall("get_datetime", "{}"), ToolCall("write_file", arguments)], "Both done."]
    ask(page, "The time, then write a file")
    expect(call_of(page, "get_datetime")).to_have_attribute("data-state", "done")
    expect(call_of(page, "write_file")).to_have_attribute("data-state", "waiting")
    shown = call_of(page, "get_datetime").locator(".tool-output").inner_text()

    page.reload()
    forgive_aborted(watched, "/v1/", "/tools")
    reading, writing = call_of(page, "get_datetime"), call_of(page, "write_file")
    expect(writing).to_have_attribute("data-state", "waiting")
    expect(writing.locator(".tool-arguments")).to_contain_text("kept across a reload")
    expect(reading).to_have_attribute("data-state", "done")
    expect(reading.locator(".tool-output")).to_have_text(shown)  # not run again
    writing.get_by_role("button", name="Allow", exact=True).click()
    finished(page.locator(ASSISTANT).nth(1))
    assert (tools_root / "after-reload.txt").read_text() == "kept across a reload"
    bodies = chat_bodies(upstream)
    assert len(bodies) == 2
    read_result, write_result = tool_messages(bodies[1])
    assert read_result["content"] == shown and write_result["content"] != DENIED
    watched.assert_clean()


def test_export_then_import_keeps_the_tool_calls_and_their_results(
    watched: Watched, upstream: FakeUpstream, tmp_path: Path
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime")
    upstream.script = [[ToolCall("get_datetime", "{}")], "Exported."]
    ask(page, "Time for an export")
    finished(page.locator(ASSISTANT).nth(1))
    _, exported, path = export_conversation(page, tmp_path)
    (asked,) = [m for m in exported["messages"] if m.get("toolCalls")]
    assert asked["toolCalls"][0]["name"] == "get_datetime" and asked["toolCalls"][0]["result"].startswith(
        "local: "
    )
    assert exported["conversation"]["tools"] == ["get_datetime"]

    conversations = page.get_by_role("region", name="Conversations").locator("li[data-conversation-id]")
    original = conversations.first.get_attribute("data-conversation-id")
    page.get_by_label("Import conversation").set_input_files(path)
    expect(conversations).to_have_count(2)
    # The imported copy is the one shown now.
    shown = conversations.filter(has=page.locator('button[aria-current="true"]'))
    expect(shown).to_have_count(1)
    expect(shown).not_to_have_attribute("data-conversation-id", original or "")
    expect(call_of(page, "get_datetime")).to_have_attribute("data-state", "done")
    expect(call_of(page, "get_datetime").locator(".tool-output")).to_have_text(
        asked["toolCalls"][0]["result"]
    )
    _, reexported, _ = export_conversation(page, tmp_path)
    assert canonical(reexported) == canonical(exported)
    assert len(chat_bodies(upstream)) == 2  # the imported calls were not run again
    watched.assert_clean()


def test_a_call_refused_by_tools_shows_why_and_stops_the_loop_until_the_user_decides(
    watched: Watched, upstream: FakeUpstream
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime")
    # Arguments over /tools' 64 KiB bound for params: refused (400) before the tool runs.
    upstream.script = [
        [ToolCall("get_datetime", json.dumps({"padding": "x" * PARAMS_MAX_BYTES}))],
        "Understood.",
    ]
    watched.expect_http_error(400)
    ask(page, "A call with too much in it")
    call = call_of(page, "get_datetime")
    expect(call).to_have_attribute("data-state", "failed")
    expect(call.locator(".tool-error")).to_contain_text("The loop stopped")
    expect(call.locator(".tool-error")).to_contain_text(f"{PARAMS_MAX_BYTES} bytes")  # the API's words
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()  # the loop is over
    expect(page.locator(ASSISTANT)).to_have_count(1)
    assert len(chat_bodies(upstream)) == 1
    call.get_by_role("button", name="Deny", exact=True).click()
    finished(page.locator(ASSISTANT).nth(1))
    (refusal,) = tool_messages(chat_bodies(upstream)[1])
    assert refusal["content"] == DENIED
    watched.assert_clean()


def test_the_tool_key_is_made_on_first_need_and_replaced_when_refused(
    watched: Watched, upstream: FakeUpstream, stack: Stack
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime")
    first = tools_key(page)
    first_id = page.evaluate("() => localStorage.getItem('vllm-use.chat-tools-key-id')")
    listed = {k["id"]: k for k in stack.server.fetch("/api/keys").json()["keys"]}
    assert listed[first_id]["scopes"] == ["tools"]
    assert re.fullmatch(r"chat tools · \w+ · \d{4}-\d\d-\d\d", listed[first_id]["name"]), listed[first_id][
        "name"
    ]
    assert stack.server.fetch(f"/api/keys/{first_id}/disable", "POST").status_code == 200

    upstream.script = [[ToolCall("get_datetime", "{}")], "Fine."]
    ask(page, "The time, with a key that was disabled")
    expect(call_of(page, "get_datetime")).to_have_attribute("data-state", "done")
    finished(page.locator(ASSISTANT).nth(1))
    expect(page.locator("#toasts")).to_contain_text("chat tools key was refused")
    second = tools_key(page)
    assert second != first
    keys = stack.server.fetch("/api/keys").json()["keys"]
    assert [k["enabled"] for k in keys if k["id"] == first_id] == [False]  # left as the admin left it
    watched.assert_clean()


@pytest.mark.parametrize("rounds", [MAX_ROUNDS, MAX_ROUNDS + 1])
def test_ten_rounds_of_tool_calls_run_and_an_eleventh_is_refused(
    watched: Watched, upstream: FakeUpstream, rounds: int
) -> None:
    page = watched.page
    choose_tools(page, "get_datetime")
    upstream.script = [*([[ToolCall("get_datetime", "{}")]] * rounds), "At last."]
    ask(page, "Keep asking the time")
    answers = page.locator(ASSISTANT)
    expect(answers).to_have_count(MAX_ROUNDS + 1, timeout=30_000)  # the user's answer, then one per round
    last = answers.last
    finished(last)
    bodies = chat_bodies(upstream)
    if rounds == MAX_ROUNDS:
        assert body(last) == "At last."
        assert len(bodies) == MAX_ROUNDS + 1 and len(tool_messages(bodies[-1])) == MAX_ROUNDS
        expect(page.locator(".tool-note:not([hidden])")).to_have_count(0)
    else:
        expect(last.locator(".tool-note")).to_have_text(re.compile(r"^Stopped after 10 rounds of tool calls"))
        expect(last.locator(CALL)).to_have_attribute("data-state", "skipped")
        assert len(bodies) == MAX_ROUNDS + 1
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    watched.assert_clean()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_screenshot_of_a_tool_call_in_both_themes(
    browser: Browser, stack: Stack, upstream: FakeUpstream, theme: str
) -> None:
    # Tall enough that the composer (pinned to the window's bottom) covers none of the calls.
    watched = new_page(browser, stack.url, color_scheme=theme, viewport={"width": 1280, "height": 1400})
    watched.expect_http_error(401)
    page = open_chat(watched, stack.server.admin_token or "")
    choose_tools(page, "get_datetime", "write_file")
    arguments = json.dumps(
        {"path": "plan.md", "content": "# Plan\n\n1. Check the time.\n2. Write it down.\n"}
    )
    upstream.script = [[ToolCall("get_datetime", "{}"), ToolCall("write_file", arguments)]]
    upstream.word_interval = 0.03  # believable stats in the picture
    ask(page, "Check the time, then write plan.md")
    expect(call_of(page, "write_file")).to_have_attribute("data-state", "waiting")
    expect(page.locator("#toasts > *")).to_have_count(0, timeout=10_000)
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    page.mouse.move(0, 0)
    settled(page)
    screenshot(page, f"chat-tool-call-{theme}")
    watched.assert_clean()
    page.context.close()


def test_with_tools_off_the_section_says_how_to_turn_them_on(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream
) -> None:
    with console_stack(tmp_path_factory.mktemp("chat-no-tools"), "--upstream", upstream.url) as off:
        watched = new_page(browser, off.url)
        watched.expect_http_error(404)
        page = open_chat(watched, off.server.admin_token or "")
        page.locator("details.chat-tools > summary").click()
        expect(page.locator(".tools-note")).to_contain_text("Tools are off on this server")
        expect(page.locator(".tools-note")).to_contain_text("--tools")
        expect(page.locator("li.tool-option")).to_have_count(0)
        finished(ask(page, "Still answered"))  # nothing else breaks
        assert "tools" not in chat_bodies(upstream)[-1]
        keys = off.server.fetch("/api/keys").json()["keys"]
        assert not [k for k in keys if "tools" in k["scopes"]]  # no tool key was made
        watched.assert_clean()
        page.context.close()


def tools_key(page: Page) -> str:
    key = page.evaluate("() => localStorage.getItem('vllm-use.chat-tools-key')")
    assert key, "the tool key is not kept under vllm-use.chat-tools-key"
    return key

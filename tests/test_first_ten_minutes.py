"""A new operator's first ten minutes, in a real Chromium (issue 17's acceptance).

A fresh data dir, started as `make run` starts it (no VLLM_USE_ADMIN_TOKEN: the server writes its
own token to `<data dir>/admin-token`), the fake `vllm` and the real `hf` on a fake hub
(tests/support/stack.py). The operator knows nothing but the console's address:

    1. signs in with the token read from the file the sign-in page names;
    2. adds a model from the Overview's first-run checklist (a Hugging Face repository);
    3. once it is downloaded, follows the checklist's "Deploy";
    4. creates and loads the deployment ("Create and load", the CPU preset applied on this machine);
    5. once it serves, follows "Chat";
    6. sends a message and gets an answer (the chat makes its own key on first use);
    7. goes back to the Overview (the top bar's brand), which shows "Connect a client";
    8. creates a key for the client; the Python `openai` snippet shown then, run as written, gets
       an answer through /v1.

A user action is one click, or one form submitted (typing into the form included); waiting and
reading are not actions. At most eight, with no console error, at 1280 and 390 px, both themes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.browser import Watched, new_page
from tests.support.stack import FAST_REPO, Stack, console_stack

MAX_ACTIONS = 8
# Waits tied to work: a download of the fast repository and a fake vLLM's start are each a few
# seconds on this machine; these bound a stuck step, they are not expected durations.
WORK_TIMEOUT_MS = 120_000
SIZES = {"desktop": {"width": 1280, "height": 860}, "phone": {"width": 390, "height": 844}}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with console_stack(tmp_path, admin_token=None) as running:
        yield running


class Operator:
    """Counts what the user does: `act(...)` is one action."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.actions: list[str] = []

    def act(self, what: str, locator: Locator) -> None:
        self.actions.append(what)
        locator.click()


def visible(page: Page, selector: str) -> Locator:
    """The one visible element for `selector` (at 390 px some controls are in a folded menu)."""
    found = page.locator(selector).locator("visible=true")
    expect(found).to_have_count(1, timeout=WORK_TIMEOUT_MS)
    return found


# Each size and each theme once (the four combinations cost 26 s more and found nothing the pairs
# miss: the flow is the same, only the layout and the colours change).
@pytest.mark.parametrize(("size", "theme"), [("desktop", "light"), ("phone", "dark")])
def test_a_new_operator_gets_a_colleague_chatting_in_eight_actions(
    browser: Browser, stack: Stack, size: str, theme: str
) -> None:
    watched: Watched = new_page(browser, stack.url, viewport=SIZES[size], color_scheme=theme)
    page = watched.page
    you = Operator(page)

    # 1. The sign-in page names the token's file; the operator reads it on this machine.
    page.goto(stack.url + "/")
    token_file = Path(visible(page, "code.token-file").inner_text().strip())
    assert token_file == stack.server.data_dir / "admin-token"
    page.get_by_label("Admin token or key").fill(token_file.read_text().strip())
    you.act("sign in", page.get_by_role("button", name="Sign in"))
    expect(page.get_by_role("heading", name="Overview", level=1)).to_be_visible()

    # 2. The first-run checklist has every step undone but the token, and adds a model in place.
    checklist = page.locator("section#first-run")
    expect(checklist.locator('li[data-done="false"]')).to_have_count(4)
    form = checklist.locator("form.add-model-form")
    form.locator('input[name="source"]').fill(FAST_REPO)
    you.act("add model", form.get_by_role("button", name="Add model"))

    # 3. Downloaded, the checklist offers the next step.
    you.act("deploy", visible(page, 'a[data-action="deploy"]'))
    expect(page.get_by_role("heading", name="Deployments", level=1)).to_be_visible()

    # 4. The create form has the model, a name and (no GPU here) the CPU preset.
    you.act("create and load", page.get_by_role("button", name="Create and load"))

    # 5. Serving, the deployment offers the chat.
    you.act("chat", visible(page, 'a[data-action="chat"]'))
    expect(page.get_by_role("heading", name="Chat", level=1)).to_be_visible()

    # 6. No key step: the first message makes the chat's key and gets an answer.
    page.get_by_label("Message", exact=True).fill("Say hello to my colleague.")
    you.act("send", page.get_by_role("button", name="Send", exact=True))
    answer = page.locator('ol[aria-label="Messages"] li.message[data-role="assistant"]').last
    expect(answer).to_have_attribute("data-status", "done", timeout=WORK_TIMEOUT_MS)
    assert answer.locator(".message-body").inner_text().strip()

    # 7. Back to the Overview (the brand in the top bar), whose "Connect a client" names the model.
    you.act("overview", page.locator("a.brand"))
    card = page.locator("section#connect.connect-card")
    expect(card).to_be_visible()
    expect(card).to_contain_text(stack.url + "/v1")

    # 8. A key for the client, filled into the snippets; the Python one runs as written.
    you.act("create a key", card.get_by_role("button", name="Create a key for this client"))
    snippet = card.locator('[data-snippet="openai"]')
    expect(snippet).to_contain_text("vu_")
    code = snippet.inner_text()
    assert stack.url + "/v1" in code

    ran = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=WORK_TIMEOUT_MS / 1000,  # its request may wait for a load (a vLLM start)
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "*"},  # nothing of the test's own environment
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip(), "the snippet printed no answer"

    assert len(you.actions) <= MAX_ACTIONS, you.actions
    page.context.close()
    watched.assert_clean()

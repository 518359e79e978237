"""Playwright (Python) driving Debian's Chromium, for the console's browser tests.

`launch()` starts the system `chromium` (never a browser downloaded by `playwright install`).
`Watched` wraps a page and records what must not happen in any test: console errors, uncaught
exceptions, failed requests, and HTTP errors from our server, except those a test declares it
provokes on purpose (`page.expect_http_error(400)` before typing a bad value). `assert_clean()`
fails the test with the list.

`screenshot(page, name)` writes `<name>.png` into `$SCREENSHOTS_DIR`: `make screenshots` sets it
to `docs/screenshots/` (the pictures the README shows) on purpose; any other run, `make test`
included, writes them into `.cache/screenshots/`, which git ignores, so a test run leaves the work
tree as it found it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Page,
    Playwright,
    Request,
    Response,
    expect,
    sync_playwright,
)

from tests.support import REPO

SCREENSHOTS = REPO / (os.environ.get("SCREENSHOTS_DIR") or ".cache/screenshots")  # relative to REPO
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    # Chromium's own traffic (sign-in, autofill, time and update checks) stays on this machine: no
    # proxy (the environment's is the tests' sentinel, tests/conftest.py), and no name resolves but
    # loopback's. A page's own request beyond loopback still fails its test ("request failed").
    "--no-proxy-server",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)
# What Chromium logs for any fetch answered with an HTTP error; matched against expected statuses.
_HTTP_CONSOLE = re.compile(r"Failed to load resource: the server responded with a status of (\d{3})")


@contextmanager
def launch() -> Iterator[tuple[Playwright, Browser]]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed (make test installs it: `make chromium`)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=[*CHROMIUM_ARGS])
        try:
            yield playwright, browser
        finally:
            browser.close()


@dataclass
class Watched:
    page: Page
    origin: str
    problems: list[str] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)  # HTTP statuses the test provokes on purpose

    def __post_init__(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.problems.append(f"uncaught: {exc}"))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", self._response)

    def expect_http_error(self, *statuses: int) -> None:
        self.expected.extend(statuses)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type not in ("error", "warning"):
            return
        found = _HTTP_CONSOLE.search(message.text)
        if found and int(found.group(1)) in self.expected:
            return  # the browser's own line for a response we expected
        self.problems.append(f"console {message.type}: {message.text} ({message.location.get('url', '')})")

    def _failed(self, request: Request) -> None:
        failure = request.failure or ""
        # Leaving a page (or reloading it) aborts its in-flight fetches and event stream on purpose
        # (AbortController): the admin API's, and the chat page's reads of `/v1` (its model list).
        if "ERR_ABORTED" in failure and (
            request.url.startswith(self.origin + "/api/")
            or (request.method == "GET" and request.url.startswith(self.origin + "/v1/"))
        ):
            return
        self.problems.append(f"request failed: {request.method} {request.url} {failure}")

    def _response(self, response: Response) -> None:
        if not response.url.startswith(self.origin) or response.status < 400:
            return
        if response.status in self.expected:
            return
        self.problems.append(f"HTTP {response.status}: {response.request.method} {response.url}")

    def assert_clean(self) -> None:
        assert not self.problems, "\n".join(self.problems)


def new_page(browser: Browser, origin: str, **context: Any) -> Watched:
    ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 860}, **context})
    ctx.set_default_timeout(15_000)
    return Watched(ctx.new_page(), origin)


def sign_in(watched: Watched, credential: str, path: str = "/") -> None:
    page = watched.page
    page.goto(watched.origin + path)
    page.get_by_label("Admin token or key").fill(credential)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Sign out").wait_for()
    # The page it leads to has rendered, so its module has loaded: leaving any earlier would abort
    # that load, which `Watched` reports as a failed request.
    page.locator("main .page-header h1").first.wait_for()


@contextmanager
def signed_in_on(
    browser: Browser, origin: str, credential: str, path: str, heading: str
) -> Iterator[Watched]:
    """A page signed in on `path`, showing its `heading`, that records every request it sends
    (`requests`, "METHOD URL"); on leaving, closed and checked clean (an exception skips the check)."""
    page = new_page(browser, origin)
    requests: list[str] = []
    page.page.on("request", lambda r: requests.append(f"{r.method} {r.url}"))
    page.requests = requests  # type: ignore[attr-defined]
    sign_in(page, credential, path)
    expect(page.page.get_by_role("heading", name=heading, level=1)).to_be_visible()
    yield page
    page.page.context.close()
    page.assert_clean()


def settled(page: Page) -> None:
    """The page's heading is up and no placeholder is left (pages poll and stream, so the network
    is never idle)."""
    page.locator("main h1").first.wait_for()
    expect(page.locator("[aria-busy=true]")).to_have_count(0)  # (no wait_for_function: the CSP forbids eval)
    page.wait_for_timeout(300)


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, animations="disabled")
    return path

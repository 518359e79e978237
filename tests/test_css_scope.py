"""Page-scoped CSS (docs/console.md): every selector in static/css/pages/<name>.css starts with
`[data-page="<name>"]`, the attribute static/js/main.js puts on <body> while that page is shown.

All the pages' style sheets are loaded at once (static/index.html), so an unscoped selector in one
page's file styles every page that happens to use the same class name (the API keys form was laid
out by chat.css's `.key-form`). No browser is needed: tests/support/css.py parses the sheets.
A failure names each unscoped selector with its line; `tools/scope_page_css.py FILE…` prefixes
them mechanically (a rule that styles a part shared by pages belongs in console.css instead).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.css import scoped, selectors

ROOT = Path(__file__).resolve().parent.parent
PAGES_CSS = ROOT / "static" / "css" / "pages"
MAIN_JS = ROOT / "static" / "js" / "main.js"

SAMPLE = """/* .commented { color: red } */
.a, .b > .c { x: 1; }
@media (max-width: 600px) {
  .d:is(.e, .f) { x: 2; }
  [title="g, h"],
  [data-page="p"] .ok { x: 3; }
}
.i
{ x: 4; }
@keyframes spin { from { x: 0 } to { x: 1 } }
"""


def test_the_parser_sees_every_rule() -> None:
    """Comments, @media, selector lists with commas inside :is() and attribute values, a selector
    list and a rule spanning lines, an at-rule that is not a grouping one."""
    found = [(s.line, s.text) for s in selectors(SAMPLE)]
    assert found == [
        (2, ".a"),
        (2, ".b > .c"),
        (4, ".d:is(.e, .f)"),
        (5, '[title="g, h"]'),
        (6, '[data-page="p"] .ok'),
        (8, ".i"),
        (10, "@keyframes spin"),
    ]
    assert all(SAMPLE[s.offset :].startswith(s.text.split()[0]) for s in selectors(SAMPLE))
    assert scoped('[data-page="keys"] .x', "keys")
    assert scoped('[data-page="keys"]', "keys")
    assert scoped('[data-page="keys"] #page .x', "keys")
    assert not scoped('[data-page="keys"] .x', "models")
    assert not scoped('[data-page="keysx"] .x', "keys")
    assert not scoped(".keys-table", "keys")
    assert not scoped('.x [data-page="keys"]', "keys")


def test_the_fixer_scopes_what_the_check_refuses(tmp_path: Path) -> None:
    """tools/scope_page_css.py prefixes each unscoped selector, leaves scoped ones and comments as
    they were, and names what it cannot fix (an at-rule's global name)."""
    sheet = tmp_path / "p.css"
    sheet.write_text(SAMPLE)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "scope_page_css.py"), str(sheet)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the @keyframes is left for a person
    assert "@keyframes spin" in done.stdout
    fixed = sheet.read_text()
    assert [s.text for s in selectors(fixed) if not scoped(s.text, "p")] == ["@keyframes spin"]
    assert fixed.count('[data-page="p"]') == 6  # five prefixed, one already scoped
    assert "/* .commented { color: red } */" in fixed
    assert '[data-page="p"] [title="g, h"],\n  [data-page="p"] .ok { x: 3; }' in fixed


def page_names() -> set[str]:
    """The pages main.js routes to (their module names are the data-page values)."""
    return set(re.findall(r'module: "\./pages/([\w-]+)\.js"', MAIN_JS.read_text()))


def test_main_js_scopes_the_page_by_its_module_name() -> None:
    text = MAIN_JS.read_text()
    assert "document.body.dataset.page = pageName(route)" in text
    assert {"overview", "models", "keys", "requests", "settings", "signin"} <= page_names()


@pytest.mark.parametrize("path", sorted(PAGES_CSS.glob("*.css")), ids=lambda p: p.name)
def test_every_selector_of_a_page_sheet_is_scoped_to_that_page(path: Path) -> None:
    page = path.stem
    assert page in page_names(), f"{path.name}: no page named {page!r} in static/js/main.js's routes"
    found = selectors(path.read_text())
    assert found, f"{path.name} has no rules"
    leaks = [f"  line {s.line}: {s.text}" for s in found if not scoped(s.text, page)]
    assert not leaks, (
        f"static/css/pages/{path.name}: {len(leaks)} selector(s) not scoped under "
        f'[data-page="{page}"] (docs/console.md, page-scoped CSS; tools/scope_page_css.py fixes them):\n'
        + "\n".join(leaks)
    )

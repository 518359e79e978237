"""Page-scoped CSS (docs/console.md): every selector in static/css/pages/<name>.css starts with
`[data-page="<name>"]`, the attribute static/js/main.js puts on <body> while that page is shown.

All the pages' style sheets are loaded at once (static/index.html), so an unscoped selector in one
page's file styles every page that happens to use the same class name. No browser is needed: the
files are parsed with the small parser below (comments stripped, rules split at top-level braces,
@media/@supports/@container blocks entered, selector lists split at top-level commas).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES_CSS = ROOT / "static" / "css" / "pages"
MAIN_JS = ROOT / "static" / "js" / "main.js"
GROUPING = ("@media", "@supports", "@container", "@layer")


def strip_comments(text: str) -> str:
    """The text without /* … */ comments (replaced by spaces, so offsets and lines stay)."""
    return re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def split_top(text: str, sep: str) -> list[str]:
    """`text` split on `sep` where it is outside (), [] and quotes (a selector list's commas)."""
    depth, quote, begin, out = 0, "", 0, []
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[begin:i])
            begin = i + 1
    out.append(text[begin:])
    return out


def selectors(text: str) -> list[tuple[int, str]]:
    """(line, selector) of every style rule in a style sheet, inside grouping at-rules too.

    Other at-rules (@keyframes, @font-face, @import) come back as their prelude, so the caller
    sees them: their names are global too."""
    text = strip_comments(text)
    found: list[tuple[int, str]] = []

    def walk(start: int, end: int) -> None:
        i = start
        while i < end:
            brace = text.find("{", i, end)
            if brace < 0:
                rest = text[i:end].strip()
                assert not rest or rest.startswith("@import"), f"unparsed CSS: {rest[:60]!r}"
                if rest:
                    found.append((text.count("\n", 0, i) + 1, rest))
                return
            depth, k = 1, brace + 1
            while depth:
                assert k < end, "unbalanced braces"
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                k += 1
            prelude = text[i:brace]
            line = text.count("\n", 0, i) + 1  # where the prelude starts (maybe blank lines first)
            head = prelude.strip()
            if head.startswith(GROUPING):
                walk(brace + 1, k - 1)
            elif head.startswith("@"):
                found.append(
                    (
                        line + prelude[: len(prelude) - len(prelude.lstrip())].count("\n"),
                        " ".join(head.split()),
                    )
                )
            else:
                before = ""  # the prelude up to this selector
                for part in split_top(prelude, ","):
                    lead = part[: len(part) - len(part.lstrip())]
                    found.append((line + (before + lead).count("\n"), " ".join(part.split())))
                    before += part + ","
            i = k

    walk(0, len(text))
    return found


def scoped(selector: str, page: str) -> bool:
    """Whether the selector only matches inside `[data-page="<page>"]` (the body while it is shown)."""
    prefix = f'[data-page="{page}"]'
    if not selector.startswith(prefix):
        return False
    rest = selector[len(prefix) :]
    # Then a combinator (a descendant of the body) or more of the body's own compound selector.
    return rest == "" or rest[0] in " >~+.:#["


def test_the_parser_sees_every_rule():
    """The parser on a sample: comments, @media, selector lists with commas inside :is() and
    attribute values, a rule spanning lines, an at-rule that is not a grouping one."""
    sample = """/* .commented { color: red } */
.a, .b > .c { x: 1; }
@media (max-width: 600px) {
  .d:is(.e, .f) { x: 2; }
  [title="g, h"] { x: 3; }
}
.i
{ x: 4; }
@keyframes spin { from { x: 0 } to { x: 1 } }
"""
    assert selectors(sample) == [
        (2, ".a"),
        (2, ".b > .c"),
        (4, ".d:is(.e, .f)"),
        (5, '[title="g, h"]'),
        (7, ".i"),
        (9, "@keyframes spin"),
    ]
    assert scoped('[data-page="keys"] .x', "keys")
    assert scoped('[data-page="keys"]', "keys")
    assert not scoped('[data-page="keys"] .x', "models")
    assert not scoped('[data-page="keysx"] .x', "keys")
    assert not scoped(".keys-table", "keys")


def page_names() -> set[str]:
    """The pages main.js routes to (their module names are the data-page values)."""
    return set(re.findall(r'module: "\./pages/([\w-]+)\.js"', MAIN_JS.read_text()))


def test_main_js_scopes_the_page_by_its_module_name():
    text = MAIN_JS.read_text()
    assert "document.body.dataset.page = pageName(route)" in text
    assert {"overview", "models", "keys", "requests", "settings", "signin"} <= page_names()


@pytest.mark.parametrize("path", sorted(PAGES_CSS.glob("*.css")), ids=lambda p: p.name)
def test_every_selector_of_a_page_sheet_is_scoped_to_that_page(path: Path):
    page = path.stem
    assert page in page_names(), f"{path.name}: no page named {page!r} in static/js/main.js's routes"
    found = selectors(path.read_text())
    assert found, f"{path.name} has no rules"
    leaks = [f"  line {line}: {sel}" for line, sel in found if not scoped(sel, page)]
    assert not leaks, (
        f"static/css/pages/{path.name}: {len(leaks)} selector(s) not scoped under "
        f'[data-page="{page}"] (docs/console.md, page-scoped CSS):\n' + "\n".join(leaks)
    )

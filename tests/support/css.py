"""A small, honest CSS reader for the page-scope rule (docs/console.md, "Page-scoped CSS"): every
selector in static/css/pages/<name>.css starts with `[data-page="<name>"]`.

`selectors(text)` finds every selector of every style rule: comments stripped (blanked, so lines
and offsets stay), rules split at top-level braces, @media/@supports/@container/@layer blocks
entered, selector lists split at commas outside (), [] and quotes. Other at-rules (@keyframes,
@font-face, @import) come back as their prelude: their names are global too. Used by
tests/test_css_scope.py (the check) and tools/scope_page_css.py (the mechanical fix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUPING = ("@media", "@supports", "@container", "@layer")


@dataclass(frozen=True)
class Selector:
    line: int  # 1-based, where the selector starts
    offset: int  # its first character in the text
    text: str  # whitespace collapsed


def strip_comments(text: str) -> str:
    """The text with each /* … */ comment blanked (spaces, newlines kept: offsets and lines stay)."""
    return re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def split_top(text: str, sep: str) -> list[tuple[int, str]]:
    """(offset, piece) of `text` split on `sep` where it is outside (), [] and quotes."""
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
            out.append((begin, text[begin:i]))
            begin = i + 1
    out.append((begin, text[begin:]))
    return out


def selectors(source: str) -> list[Selector]:
    """Every selector of every style rule in a style sheet, inside grouping at-rules too."""
    text = strip_comments(source)
    found: list[Selector] = []

    def at(offset: int, selector: str) -> Selector:
        return Selector(text.count("\n", 0, offset) + 1, offset, " ".join(selector.split()))

    def walk(start: int, end: int) -> None:
        i = start
        while i < end:
            brace = text.find("{", i, end)
            if brace < 0:
                rest = text[i:end].strip()
                assert not rest or rest.startswith("@import"), f"unparsed CSS: {rest[:60]!r}"
                if rest:
                    found.append(at(i + text[i:end].index(rest[0]), rest))
                return
            depth, k = 1, brace + 1
            while depth:
                assert k < end, "unbalanced braces"
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                k += 1
            prelude = text[i:brace]
            head = prelude.strip()
            if head.startswith(GROUPING):
                walk(brace + 1, k - 1)
            elif head:
                lead = len(prelude) - len(prelude.lstrip())
                if head.startswith("@"):
                    found.append(at(i + lead, head))
                else:
                    for offset, part in split_top(prelude, ","):
                        found.append(at(i + offset + len(part) - len(part.lstrip()), part))
            i = k

    walk(0, len(text))
    return found


def page_prefix(page: str) -> str:
    return f'[data-page="{page}"]'


def scoped(selector: str, page: str) -> bool:
    """Whether the selector only matches while `page` is shown: it starts with the page's
    `[data-page=…]` (the body's attribute), then a combinator or more of the body's own selector."""
    prefix = page_prefix(page)
    if not selector.startswith(prefix):
        return False
    rest = selector[len(prefix) :]
    return rest == "" or rest[0] in " >~+.:#["

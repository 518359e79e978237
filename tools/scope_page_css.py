"""Scope a page's style sheet (docs/console.md, "Page-scoped CSS"): prefix every selector in
static/css/pages/<name>.css that does not start with `[data-page="<name>"]` with it.

    python tools/scope_page_css.py static/css/pages/overview.css [more.css …]

Mechanical and idempotent: comments, spacing and already scoped selectors stay as they are. It
cannot decide two things, and says so (exit 1): an at-rule with a global name (@keyframes,
@font-face), and whether a rule styles a part that other pages show too (a dialog or panel built
by a shared module): such a rule belongs in console.css, not under one page. tests/test_css_scope.py
checks the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.css import page_prefix, scoped, selectors


def scope(path: Path) -> tuple[int, list[str]]:
    """Rewrite `path`; (selectors prefixed, at-rules left for a person)."""
    page = path.stem
    text = path.read_text()
    todo = [s for s in selectors(text) if not scoped(s.text, page)]
    left = [f"{path}:{s.line}: {s.text}" for s in todo if s.text.startswith("@")]
    fix = [s for s in todo if not s.text.startswith("@")]
    for s in sorted(fix, key=lambda s: s.offset, reverse=True):
        text = text[: s.offset] + page_prefix(page) + " " + text[s.offset :]
    if fix:
        path.write_text(text)
    return len(fix), left


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    problems: list[str] = []
    for name in argv:
        count, left = scope(Path(name))
        print(f"{name}: {count} selector(s) scoped")
        problems += left
    for line in problems:
        print(f"left as is (a global name; rename it after the page or move it to console.css): {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

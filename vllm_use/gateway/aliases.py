"""Model aliases (S5): rewrite the top-level `model` of a JSON body without touching other bytes.

Re-serialising a body would change big integers and long decimals (and key order,
spacing, escapes); so the body is scanned once, the byte span of each top-level
`"model"` string value is found, and only that span is replaced. Anything that is
not a JSON object is left alone (the upstream answers it).
"""

from __future__ import annotations

import json

_WS = b" \t\r\n"


class _Scan:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.i = 0

    def ws(self) -> None:
        while self.i < len(self.data) and self.data[self.i] in _WS:
            self.i += 1

    def string(self) -> tuple[int, int]:
        """The span of a JSON string starting at i (quotes included)."""
        start = self.i
        if self.data[self.i : self.i + 1] != b'"':
            raise ValueError("expected a string")
        self.i += 1
        while True:
            c = self.data[self.i]
            if c == 0x5C:  # backslash: skip the escaped character
                self.i += 2
                continue
            self.i += 1
            if c == 0x22:
                return start, self.i

    def value(self) -> tuple[int, int]:
        """The span of any JSON value starting at i, nested values included."""
        self.ws()
        start = self.i
        c = self.data[self.i : self.i + 1]
        if c == b'"':
            return self.string()
        if c in (b"{", b"["):
            depth = 0
            while True:
                c = self.data[self.i : self.i + 1]
                if c == b'"':
                    self.string()
                    continue
                self.i += 1
                if c in (b"{", b"["):
                    depth += 1
                elif c in (b"}", b"]"):
                    depth -= 1
                    if depth == 0:
                        return start, self.i
        while self.i < len(self.data) and self.data[self.i] not in b",}] \t\r\n":
            self.i += 1
        return start, self.i


def model_spans(body: bytes) -> list[tuple[int, int, str]]:
    """(start, end, value) of every top-level "model" whose value is a string."""
    scan = _Scan(body)
    scan.ws()
    if body[scan.i : scan.i + 1] != b"{":
        return []
    scan.i += 1
    spans = []
    while True:
        scan.ws()
        if body[scan.i : scan.i + 1] == b"}":
            return spans
        key_start, key_end = scan.string()
        key = json.loads(body[key_start:key_end])
        scan.ws()
        scan.i += 1  # the colon
        start, end = scan.value()
        if key == "model" and body[start : start + 1] == b'"':
            spans.append((start, end, json.loads(body[start:end])))
        scan.ws()
        if body[scan.i : scan.i + 1] == b",":
            scan.i += 1


def rewrite_model(body: bytes, aliases: dict[str, str]) -> tuple[bytes, str | None]:
    """(the body with aliased `model` values replaced, the model as the client sent it).

    A body that is not a valid JSON object is returned unchanged.
    """
    if not body:
        return body, None
    try:
        json.loads(body)  # validity first: the scanner assumes well-formed JSON
        spans = model_spans(body)
    except (ValueError, IndexError, UnicodeDecodeError):
        return body, None
    if not spans:
        return body, None
    sent = spans[-1][2]  # what a JSON parser keeps: the last duplicate wins
    if not aliases:
        return body, sent
    out, last = [], 0
    for start, end, value in spans:
        if value in aliases:
            out += [body[last:start], json.dumps(aliases[value]).encode()]
            last = end
    out.append(body[last:])
    return b"".join(out), sent

"""Model aliases (S5): rewrite the top-level `model` of a JSON body without touching other bytes.

Re-serialising a body would change big integers and long decimals (and key order,
spacing, escapes); so the body is scanned once, the byte span of each top-level
`"model"` string value is found, and only that span is replaced. Anything that is
not a JSON object is left alone (the upstream answers it).
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\r\n]*")


def model_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, value), in characters, of every top-level "model" whose value is a string.

    `text` must be valid JSON (the caller checks). Each top-level value is skipped by the C
    scanner (`raw_decode`), never by a Python loop per byte: a 16 MiB prompt costs milliseconds.
    """
    i = _WS.match(text).end()
    if text[i : i + 1] != "{":
        return []
    i = _WS.match(text, i + 1).end()
    spans: list[tuple[int, int, str]] = []
    while text[i] != "}":
        key, i = scanstring(text, i + 1)  # i was the key's opening quote
        i = _WS.match(text, _WS.match(text, i).end() + 1).end()  # past the colon
        value, end = _DECODER.raw_decode(text, i)
        if key == "model" and isinstance(value, str):
            spans.append((i, end, value))
        i = _WS.match(text, end).end()
        if text[i] == ",":
            i = _WS.match(text, i + 1).end()
    return spans


def prepare_body(body: bytes, aliases: dict[str, str]) -> tuple[bytes, str | None, bool]:
    """(the body with aliased `model` values replaced, the model as the client sent it, the body's
    `"stream": true` flag), from one parse. A body that is not a JSON object is returned unchanged."""
    if not body:
        return body, None, False
    try:
        text = body.decode("utf-8")  # valid UTF-8 decodes and re-encodes to the very same bytes
        parsed = json.loads(text)  # validity first: the scanner assumes well-formed JSON
    except ValueError:
        return body, None, False
    if not isinstance(parsed, dict):
        return body, None, False
    stream = bool(parsed.get("stream"))
    model = parsed.get("model")
    sent = model if isinstance(model, str) else None
    if not aliases:
        return body, sent, stream  # the last duplicate wins, in json.loads as in the upstream
    spans = model_spans(text)
    out, last = [], 0
    for start, end, value in spans:
        if value in aliases:
            out += [text[last:start], json.dumps(aliases[value])]
            last = end
    if not out:
        return body, sent, stream
    out.append(text[last:])
    return "".join(out).encode("utf-8"), sent, stream

"""Model aliases: read a body's top-level `model` and `stream`, rewrite `model` in place.

Rules and limits (docs/gateway.md):

- **Bytes kept.** Re-serialising a body would change big integers and long decimals (and key
  order, spacing, escapes); so the byte span of each top-level `"model"` string value is found
  and only that span is replaced.
- **Nothing big is parsed.** Only the top-level `model` and `stream` values are decoded. Every
  other value is skipped, not built: strings by json's C `scanstring`, nested values by bracket
  depth with an explicit stack (no recursion, so a body nested 100k deep costs a list, not the C
  stack), and the runs between brackets by one regular expression per `WINDOW` characters (whole
  strings included), so a 16 MiB prompt costs milliseconds.
- **The loop keeps serving.** The scan is Python bytecode per bracket and per window, so a thread
  running it gives the GIL back every switch interval; `prepare_body_async` runs bodies larger
  than `INLINE_LIMIT` in the default executor (one `json.loads` in a thread would hold the GIL for
  the whole parse, and on the IOLoop it stalled every other request for a second).
- **Depth.** A body nested deeper than `MAX_DEPTH` levels is refused (`InvalidArguments`, 400):
  no Python upstream can parse it (its recursion limit is about 1000), and it must never reach one.
- **Malformed bodies pass unchanged.** A body that is not a JSON object, or whose top level is
  malformed, is returned as is (the upstream answers it). Inside nested values only strings and
  bracket pairing are checked; the grammar between them (commas, numbers) is the upstream's.
"""

from __future__ import annotations

import asyncio
import json
import re
from json.decoder import scanstring

from vllm_use.errors import InvalidArguments

MAX_DEPTH = 512
INLINE_LIMIT = 32 * 1024  # bodies up to this are scanned on the IOLoop (a few milliseconds at worst)
WINDOW = 16 * 1024  # characters per regular-expression call: bounds how long one call holds the GIL

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\r\n]*")
# What needs no bookkeeping inside a nested value, taken in C by one expression: the characters
# between strings and brackets, whole strings (their escapes checked as JSON does), and whole
# containers holding no other container (`{"role":"user"}`, `[1,2]`), so the Python loop only
# turns for the brackets of containers that hold containers. Possessive: nothing to backtrack.
_STRING = r'"[^"\\\x00-\x1f]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*+)*+"'
_BETWEEN = r'[^"\[\]{}\\]*+'
_FLAT = rf"{_BETWEEN}(?:{_STRING}{_BETWEEN})*+"
_PLAIN = re.compile(rf"{_BETWEEN}(?:(?:{_STRING}|\{{{_FLAT}\}}|\[{_FLAT}\]){_BETWEEN})*+")
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_CLOSER = {"[": "]", "{": "}"}


class _Malformed(Exception):
    """The body is not well-formed where the scan looked: it is passed through unchanged."""


def _skip_value(text: str, i: int, outer: int) -> int:
    """The index just past the JSON value starting at `text[i]` (no whitespace before it), which
    sits inside `outer` containers."""
    n = len(text)
    if i >= n:
        raise _Malformed
    first = text[i]
    if first == '"':
        return scanstring(text, i + 1)[1]
    if first not in _CLOSER:
        scalar = _SCALAR.match(text, i)
        if scalar is None:
            raise _Malformed
        return scalar.end()
    plain = _PLAIN.match
    closers = [_CLOSER[first]]  # never empty in the loop: a run of _PLAIN stays inside the value
    i += 1
    while True:
        if i >= n:
            raise _Malformed  # an unclosed bracket
        char = text[i]
        if char == "]" or char == "}":
            if closers.pop() != char:
                raise _Malformed
            i += 1
            if not closers:
                return i
            continue
        end = plain(text, i, min(i + WINDOW, n)).end()
        if end > i:
            i = end
        elif char in _CLOSER:  # a container holding containers
            closers.append(_CLOSER[char])
            # _PLAIN may take one more container whole: the innermost.
            if outer + len(closers) + 1 > MAX_DEPTH:
                raise InvalidArguments(
                    f"the body is JSON nested deeper than {MAX_DEPTH} levels", errors=[{"loc": ["body"]}]
                )
            i += 1
        elif char == '"':
            # A string the expression could not take whole: one crossing the window, or a bad one.
            i = scanstring(text, i + 1)[1]
        else:
            raise _Malformed  # a backslash outside a string


def scan(text: str) -> tuple[list[tuple[int, int, str]], str | None, bool] | None:
    """(the spans (start, end, value) of every top-level "model" string, the model as the upstream
    reads it (the last duplicate wins), the `stream` flag), or None when `text` is not a JSON object.

    Raises InvalidArguments for a body nested deeper than MAX_DEPTH.
    """
    ws = _WS.match
    try:
        i = ws(text).end()
        if text[i : i + 1] == "[":
            _skip_value(text, i, 0)  # not an object, but its depth is checked all the same
        if text[i : i + 1] != "{":
            return None
        i = ws(text, i + 1).end()
        spans: list[tuple[int, int, str]] = []
        model: str | None = None
        stream = False
        if text[i : i + 1] == "}":
            i += 1
        else:
            while True:
                if text[i : i + 1] != '"':
                    raise _Malformed
                key, i = scanstring(text, i + 1)
                i = ws(text, i).end()
                if text[i : i + 1] != ":":
                    raise _Malformed
                i = ws(text, i + 1).end()
                end = _skip_value(text, i, 1)
                if key == "model":
                    model = _DECODER.decode(text[i:end]) if text[i] == '"' else None
                    if model is not None:
                        spans.append((i, end, model))
                elif key == "stream":
                    stream = _truthy(text, i, end)
                i = ws(text, end).end()
                separator = text[i : i + 1]
                if separator == "}":
                    i += 1
                    break
                if separator != ",":
                    raise _Malformed
                i = ws(text, i + 1).end()
        if ws(text, i).end() != len(text):
            return None  # something after the object
    except (_Malformed, ValueError, IndexError):  # scanstring's JSONDecodeError is a ValueError
        return None
    return spans, model, stream


def _truthy(text: str, start: int, end: int) -> bool:
    """`bool(value)` of the JSON value text[start:end], as `bool(json.loads(...)["stream"])` was."""
    if text[start] in _CLOSER:  # a container is true when it holds anything
        return _WS.match(text, start + 1).end() < end - 1
    return bool(_DECODER.decode(text[start:end]))


def prepare_body(body: bytes, aliases: dict[str, str]) -> tuple[bytes, str | None, bool]:
    """(the body with aliased `model` values replaced, the model as the client sent it, the body's
    `"stream"` flag). A body that is not a JSON object is returned unchanged. Runs anywhere: on
    the IOLoop for small bodies, in an executor for big ones (`prepare_body_async`)."""
    if not body:
        return body, None, False
    try:
        text = body.decode("utf-8")  # valid UTF-8 decodes and re-encodes to the very same bytes
    except UnicodeDecodeError:
        return body, None, False
    found = scan(text)
    if found is None:
        return body, None, False
    spans, sent, stream = found
    out, last = [], 0
    for start, end, value in spans:
        if value in aliases:
            out += [text[last:start], json.dumps(aliases[value])]
            last = end
    if not out:
        return body, sent, stream
    out.append(text[last:])
    return "".join(out).encode("utf-8"), sent, stream


async def prepare_body_async(body: bytes, aliases: dict[str, str]) -> tuple[bytes, str | None, bool]:
    """`prepare_body`, on the IOLoop up to INLINE_LIMIT bytes, else in the default executor."""
    if len(body) <= INLINE_LIMIT:
        return prepare_body(body, aliases)
    return await asyncio.get_running_loop().run_in_executor(None, prepare_body, body, aliases)

"""Request bodies: read the top-level `model`, `stream` and `stream_options`, rewrite `model`
(aliases) and ask for a stream's usage chunk, in place.

Rules and limits (docs/gateway.md):

- **Bytes kept.** Re-serialising a body would change big integers and long decimals (and key
  order, spacing, escapes); so the byte span of each top-level `"model"` string value is found
  and only that span is replaced. The usage chunk of a chat or completions stream is asked for
  the same way: `"stream_options":{"include_usage":true},` inserted after the object's `{`, or the
  client's own small `stream_options` object replaced (docs/observability.md, "Token accounting").
- **Nothing big is parsed.** Only the top-level `model`, `stream` and `stream_options` values are
  decoded. Every other value is skipped, not built: strings by json's C `scanstring`, nested values
  by bracket depth with an explicit stack (no recursion, so a body nested 100k deep costs a list,
  not the C stack), and the runs between brackets by one regular expression per `WINDOW`
  characters (whole strings included), so a 16 MiB prompt costs milliseconds. `members` is the
  same scan for any object (the usage tap reads responses with it).
- **The loop keeps serving.** The scan is Python bytecode per bracket and per window, so a thread
  running it gives the GIL back every switch interval; `prepare_async` runs bodies larger
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
import functools
import json
import re
from json.decoder import scanstring
from typing import Literal, NamedTuple

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


class _Malformed(ValueError):
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


def members(text: str, i: int) -> tuple[list[tuple[str, int, int]], int]:
    """(key, value start, value end) of each member of the JSON object starting at `text[i]` (a
    `{`), in order, duplicates included, and the index just past the object. Values are skipped,
    not decoded (`_skip_value`); the object sits `depth` levels deep for the depth cap.

    Raises _Malformed (a ValueError) when the object is not well-formed where the scan looked, and
    InvalidArguments when it nests deeper than MAX_DEPTH."""
    ws = _WS.match
    if text[i : i + 1] != "{":
        raise _Malformed
    i = ws(text, i + 1).end()
    found: list[tuple[str, int, int]] = []
    if text[i : i + 1] == "}":
        return found, i + 1
    while True:
        if text[i : i + 1] != '"':
            raise _Malformed
        key, i = scanstring(text, i + 1)
        i = ws(text, i).end()
        if text[i : i + 1] != ":":
            raise _Malformed
        i = ws(text, i + 1).end()
        end = _skip_value(text, i, 1)
        found.append((key, i, end))
        i = ws(text, end).end()
        separator = text[i : i + 1]
        if separator == "}":
            return found, i + 1
        if separator != ",":
            raise _Malformed
        i = ws(text, i + 1).end()


def scan(text: str) -> Scanned | None:
    """What the gateway reads of a request body (`Scanned`), or None when `text` is not a JSON
    object.

    Raises InvalidArguments for a body nested deeper than MAX_DEPTH.
    """
    ws = _WS.match
    try:
        i = ws(text).end()
        if text[i : i + 1] == "[":
            _skip_value(text, i, 0)  # not an object, but its depth is checked all the same
        if text[i : i + 1] != "{":
            return None
        found, end = members(text, i)
        if ws(text, end).end() != len(text):
            return None  # something after the object
        spans: list[tuple[int, int, str]] = []
        model: str | None = None
        stream = False
        options: tuple[int, int] | None = None
        for key, start, stop in found:
            if key == "model":
                model = _DECODER.decode(text[start:stop]) if text[start] == '"' else None
                if model is not None:
                    spans.append((start, stop, model))
            elif key == "stream":
                stream = _truthy(text, start, stop)
            elif key == "stream_options":
                options = (start, stop)
    except (_Malformed, ValueError, IndexError):  # scanstring's JSONDecodeError is a ValueError
        return None
    return Scanned(spans, model, stream, i + 1, options)


class Scanned(NamedTuple):
    """A request body as `scan` read it."""

    spans: list[tuple[int, int, str]]  # (start, end, value) of every top-level "model" string
    model: str | None  # the model as the upstream reads it (the last duplicate wins)
    stream: bool  # the `stream` flag
    opened: int  # the index just after the object's `{`
    stream_options: tuple[int, int] | None  # the span of the last top-level `stream_options` value


def _truthy(text: str, start: int, end: int) -> bool:
    """`bool(value)` of the JSON value text[start:end], as `bool(json.loads(...)["stream"])` was."""
    if text[start] in _CLOSER:  # a container is true when it holds anything
        return _WS.match(text, start + 1).end() < end - 1
    return bool(_DECODER.decode(text[start:end]))


# A stream's final usage chunk (docs/observability.md, "Token accounting"): "asked" by the client,
# "added" by us (the tap strips it again), or "none" (no chunk: its tokens are not known).
Usage = Literal["asked", "added", "none"]
ADD_USAGE = '"stream_options":{"include_usage":true},'
OPTIONS_MAX = 4096  # characters of a client's `stream_options` we read; a longer one is left alone


class Prepared(NamedTuple):
    """A request body made ready for the upstream (`prepare`)."""

    body: bytes
    model: str | None  # the model as the client sent it
    stream: bool  # the body's `"stream"` flag
    usage: Usage  # for a stream: whether its usage chunk comes, and who asked for it


def prepare(body: bytes, aliases: dict[str, str], *, add_usage: bool = False) -> Prepared:
    """The body with aliased `model` values replaced and, when `add_usage` (a chat or completions
    route) and it streams, `stream_options.include_usage` set; a body that is not a JSON object is
    returned unchanged. Runs anywhere: on the IOLoop for small bodies, in an executor for big
    ones (`prepare_async`)."""
    if not body:
        return Prepared(body, None, False, "none")
    try:
        text = body.decode("utf-8")  # valid UTF-8 decodes and re-encodes to the very same bytes
    except UnicodeDecodeError:
        return Prepared(body, None, False, "none")
    found = scan(text)
    if found is None:
        return Prepared(body, None, False, "none")
    edits: list[tuple[int, int, str]] = [
        (start, end, json.dumps(aliases[value])) for start, end, value in found.spans if value in aliases
    ]
    usage: Usage = "none"
    if add_usage and found.stream:
        usage, edit = _usage_edit(text, found)
        if edit is not None:
            edits.append(edit)
            edits.sort()
    if not edits:
        return Prepared(body, found.model, found.stream, usage)
    out, last = [], 0
    for start, end, replacement in edits:
        out += [text[last:start], replacement]
        last = end
    out.append(text[last:])
    return Prepared("".join(out).encode("utf-8"), found.model, found.stream, usage)


def _usage_edit(text: str, found: Scanned) -> tuple[Usage, tuple[int, int, str] | None]:
    """Whether the client asked for the usage chunk, and the edit that asks for it when it did not.

    Only the client's own choice is kept where asking would change more than that one chunk:
    `continuous_usage_stats` puts usage on every chunk, and a value we do not read is left alone."""
    if found.stream_options is None:
        return "added", (found.opened, found.opened, ADD_USAGE)
    start, end = found.stream_options
    if end - start > OPTIONS_MAX:
        return "none", None
    try:
        options = _DECODER.decode(text[start:end])
    except ValueError:
        return "none", None  # the upstream refuses it
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return "none", None  # the upstream refuses it
    if options.get("include_usage"):
        return "asked", None
    if options.get("continuous_usage_stats"):
        return "none", None
    added = json.dumps({**options, "include_usage": True}, separators=(",", ":"), ensure_ascii=False)
    return "added", (start, end, added)


async def prepare_async(body: bytes, aliases: dict[str, str], *, add_usage: bool = False) -> Prepared:
    """`prepare`, on the IOLoop up to INLINE_LIMIT bytes, else in the default executor."""
    if len(body) <= INLINE_LIMIT:
        return prepare(body, aliases, add_usage=add_usage)
    return await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(prepare, body, aliases, add_usage=add_usage)
    )

"""The usage tap: the token counts of a `/v1` response read as it is relayed (docs/observability.md,
"Token accounting").

Where the counts are, per route (what vLLM 0.32 sends):

- A JSON answer: its top-level `usage`: `prompt_tokens`/`completion_tokens` (chat, completions,
  embeddings) or `input_tokens`/`output_tokens` (`/v1/responses`, `/v1/messages`). The body is
  kept (up to `BODY_MAX`) and read once it is complete: parsed whole up to `PARSE_MAX`, else by
  the request scan of vllm_use/gateway/aliases.py (values skipped, not built; off the IOLoop past
  `INLINE_LIMIT`).
- A chat or completions stream: its last data event, `"choices":[]` with `usage`, which vLLM
  sends only when asked (`stream_options.include_usage`). The gateway asks when the client did not
  (vllm_use/gateway/aliases.py) and the tap takes that event out again, so the client (and a
  resumable session's buffer) receives the bytes of a direct request: with usage asked for, vLLM
  moves `system_fingerprint` from the terminal chunks (those with a `finish_reason`) to the usage
  event, so the terminal chunks are held from the first one until the usage event, and get it back.
- A `/v1/responses` stream: `response.completed`, whose `response.usage` has the counts.
- A `/v1/messages` stream: `message_start` (`message.usage.input_tokens`) and `message_delta`
  (`usage.output_tokens`); nothing is taken out.

Cost per chunk on the IOLoop: a `bytes.find` of one marker, and a `bytes.rfind` when a chunk ends
inside an event (vLLM writes each event whole, so chunks usually end on an event boundary). Only
the event that carries usage is parsed. Counts are kept when they are ints in 0..2**31, else they
are not known (None), as they are for a stream cut before its end (vLLM reports them last).
"""

from __future__ import annotations

import asyncio
import json
from json.encoder import encode_basestring
from typing import Any

from vllm_use.errors import InvalidArguments
from vllm_use.gateway.aliases import INLINE_LIMIT, Usage, members

COUNT_MAX = 2**31
PARSE_MAX = 8 * 1024  # a JSON answer up to this is parsed whole, a longer one scanned (value_at)
BODY_MAX = 32 * 1024 * 1024  # a longer JSON answer is relayed, its counts are not known
PARTIAL_MAX = 1024 * 1024  # an event longer than this is not looked into
HOLD_MAX = 1024 * 1024  # terminal chunks held for their fingerprint; past this they go out as they are

_BOUNDARY = b"\n\n"
_FINISHED = b'"finish_reason":"'  # a terminal chunk (a null finish_reason is not a string)
_USAGE_EVENT = b'"choices":[]'  # vLLM's usage event; its other chunks hold one choice or more
_FINGERPRINT = b'"system_fingerprint"'
_FIELDS = {
    "chat/completions": ("prompt_tokens", "completion_tokens"),
    "completions": ("prompt_tokens", "completion_tokens"),
    "embeddings": ("prompt_tokens", "completion_tokens"),
    "responses": ("input_tokens", "output_tokens"),
    "messages": ("input_tokens", "output_tokens"),
}


def count(value: Any) -> int | None:
    """A token count as we keep it: an int in 0..2**31 (not a bool), else None."""
    return value if type(value) is int and 0 <= value <= COUNT_MAX else None


def value_at(text: str, path: tuple[str, ...]) -> Any:
    """The JSON value at `path` (keys of nested objects; the last duplicate wins) in the JSON
    object `text`, decoding only that value; None when it is not there or `text` is malformed."""
    i = len(text) - len(text.lstrip(" \t\r\n"))
    end = len(text)
    try:
        for key in path:
            found = [(start, stop) for name, start, stop in members(text, i)[0] if name == key]
            if not found:
                return None
            i, end = found[-1]
        return json.loads(text[i:end])
    except (ValueError, RecursionError, IndexError, InvalidArguments):  # malformed, or nested too deep
        return None


def _start(data: bytes, at: int) -> int:
    """Where the event holding `data[at]` starts (`data` starts on an event boundary)."""
    before = data.rfind(_BOUNDARY, 0, at)
    return before + 2 if before >= 0 else 0


def _data(event: bytes) -> str:
    """The data of one SSE event (vLLM's events have one `data:` line). A str: `json.loads` of
    bytes first guesses their encoding in Python."""
    at = event.find(b"data:")
    if at < 0:
        return ""
    end = event.find(b"\n", at)
    return event[at + 5 : end if end >= 0 else len(event)].decode("utf-8", "replace")


class Tap:
    """One response's counts. `feed` each body chunk (it returns what to relay), `end` at the end
    of the body (what was held back), then `settle` (reads a JSON answer). Runs on the IOLoop."""

    def __init__(self, names: tuple[str, str]) -> None:
        self.names = names
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def end(self) -> bytes:
        return b""

    async def settle(self) -> None:
        return None

    def _take(self, usage: Any) -> None:
        if isinstance(usage, dict):
            prompt, completion = (count(usage.get(name)) for name in self.names)
            self.prompt_tokens = prompt if prompt is not None else self.prompt_tokens
            self.completion_tokens = completion if completion is not None else self.completion_tokens


class JsonTap(Tap):
    """A JSON answer: kept whole (≤ BODY_MAX), its top-level `usage` read at the end."""

    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__(names)
        self._chunks: list[bytes] | None = []
        self._size = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._chunks is not None:
            self._size += len(chunk)
            if self._size > BODY_MAX:
                self._chunks = None
            else:
                self._chunks.append(chunk)
        return chunk

    async def settle(self) -> None:
        if not self._chunks:
            return
        body, self._chunks = b"".join(self._chunks), None
        if len(body) <= INLINE_LIMIT:
            usage = _usage_of(body)
        else:
            usage = await asyncio.get_running_loop().run_in_executor(None, _usage_of, body)
        self._take(usage)


def _usage_of(body: bytes) -> Any:
    try:
        if len(body) <= PARSE_MAX:  # small: json's C parser is quicker than the scan
            found = json.loads(body)
            return found.get("usage") if isinstance(found, dict) else None
        return value_at(body.decode("utf-8"), ("usage",))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


class EventTap(Tap):
    """An SSE stream relayed as it comes: each event holding `marker` is read (`_event`)."""

    marker = b""

    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__(names)
        self._partial = b""  # the bytes of an event not finished yet

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk if self._partial else chunk
        self._partial = b""
        at = data.find(self.marker)
        last = 0
        while at >= 0:
            start = _start(data, at)
            stop = data.find(_BOUNDARY, at)
            if stop < 0:
                self._keep(data[start:])
                return chunk
            self._event(data[start:stop])
            last = stop + 2
            at = data.find(self.marker, last)
        if not data.endswith(_BOUNDARY):
            self._keep(data[max(_start(data, len(data)), last) :])
        return chunk

    def _keep(self, rest: bytes) -> None:
        self._partial = rest if len(rest) <= PARTIAL_MAX else b""

    def _event(self, event: bytes) -> None:
        raise NotImplementedError


class OpenAIStreamTap(EventTap):
    """A chat or completions stream whose client asked for the usage event: it passes."""

    marker = _USAGE_EVENT

    def _event(self, event: bytes) -> None:
        self._take(value_at(_data(event), ("usage",)))


class ResponsesStreamTap(EventTap):
    marker = b"event: response.completed\n"

    def _event(self, event: bytes) -> None:
        self._take(value_at(_data(event), ("response", "usage")))


class MessagesStreamTap(EventTap):
    marker = b"event: message_"  # message_start, message_delta, message_stop

    def _event(self, event: bytes) -> None:
        if event.startswith(b"event: message_start\n"):
            self._take(value_at(_data(event), ("message", "usage")))
        elif event.startswith(b"event: message_delta\n"):
            self._take(value_at(_data(event), ("usage",)))


class StrippingTap(Tap):
    """A chat or completions stream whose usage event we asked for: it is read and taken out, and
    the terminal chunks before it get their `system_fingerprint` back. Only whole events go out
    (an event's unfinished end waits for the rest of it)."""

    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__(names)
        self._partial = b""
        self._held: bytes | None = None  # from the first terminal chunk on
        self._patch = True  # False once the held chunks outgrew HOLD_MAX and went out as they were

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk if self._partial else chunk
        self._partial = b""
        if not data.endswith(_BOUNDARY):
            cut = _start(data, len(data))
            if len(data) - cut <= PARTIAL_MAX:  # an event longer than that is not held back
                data, self._partial = data[:cut], data[cut:]
        out = b""
        if self._held is None:
            at = data.find(_FINISHED if self._patch else _USAGE_EVENT)
            if at < 0:
                return data
            start = _start(data, at)
            out, self._held = data[:start], data[start:]
        else:
            self._held += data
        at = self._held.find(_USAGE_EVENT)
        stop = self._held.find(_BOUNDARY, at) if at >= 0 else -1
        if stop < 0:  # no usage event yet, or not all of it
            if len(self._held) > HOLD_MAX:
                out, self._held, self._patch = out + self._held, None, False
            return out
        start, stop = _start(self._held, at), stop + 2
        before, event, after = self._held[:start], self._held[start:stop], self._held[stop:]
        self._held = None
        try:
            found = json.loads(_data(event))
        except (ValueError, RecursionError):
            found = None
        if isinstance(found, dict):
            self._take(found.get("usage"))
            fingerprint = found.get("system_fingerprint")
            if self._patch and isinstance(fingerprint, str):
                before = _fingerprinted(before, fingerprint)
        self._patch = False  # one usage event per stream: the rest passes
        return out + before + after

    def end(self) -> bytes:
        rest = (self._held or b"") + self._partial
        self._held, self._partial = None, b""
        return rest


def _fingerprinted(events: bytes, fingerprint: str) -> bytes:
    """`events` (whole SSE events) with `"system_fingerprint":…` appended to each terminal chunk's
    JSON, where vLLM puts it when usage is not asked for (the chunk's last field)."""
    tail = b',"system_fingerprint":' + encode_basestring(fingerprint).encode() + b"}"  # as json.dumps
    parts = events.split(_BOUNDARY)
    for n, part in enumerate(parts):
        if _FINISHED in part and part.endswith(b"}") and _FINGERPRINT not in part:
            parts[n] = part[:-1] + tail
    return _BOUNDARY.join(parts)


def tap_for(path: str, status: int, content_type: str, usage: Usage) -> Tap | None:
    """The tap of one `/v1/<path>` answer (None: nothing to read). `usage`: what became of a
    stream's usage event (vllm_use/gateway/aliases.py)."""
    names = _FIELDS.get(path)
    if names is None or status != 200:
        return None
    if not content_type.startswith("text/event-stream"):
        return JsonTap(names) if content_type.startswith("application/json") else None
    if path == "responses":
        return ResponsesStreamTap(names)
    if path == "messages":
        return MessagesStreamTap(names)
    if path == "embeddings" or usage == "none":
        return None
    return StrippingTap(names) if usage == "added" else OpenAIStreamTap(names)

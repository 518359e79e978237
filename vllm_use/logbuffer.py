"""Bounded, line-oriented logs of a child process (docs/security.md, "Children").

Each line is cut to `LINE_MAX` bytes on a UTF-8 boundary; the buffer keeps at
most `TOTAL_MAX` bytes of text, dropping the oldest lines first. `feed` accepts
raw chunks as they come off the pipe, so a child that prints one endless line
never makes us hold more than one line's worth plus the buffer.

Text bytes alone would let a child that prints millions of empty lines grow the
buffer without bound (each stored line costs a bytes object and a deque slot,
~`LINE_OVERHEAD` bytes, whatever its length). So each line is also charged its
real cost, and the cost is held under `COST_MAX` (docs/security.md).
"""

from __future__ import annotations

import re
from collections import deque
from typing import BinaryIO

# Terminal colour and cursor sequences (CSI) and OSC titles: noise in a stored log.
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
LINE_MAX = 64 * 1024
TOTAL_MAX = 4 * 1024 * 1024
LINE_OVERHEAD = 48  # a CPython bytes object's header (33) and its deque slot (8), rounded up
COST_MAX = 2 * TOTAL_MAX


def cut_utf8(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes of `data`, never ending inside a UTF-8 sequence."""
    if len(data) <= limit:
        return data
    end = limit
    # Step back over continuation bytes (10xxxxxx) to the start of the cut character; a UTF-8
    # character has at most 3 of them, so invalid input is cut at the limit instead of emptied.
    while end > limit - 3 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end] if (data[end] & 0xC0) != 0x80 else data[:limit]


class LogBuffer:
    def __init__(
        self, line_max: int = LINE_MAX, total_max: int = TOTAL_MAX, cost_max: int = COST_MAX
    ) -> None:
        self.line_max = line_max
        self.total_max = total_max
        self.cost_max = cost_max
        self._lines: deque[bytes] = deque()
        self._size = 0  # text bytes, newlines included: what the limit is stated in
        self._cost = 0  # text bytes plus LINE_OVERHEAD per line: what the lines really take
        self._partial = bytearray()
        self._partial_cut = False
        self.dropped_lines = 0

    def feed(self, chunk: bytes) -> None:
        """Add raw output; complete lines are stored, the tail waits for its newline."""
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if not self._partial_cut:
                room = self.line_max + 4 - len(self._partial)  # +4: room to cut on a boundary later
                self._partial += piece[: max(room, 0)]
                if len(piece) > room:
                    self._partial_cut = True
            if newline < 0:
                return
            self._push(bytes(self._partial))
            self._partial.clear()
            self._partial_cut = False
            start = newline + 1

    def close(self) -> None:
        """The child's output ended: keep an unterminated last line."""
        if self._partial:
            self._push(bytes(self._partial))
            self._partial.clear()
            self._partial_cut = False

    def _push(self, line: bytes) -> None:
        line = cut_utf8(_ANSI.sub(b"", line).rstrip(b"\r"), self.line_max)
        self._lines.append(line)
        self._size += len(line) + 1
        self._cost += len(line) + 1 + LINE_OVERHEAD
        while (self._size > self.total_max or self._cost > self.cost_max) and self._lines:
            dropped = len(self._lines.popleft()) + 1
            self._size -= dropped
            self._cost -= dropped + LINE_OVERHEAD
            self.dropped_lines += 1

    def lines(self, tail: int | None = None) -> list[str]:
        items = list(self._lines)[-tail:] if tail else list(self._lines)
        return [line.decode("utf-8", "replace") for line in items]

    def last_line(self, prefer: bytes | None = None) -> str | None:
        """The newest non-blank line (the newest starting with `prefer` if there is one)."""
        fallback = None
        for line in reversed(self._lines):
            if not line.strip():
                continue
            if prefer is None or line.startswith(prefer):
                return line.decode("utf-8", "replace")
            fallback = fallback or line
        return fallback.decode("utf-8", "replace") if fallback else None

    def write_to(self, f: BinaryIO) -> None:
        """Write the lines to a binary file, without building one big copy of the log."""
        for line in self._lines:
            f.write(line)
            f.write(b"\n")

    @property
    def size(self) -> int:
        return self._size

    @property
    def cost(self) -> int:
        """What the stored lines take in memory, approximately; never above `cost_max`."""
        return self._cost

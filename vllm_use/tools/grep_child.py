"""The search of grep_search, run as a child process by `search` (docs/tools.md, "File tools").

It reads one JSON request on stdin and writes JSON lines on stdout: `{"match": "path:line: text"}`
per matching line, then `{"end": true, "skipped": n}`, or `{"error": "…"}`. It resolves the path
itself with `confine`, from a descriptor of the root, as every file tool does; walks with
`confine.walk` (no symlinks, regular files only, MAX_DEPTH); skips files over 1 MiB or not text
(the read_file rule); and stops by itself after GREP_MAX_MATCHES + 1 matches. It imports only the
standard library and `confine`, so that it starts fast.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_use.tools.base import ToolError
from vllm_use.tools.confine import (
    FILE_MAX_BYTES,
    lines,
    open_entry,
    open_path,
    open_root,
    read_text,
    split,
    walk,
)

GREP_MAX_MATCHES = 200  # then a note says there are more
LINE_MAX_CHARS = 500  # a matching line is cut here


def main() -> None:
    """Read the request from stdin, write what matches to stdout; the whole life of the child."""
    out = sys.stdout.buffer

    def emit(message: dict[str, Any]) -> None:
        # ASCII JSON: a file name that is not UTF-8 (a lone surrogate in Python) still travels
        out.write(json.dumps(message).encode("ascii") + b"\n")
        out.flush()

    request = json.loads(sys.stdin.buffer.read())
    try:
        flags = 0 if request["case_sensitive"] else re.IGNORECASE
        source = request["pattern"] if request["regex"] else re.escape(request["pattern"])
        try:
            compiled = re.compile(source, flags)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from None
        root_fd = open_root(Path(request["root"]))
        parts = split(request["path"])
        fd, st = open_path(root_fd, parts, request["path"])
        count = 0
        skipped = 0
        for path, text in _texts(fd, parts, stat.S_ISREG(st.st_mode)):
            if text is None:
                skipped += 1
                continue
            if not request["regex"] and not compiled.search(text):
                continue  # a fixed string absent from the whole text is absent from every line
            for number, line in enumerate(lines(text), 1):
                line = line.removesuffix("\n").removesuffix("\r")
                if compiled.search(line):
                    if len(line) > LINE_MAX_CHARS:
                        line = line[:LINE_MAX_CHARS] + "…"
                    emit({"match": f"{path}:{number}: {line}"})
                    count += 1
                    if count > GREP_MAX_MATCHES:
                        return
        emit({"end": True, "skipped": skipped})
    except ToolError as exc:
        emit({"error": exc.message})
    except OSError as exc:  # strerror only: the exception's file name could be an absolute path
        emit({"error": f"the search failed: {exc.strerror or 'unknown error'}"})


def _texts(fd: int, parts: list[str], is_file: bool) -> Iterator[tuple[str, str | None]]:
    """(path, text or None when skipped) for the file `fd`, or each file under the directory."""
    if is_file:
        path = "/".join(parts)
        yield path, read_text(fd, path)  # a file named on purpose: say why it cannot be searched
        return
    for entry in walk(fd, "".join(part + "/" for part in parts), lambda: False):
        if entry.is_dir:
            continue
        if entry.size > FILE_MAX_BYTES:
            yield entry.path, None
            continue
        try:
            file_fd, _ = open_entry(entry.dir_fd, entry.name, entry.path)
        except ToolError:
            continue  # replaced by a link or a FIFO since the listing
        try:
            yield entry.path, read_text(file_fd, entry.path)
        except ToolError:
            yield entry.path, None
        except OSError:
            continue
        finally:
            os.close(file_fd)

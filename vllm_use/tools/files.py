"""The built-in file tools, confined to --tools-root (docs/tools.md, "File tools").

list_files, file_glob_search, read_file and grep_search only read; write_file and edit_file write
(the chat asks before each call). Every path is relative to the root and resolved by `confine`
(no `..`, no absolute path, no symlink anywhere, regular files and directories only). The
filesystem work of a call runs in a worker thread, told to stop when the call is cancelled;
grep_search's search runs in a child process killed at the time limit (`search`).
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from vllm_use.tools import confine
from vllm_use.tools.base import Result, Tool, ToolError, function
from vllm_use.tools.grep_child import GREP_MAX_MATCHES, LINE_MAX_CHARS
from vllm_use.tools.search import grep_search

FILE_TOOLS: frozenset[str] = frozenset(
    {"list_files", "file_glob_search", "read_file", "grep_search", "write_file", "edit_file"}
)
WRITE_TOOLS = frozenset({"write_file", "edit_file"})
LIST_MAX_ENTRIES = 1000  # list_files, then a "more" line
GLOB_MAX_MATCHES = 1000  # file_glob_search, then a "more" line
DEFAULT_TIMEOUT_S = 60.0

_JSON_TYPES = {str: "string", int: "integer", bool: "boolean"}


@dataclass(frozen=True)
class _Param:
    """One parameter, declared once: its JSON Schema and the check of what a call sends."""

    kind: type
    description: str
    required: bool = False
    default: Any = None

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": _JSON_TYPES[self.kind], "description": self.description}
        if self.kind is int:
            schema["minimum"] = 1
        return schema


@dataclass(frozen=True)
class _Spec:
    """One tool as the model sees it: its name in the console, what it does, its parameters."""

    display_name: str
    description: str
    params: dict[str, _Param]


_PATH = "Path relative to the tools root, '/'-separated; no '..', no absolute path, no symbolic links."
_SPECS = {
    "list_files": _Spec(
        "List files",
        "List a directory of the tools root: one entry per line, directories ending with '/', files "
        f"with their size; sorted; at most {LIST_MAX_ENTRIES} entries. Symbolic links are not listed.",
        {
            "path": _Param(str, "Directory to list, relative to the tools root (default '.').", default="."),
            "recursive": _Param(bool, "Also list everything below, depth first.", default=False),
        },
    ),
    "file_glob_search": _Spec(
        "Find files",
        "Find files and directories whose path matches a glob pattern ('*' and '?' within one name, "
        f"'**' for any number of directories, e.g. '**/*.py'); at most {GLOB_MAX_MATCHES} paths.",
        {
            "pattern": _Param(str, "Glob pattern relative to `path`, e.g. 'src/**/*.py'.", required=True),
            "path": _Param(
                str, "Directory to search from, relative to the tools root (default '.').", default="."
            ),
        },
    ),
    "read_file": _Spec(
        "Read file",
        "Read a UTF-8 text file of at most 1 MiB, whole or a range of lines (1-based, inclusive).",
        {
            "path": _Param(str, "File to read. " + _PATH, required=True),
            "start_line": _Param(int, "First line to return (1-based); default the first."),
            "end_line": _Param(int, "Last line to return (inclusive); default the last."),
        },
    ),
    "grep_search": _Spec(
        "Search in files",
        "Search text files for a fixed string (or a Python regular expression with regex=true); "
        f"answers 'path:line: text' lines, at most {GREP_MAX_MATCHES}, each cut at {LINE_MAX_CHARS} "
        "characters. Files over 1 MiB and binary files are skipped.",
        {
            "pattern": _Param(
                str, "Text to look for (a regular expression when regex is true).", required=True
            ),
            "path": _Param(
                str, "File or directory to search, relative to the tools root (default '.').", default="."
            ),
            "regex": _Param(bool, "Treat pattern as a Python regular expression.", default=False),
            "case_sensitive": _Param(bool, "Match letter case exactly.", default=True),
        },
    ),
    "write_file": _Spec(
        "Write file",
        "Create or replace a text file with the given content, atomically (mode 0644); missing "
        "parent directories are created.",
        {
            "path": _Param(str, "File to write. " + _PATH, required=True),
            "content": _Param(str, "The whole new content of the file.", required=True),
        },
    ),
    "edit_file": _Spec(
        "Edit file",
        "Replace old_string with new_string in a text file. old_string must occur exactly once, "
        "unless replace_all is true. The file is rewritten atomically.",
        {
            "path": _Param(str, "File to edit. " + _PATH, required=True),
            "old_string": _Param(str, "Exact text to replace (not empty).", required=True),
            "new_string": _Param(str, "Text to put in its place.", required=True),
            "replace_all": _Param(bool, "Replace every occurrence instead of exactly one.", default=False),
        },
    ),
}


def file_tools(root: Path, names: set[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Tool]:
    """The file tools among `names` (other names are ignored), confined to `root`, which the caller
    checked is a real directory. `timeout_s` is each call's limit (grep_search's child is killed
    at it)."""
    tools = []
    for name in sorted(FILE_TOOLS & names):
        spec = _SPECS[name]
        definition = function(
            name,
            spec.description,
            {key: param.schema() for key, param in spec.params.items()},
            [key for key, param in spec.params.items() if param.required],
        )
        tools.append(
            Tool(
                name=name,
                display_name=spec.display_name,
                type="builtin",
                write=name in WRITE_TOOLS,
                definition=definition,
                call=partial(_call, name, root, timeout_s),
                timeout_s=timeout_s,
            )
        )
    return tools


def _arguments(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` checked against the tool's declared parameters, defaults filled in (null = absent)."""
    if not isinstance(params, dict):
        raise ToolError("params must be a JSON object")
    declared = _SPECS[name].params
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ToolError(f"unknown parameter(s) for {name}: {', '.join(unknown)}")
    args: dict[str, Any] = {}
    for key, param in declared.items():
        value = params.get(key)
        if value is None:
            if param.required:
                raise ToolError(f"{name} needs the parameter {key!r}")
            args[key] = param.default
            continue
        # bool is an int in Python; JSON true is not a line number
        if not isinstance(value, param.kind) or (param.kind is int and isinstance(value, bool)):
            raise ToolError(f"parameter {key!r} of {name} must be a {_JSON_TYPES[param.kind]}")
        if param.kind is int and value < 1:
            raise ToolError(f"parameter {key!r} of {name} must be 1 or more")
        args[key] = value
    return args


async def _call(name: str, root: Path, timeout_s: float, params: dict[str, Any]) -> Result:
    """One call of the file tool `name`; runs on the IOLoop, its filesystem work in a thread."""
    args = _arguments(name, params)
    if name == "grep_search":
        return await grep_search(root, args, timeout_s)
    work = _WORK[name]
    stop = threading.Event()
    try:
        return await asyncio.to_thread(_in_root, root, partial(work, args, stop.is_set))
    finally:
        stop.set()  # a cancelled call's thread stops at its next entry


def _in_root(root: Path, work: Callable[[int], str]) -> str:
    """Run `work` with a descriptor of the root; runs in the worker thread."""
    root_fd = confine.open_root(root)
    try:
        return work(root_fd)
    except confine.Stopped:
        raise ToolError("the call was stopped") from None
    except OSError as exc:  # strerror only: the exception's file name could be an absolute path
        raise ToolError(f"the file operation failed: {exc.strerror or 'unknown error'}") from None
    finally:
        os.close(root_fd)


def _open_dir_arg(root_fd: int, path: str) -> tuple[int, list[str]]:
    parts = confine.split(path)
    fd, st = confine.open_path(root_fd, parts, path)
    if not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise ToolError(f"{path!r} is a file, not a directory")
    return fd, parts


def _list_files(args: dict[str, Any], stopped: Callable[[], bool], root_fd: int) -> str:
    fd, parts = _open_dir_arg(root_fd, args["path"])
    prefix = "".join(part + "/" for part in parts)
    out: list[str] = []
    too_deep = False
    try:
        depth = confine.MAX_DEPTH if args["recursive"] else 1
        for entry in confine.walk(fd, prefix, stopped, max_depth=depth):
            if len(out) == LIST_MAX_ENTRIES:
                out.append(f"… more entries not shown (a listing stops at {LIST_MAX_ENTRIES})")
                return "\n".join(out)
            out.append(entry.path if entry.is_dir else f"{entry.path} ({entry.size} bytes)")
            too_deep = too_deep or (args["recursive"] and not entry.descended)
    finally:
        os.close(fd)
    if too_deep:
        out.append(f"… directories more than {confine.MAX_DEPTH} levels down are not listed")
    return "\n".join(out) if out else f"{args['path']!r} is empty"


def _glob_matcher(pattern: str) -> tuple[Callable[[list[str]], bool], int]:
    """A test of a path's names against `pattern`, and how deep a walk needs to go for it."""
    segments: list[re.Pattern[str] | None] = []  # None stands for "**"
    for part in confine.split(pattern, what="pattern"):
        if part != "**":
            segments.append(re.compile(fnmatch.translate(part)))
        elif not segments or segments[-1] is not None:
            segments.append(None)
    if not segments:
        raise ToolError(f"pattern {pattern!r} matches nothing; try '**/*'")

    def matches(names: list[str]) -> bool:
        reached = {0}  # how many names the segments so far can have consumed
        for segment in segments:
            if segment is None:
                reached = set(range(min(reached), len(names) + 1)) if reached else set()
            else:
                reached = {at + 1 for at in reached if at < len(names) and segment.match(names[at])}
        return len(names) in reached

    depth = confine.MAX_DEPTH if None in segments else len(segments)
    return matches, depth


def _glob(args: dict[str, Any], stopped: Callable[[], bool], root_fd: int) -> str:
    matches, depth = _glob_matcher(args["pattern"])
    fd, parts = _open_dir_arg(root_fd, args["path"])
    prefix = "".join(part + "/" for part in parts)
    out: list[str] = []
    try:
        for entry in confine.walk(fd, prefix, stopped, max_depth=depth):
            if matches(entry.path[len(prefix) :].rstrip("/").split("/")):
                if len(out) == GLOB_MAX_MATCHES:
                    out.append(f"… more matches not shown (a search stops at {GLOB_MAX_MATCHES})")
                    break
                out.append(entry.path)
    finally:
        os.close(fd)
    return "\n".join(out) if out else f"no path under {args['path']!r} matches {args['pattern']!r}"


def _read_file(args: dict[str, Any], stopped: Callable[[], bool], root_fd: int) -> str:
    path, start, end = args["path"], args["start_line"], args["end_line"]
    if start is not None and end is not None and end < start:
        raise ToolError(f"end_line {end} is before start_line {start}")
    fd, st = confine.open_path(root_fd, confine.file_parts(path), path)
    try:
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory; use list_files")
        text = confine.read_text(fd, path)
    finally:
        os.close(fd)
    if start is None and end is None:
        return text
    all_lines = confine.lines(text)
    start = start or 1
    if start > len(all_lines):
        raise ToolError(f"start_line {start} is past the end of {path!r} ({len(all_lines)} lines)")
    return "".join(all_lines[start - 1 : end])


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{what} is not valid Unicode text") from None


def _write_file(args: dict[str, Any], stopped: Callable[[], bool], root_fd: int) -> str:
    path = args["path"]
    parts = confine.file_parts(path)
    data = _encode(args["content"], "content")
    parent = confine.open_dir(root_fd, parts[:-1], path, create=True)
    try:
        confine.write_atomic(parent, parts[-1], data, path)
    finally:
        os.close(parent)
    return f"wrote {len(data)} bytes to {path!r}"


def _edit_file(args: dict[str, Any], stopped: Callable[[], bool], root_fd: int) -> str:
    path, old, new = args["path"], args["old_string"], args["new_string"]
    if not old:
        raise ToolError("old_string is empty; use write_file to write a whole file")
    if old == new:
        raise ToolError("old_string and new_string are the same; nothing to change")
    parts = confine.file_parts(path)
    parent = confine.open_dir(root_fd, parts[:-1], path)
    try:
        fd, st = confine.open_entry(parent, parts[-1], path)
        try:
            if stat.S_ISDIR(st.st_mode):
                raise ToolError(f"{path!r} is a directory")
            text = confine.read_text(fd, path)
        finally:
            os.close(fd)
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_string was not found in {path!r}")
        if count > 1 and not args["replace_all"]:
            raise ToolError(
                f"old_string occurs {count} times in {path!r}; add context to make it unique, "
                "or set replace_all"
            )
        data = _encode(text.replace(old, new), "the edited text")
        if len(data) > confine.FILE_MAX_BYTES:
            raise ToolError(f"the edited {path!r} would be larger than 1 MiB; nothing was changed")
        # an edit keeps the file's permissions (an executable script stays executable)
        confine.write_atomic(parent, parts[-1], data, path, mode=stat.S_IMODE(st.st_mode) & 0o777, expect=st)
    finally:
        os.close(parent)
    replaced = "1 occurrence" if count == 1 else f"{count} occurrences"
    return f"replaced {replaced} in {path!r} (now {len(data)} bytes)"


_WORK: dict[str, Callable[[dict[str, Any], Callable[[], bool], int], str]] = {
    "list_files": _list_files,
    "file_glob_search": _glob,
    "read_file": _read_file,
    "write_file": _write_file,
    "edit_file": _edit_file,
}

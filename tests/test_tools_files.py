"""The built-in file tools, called directly (docs/tools.md, "File tools"): what each tool answers,
what it refuses (the confinement matrix, for every tool), and every bound at its edge."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_use.tools.base import Tool, ToolError
from vllm_use.tools.confine import FILE_MAX_BYTES, MAX_DEPTH
from vllm_use.tools.files import FILE_TOOLS, GLOB_MAX_MATCHES, LIST_MAX_ENTRIES, file_tools
from vllm_use.tools.grep_child import GREP_MAX_MATCHES, LINE_MAX_CHARS

SECRET = "outside-SECRET-text\n"
# Every call is bounded by this (a refused FIFO must not hang): generous, the work is small.
CALL_DEADLINE_S = 60.0


def tools_in(root: Path, timeout_s: float = 30.0) -> dict[str, Tool]:
    return {tool.name: tool for tool in file_tools(root, set(FILE_TOOLS), timeout_s=timeout_s)}


def run(tool: Tool, **params: Any) -> Any:
    return asyncio.run(asyncio.wait_for(tool.call(params), CALL_DEADLINE_S))


def refused(tool: Tool, root: Path, **params: Any) -> str:
    with pytest.raises(ToolError) as info:
        run(tool, **params)
    message = info.value.message
    assert str(root) not in message, "a refusal names the path as given, never the absolute root"
    return message


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A tools root with a few files, next to an outside directory it must never reach."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "main.py").write_text("import pkg\nprint('hello')\n")
    (root / "src" / "pkg" / "util.py").write_text("def hello():\n    return 'Hello'\n")
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    (root / "link_out_file").symlink_to(outside / "secret.txt")
    (root / "link_out_dir").symlink_to(outside)
    (root / "link_in_file").symlink_to(root / "notes.txt")
    (root / "link_in_dir").symlink_to(root / "src")
    (root / "dev_null").symlink_to("/dev/null")
    os.mkfifo(root / "fifo")
    return root


# -- confinement: every tool refuses every way out --------------------------------------------

ATTACKS = {
    "dotdot": "../outside/secret.txt",
    "dotdot_inside": "src/../../outside/secret.txt",
    "absolute": "{outside}/secret.txt",
    "symlink_to_outside_file": "link_out_file",
    "symlink_to_outside_dir_mid_path": "link_out_dir/secret.txt",
    "symlink_inside_to_inside_file": "link_in_file",
    "symlink_inside_dir_mid_path": "link_in_dir/main.py",
    "device_via_symlink": "dev_null",
    "device_absolute": "/dev/null",
    "fifo": "fifo",
    "nul": "notes.txt\0",
}
TOOL_PARAMS: dict[str, Callable[[str], dict[str, Any]]] = {
    "list_files": lambda path: {"path": path, "recursive": True},
    "file_glob_search": lambda path: {"pattern": "**/*", "path": path},
    "read_file": lambda path: {"path": path},
    "grep_search": lambda path: {"pattern": "SECRET", "path": path},
    "write_file": lambda path: {"path": path, "content": "overwritten"},
    "edit_file": lambda path: {"path": path, "old_string": "SECRET", "new_string": "x"},
}


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("name", sorted(FILE_TOOLS))
def test_every_tool_refuses_paths_that_leave_the_root_or_follow_links(
    root: Path, name: str, attack: str
) -> None:
    outside = root.parent / "outside"
    given = ATTACKS[attack].format(outside=outside)
    message = refused(tools_in(root)[name], root, **TOOL_PARAMS[name](given))
    assert repr(given.split("/")[0]) in message or repr(given) in message
    assert (outside / "secret.txt").read_text() == SECRET
    assert (root / "notes.txt").read_text() == "one\ntwo\nthree\n"
    assert (root / "link_in_file").is_symlink() and (root / "link_out_file").is_symlink()
    assert stat.S_ISFIFO(os.lstat(root / "fifo").st_mode)


def test_refusals_and_answers_leave_no_descriptor_open(root: Path) -> None:
    tools = tools_in(root)
    calls = [(name, path) for name in sorted(FILE_TOOLS - {"grep_search"}) for path in ATTACKS.values()]
    calls += [
        ("grep_search", "link_out_dir/secret.txt"),
        ("grep_search", "src"),
        ("read_file", "src/main.py"),
    ]

    async def all_calls() -> int:
        before = len(os.listdir("/proc/self/fd"))
        for name, path in calls:
            try:
                await tools[name].call(TOOL_PARAMS[name](path.format(outside=root.parent / "outside")))
            except ToolError:
                pass  # refusals are the point; the count of descriptors is what is checked
        return len(os.listdir("/proc/self/fd")) - before

    assert asyncio.run(all_calls()) == 0


@pytest.mark.parametrize("pattern", ["../outside/*", "src/../../outside/*", "/etc/*", "**/../*"])
def test_glob_refuses_a_pattern_that_leaves_the_root(root: Path, pattern: str) -> None:
    message = refused(tools_in(root)["file_glob_search"], root, pattern=pattern)
    assert repr(pattern) in message


def test_walks_skip_links_fifos_and_what_links_point_to(root: Path) -> None:
    tools = tools_in(root)
    listing = run(tools["list_files"], recursive=True).splitlines()
    assert listing == [
        "notes.txt (14 bytes)",
        "src/",
        "src/main.py (26 bytes)",
        "src/pkg/",
        "src/pkg/util.py (32 bytes)",
    ]
    assert run(tools["file_glob_search"], pattern="**/*").splitlines() == [
        "notes.txt",
        "src/",
        "src/main.py",
        "src/pkg/",
        "src/pkg/util.py",
    ]
    assert run(tools["grep_search"], pattern="SECRET").startswith("no match for 'SECRET'")
    assert run(tools["grep_search"], pattern="hello", case_sensitive=False).splitlines() == [
        "src/main.py:2: print('hello')",
        "src/pkg/util.py:1: def hello():",
        "src/pkg/util.py:2:     return 'Hello'",
    ]


def test_read_file_refuses_a_directory_and_names_it(root: Path) -> None:
    assert "'src' is a directory" in refused(tools_in(root)["read_file"], root, path="src")


def test_a_file_in_the_middle_of_a_path_is_not_a_directory(root: Path) -> None:
    tools = tools_in(root)
    assert "'notes.txt' is not a directory" in refused(tools["read_file"], root, path="notes.txt/x")
    assert "is not a directory" in refused(tools["write_file"], root, path="notes.txt/x", content="x")


def test_paths_must_name_a_file_where_a_file_is_meant(root: Path) -> None:
    tools = tools_in(root)
    for path in ["", ".", "src/", "notes.txt/"]:
        assert "does not name a file" in refused(tools["read_file"], root, path=path)
        assert "does not name a file" in refused(tools["write_file"], root, path=path, content="x")


def test_parameters_are_checked_against_the_definition(root: Path) -> None:
    tools = tools_in(root)
    assert "unknown parameter(s) for read_file: mode" in refused(
        tools["read_file"], root, path="notes.txt", mode="r"
    )
    assert "must be a integer" in refused(tools["read_file"], root, path="notes.txt", start_line=True)
    assert "must be 1 or more" in refused(tools["read_file"], root, path="notes.txt", start_line=0)
    assert "needs the parameter 'content'" in refused(tools["write_file"], root, path="a.txt")
    assert "must be a boolean" in refused(tools["list_files"], root, recursive="yes")
    assert run(tools["read_file"], path="notes.txt", start_line=None) == "one\ntwo\nthree\n"


def test_definitions_are_strict_and_only_writers_ask_permission(tmp_path: Path) -> None:
    tools = file_tools(tmp_path, {"read_file", "edit_file", "get_datetime", "exec_shell_command"})
    assert [tool.name for tool in tools] == ["edit_file", "read_file"]
    for tool in tools:
        function = tool.definition["function"]
        assert function["name"] == tool.name and tool.type == "builtin"
        assert function["parameters"]["additionalProperties"] is False
        assert tool.write is (tool.name == "edit_file")
    assert tools[0].definition["function"]["parameters"]["required"] == ["path", "old_string", "new_string"]


# -- list_files and file_glob_search ------------------------------------------------------------


def test_list_files_lists_one_directory_sorted_with_sizes(root: Path) -> None:
    assert run(tools_in(root)["list_files"], path="src") == "src/main.py (26 bytes)\nsrc/pkg/"
    (root / "empty").mkdir()
    assert run(tools_in(root)["list_files"], path="empty") == "'empty' is empty"
    assert "is a file, not a directory" in refused(tools_in(root)["list_files"], root, path="notes.txt")


@pytest.fixture(scope="module", params=[LIST_MAX_ENTRIES, LIST_MAX_ENTRIES + 1])
def crowded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A root whose d/ holds 1000 (then 1001) .txt files, and one file of another kind."""
    root = tmp_path_factory.mktemp("crowded")
    (root / "d").mkdir()
    for n in range(request.param):
        os.close(os.open(root / "d" / f"f{n:04}.txt", os.O_WRONLY | os.O_CREAT, 0o644))
    (root / "other.md").write_bytes(b"")
    return root, request.param


def test_list_files_stops_at_1000_entries(crowded: tuple[Path, int]) -> None:
    root, count = crowded
    lines = run(tools_in(root)["list_files"], path="d").splitlines()
    assert lines[:2] == ["d/f0000.txt (0 bytes)", "d/f0001.txt (0 bytes)"]
    assert LIST_MAX_ENTRIES == 1000 and len(lines) == 1000 + (count > 1000)
    assert lines[-1].startswith("… more entries") is (count > 1000)


def test_glob_stops_at_1000_matches(crowded: tuple[Path, int]) -> None:
    root, count = crowded
    lines = run(tools_in(root)["file_glob_search"], pattern="**/*.txt").splitlines()
    assert lines[0] == "d/f0000.txt"
    assert GLOB_MAX_MATCHES == 1000 and len(lines) == 1000 + (count > 1000)
    assert lines[-1].startswith("… more matches") is (count > 1000)


@pytest.mark.parametrize("levels", [MAX_DEPTH, MAX_DEPTH + 1])
def test_recursive_walks_stop_64_levels_down(tmp_path: Path, levels: int) -> None:
    deep = tmp_path.joinpath(*["d"] * (levels - 1))
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("bottom\n")
    tools = tools_in(tmp_path)
    bottom = "d/" * (levels - 1) + "bottom.txt"
    listing = run(tools["list_files"], recursive=True)
    found = run(tools["file_glob_search"], pattern="**/bottom.txt")
    grep = run(tools["grep_search"], pattern="bottom")
    if levels <= MAX_DEPTH:
        assert f"{bottom} (7 bytes)" in listing.splitlines() and "not listed" not in listing
        assert found == bottom and grep == f"{bottom}:1: bottom"
    else:
        assert "bottom.txt" not in listing
        assert listing.endswith(f"directories more than {MAX_DEPTH} levels down are not listed")
        assert found.startswith("no path") and grep.startswith("no match")


def test_a_file_name_that_is_not_utf8_is_listed_and_searched(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("needle\n")
    with open(os.fsencode(tmp_path) + b"/caf\xe9.txt", "w") as handle:  # Latin-1 bytes in the name
        handle.write("needle\n")
    tools = tools_in(tmp_path)
    name = os.fsdecode(b"caf\xe9.txt")
    assert run(tools["list_files"]) == f"b.txt (7 bytes)\n{name} (7 bytes)"
    assert run(tools["grep_search"], pattern="needle") == f"b.txt:1: needle\n{name}:1: needle"
    assert run(tools["read_file"], path=name) == "needle\n"
    assert "is not valid Unicode" in refused(tools["read_file"], tmp_path, path="\ud800.txt")


def test_glob_star_stays_in_one_name_and_double_star_crosses_directories(root: Path) -> None:
    glob = tools_in(root)["file_glob_search"]
    assert run(glob, pattern="*.py", path="src") == "src/main.py"
    assert run(glob, pattern="**/*.py") == "src/main.py\nsrc/pkg/util.py"
    assert run(glob, pattern="src/**/util.?y") == "src/pkg/util.py"
    assert run(glob, pattern="*.md") == "no path under '.' matches '*.md'"


# -- read_file ----------------------------------------------------------------------------------


def test_read_file_returns_the_text_or_a_range_of_lines(root: Path) -> None:
    read = tools_in(root)["read_file"]
    assert run(read, path="notes.txt") == "one\ntwo\nthree\n"
    assert run(read, path="./notes.txt", start_line=2) == "two\nthree\n"
    assert run(read, path="notes.txt", start_line=2, end_line=2) == "two\n"
    assert run(read, path="notes.txt", end_line=1) == "one\n"
    assert run(read, path="notes.txt", start_line=3, end_line=99) == "three\n"
    assert "past the end of 'notes.txt' (3 lines)" in refused(read, root, path="notes.txt", start_line=4)
    assert "before start_line" in refused(read, root, path="notes.txt", start_line=2, end_line=1)
    assert "'nope.txt' does not exist" in refused(read, root, path="nope.txt")


@pytest.mark.parametrize("size", [FILE_MAX_BYTES, FILE_MAX_BYTES + 1])
def test_read_file_takes_1_mib_and_refuses_one_byte_more(tmp_path: Path, size: int) -> None:
    (tmp_path / "big.txt").write_bytes(b"a" * size)
    read = tools_in(tmp_path)["read_file"]
    if size <= FILE_MAX_BYTES:
        assert len(run(read, path="big.txt")) == size
    else:
        assert "'big.txt' is larger than 1 MiB" in refused(read, tmp_path, path="big.txt")


@pytest.mark.parametrize("content", [b"abc\x00def", b"caf\xe9\n"])
def test_read_file_refuses_what_is_not_text(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "data.bin").write_bytes(content)
    assert "is not a text file" in refused(tools_in(tmp_path)["read_file"], tmp_path, path="data.bin")


# -- grep_search --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [GREP_MAX_MATCHES, GREP_MAX_MATCHES + 1])
def test_grep_stops_at_200_matches(tmp_path: Path, count: int) -> None:
    (tmp_path / "log.txt").write_text("".join(f"hit {n}\n" for n in range(count)))
    lines = run(tools_in(tmp_path)["grep_search"], pattern="hit").splitlines()
    assert lines[0] == "log.txt:1: hit 0" and lines[GREP_MAX_MATCHES - 1] == "log.txt:200: hit 199"
    assert len(lines) == GREP_MAX_MATCHES + (count > GREP_MAX_MATCHES)
    assert lines[-1].startswith("… more than 200 matches") is (count > GREP_MAX_MATCHES)


def test_grep_cuts_lines_at_500_characters(tmp_path: Path) -> None:
    fits = "x" * (LINE_MAX_CHARS - 1) + "!"
    (tmp_path / "a.txt").write_text(f"{fits}\n{fits}y\n")
    lines = run(tools_in(tmp_path)["grep_search"], pattern="!").splitlines()
    assert lines == [f"a.txt:1: {fits}", f"a.txt:2: {fits}…"]


def test_grep_skips_files_over_1_mib_and_binary_files(tmp_path: Path) -> None:
    line = b"needle\n"
    (tmp_path / "a_fits.txt").write_bytes(line + b"a" * (FILE_MAX_BYTES - len(line)))
    (tmp_path / "b_big.txt").write_bytes(line + b"a" * (FILE_MAX_BYTES - len(line) + 1))
    (tmp_path / "c_binary.bin").write_bytes(line + b"\x00")
    grep = tools_in(tmp_path)["grep_search"]
    assert run(grep, pattern="needle").splitlines() == [
        "a_fits.txt:1: needle",
        "(2 files skipped: larger than 1 MiB or not text)",
    ]
    assert "'b_big.txt' is larger than 1 MiB" in refused(grep, tmp_path, pattern="needle", path="b_big.txt")


def test_grep_fixed_strings_are_literal_and_regex_is_python(root: Path) -> None:
    grep = tools_in(root)["grep_search"]
    assert run(grep, pattern="print(", path="src/main.py") == "src/main.py:2: print('hello')"
    assert run(grep, pattern=r"^def \w+\(\):$", regex=True) == "src/pkg/util.py:1: def hello():"
    assert run(grep, pattern="HELLO", path="src/pkg").startswith("no match for 'HELLO' under 'src/pkg'")
    assert "invalid regular expression" in refused(grep, root, pattern="print(", regex=True)


def test_a_catastrophic_regex_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a" * 64 + "b\n")
    grep = tools_in(tmp_path, timeout_s=1.0)["grep_search"]
    message = refused(grep, tmp_path, pattern="(a+)+$", regex=True)
    assert "longer than the time limit (1 s)" in message


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if fields[1] == me:
                found.add(int(entry.name))
    return found


def test_a_running_search_blocks_nothing_and_cancelling_it_kills_its_child(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a" * 64 + "b\n")
    tools = tools_in(tmp_path, timeout_s=600.0)
    grep = tools["grep_search"]
    before = _children()

    async def cancel_mid_search() -> set[int]:
        task = asyncio.ensure_future(grep.call({"pattern": "(a+)+$", "regex": True}))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_DEADLINE_S
        while not (_children() - before) and loop.time() < deadline:
            await asyncio.sleep(0.01)  # polling for the child, bounded by the deadline
        started = _children() - before
        assert await asyncio.wait_for(tools["read_file"].call({"path": "a.txt"}), CALL_DEADLINE_S)
        assert not task.done(), "the search was still running while read_file answered"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return started

    started = asyncio.run(cancel_mid_search())
    assert started, "the search ran in a child process"
    assert not (started & _children()), "the child is gone once the call is cancelled"


# -- write_file and edit_file -------------------------------------------------------------------


def test_write_file_creates_parents_and_leaves_no_temp_file(root: Path) -> None:
    write = tools_in(root)["write_file"]
    assert run(write, path="new/sub/out.txt", content="héllo\n") == "wrote 7 bytes to 'new/sub/out.txt'"
    assert (root / "new" / "sub" / "out.txt").read_text() == "héllo\n"
    assert stat.S_IMODE(os.stat(root / "new" / "sub" / "out.txt").st_mode) == 0o644
    assert os.listdir(root / "new" / "sub") == ["out.txt"]
    (root / "notes.txt").chmod(0o600)
    run(write, path="notes.txt", content="replaced")
    assert (root / "notes.txt").read_text() == "replaced"
    assert stat.S_IMODE(os.stat(root / "notes.txt").st_mode) == 0o644
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []


def test_writes_through_a_hard_link_leave_the_outside_file_alone(root: Path) -> None:
    outside = root.parent / "outside" / "secret.txt"
    os.link(outside, root / "hard.txt")
    tools = tools_in(root)
    assert run(tools["read_file"], path="hard.txt") == SECRET  # a hard link is a regular file
    run(tools["edit_file"], path="hard.txt", old_string="SECRET", new_string="edited")
    run(tools["write_file"], path="hard.txt", content="written")
    assert (root / "hard.txt").read_text() == "written"
    assert outside.read_text() == SECRET


def test_write_file_refuses_to_replace_a_directory(root: Path) -> None:
    message = refused(tools_in(root)["write_file"], root, path="src/pkg", content="x")
    assert "'src/pkg' exists and is not a regular file" in message
    assert (root / "src" / "pkg" / "util.py").exists()
    assert sorted(os.listdir(root / "src")) == ["main.py", "pkg"]


def test_edit_file_replaces_one_occurrence_or_all_of_them(root: Path) -> None:
    edit = tools_in(root)["edit_file"]
    (root / "run.sh").write_text("echo a\necho a\necho b\n")
    (root / "run.sh").chmod(0o755)
    message = refused(edit, root, path="run.sh", old_string="echo a", new_string="echo c")
    assert "old_string occurs 2 times in 'run.sh'" in message
    assert "old_string was not found in 'run.sh'" in refused(
        edit, root, path="run.sh", old_string="echo z", new_string="x"
    )
    assert "in 'run.sh' (now" in run(edit, path="run.sh", old_string="echo b", new_string="echo d")
    assert run(edit, path="run.sh", old_string="echo a", new_string="echo c", replace_all=True) == (
        "replaced 2 occurrences in 'run.sh' (now 21 bytes)"
    )
    assert (root / "run.sh").read_text() == "echo c\necho c\necho d\n"
    assert stat.S_IMODE(os.stat(root / "run.sh").st_mode) == 0o755, "an edit keeps the file's mode"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    assert "old_string is empty" in refused(edit, root, path="run.sh", old_string="", new_string="x")


@pytest.mark.parametrize("grow", [0, 1])
def test_edit_file_keeps_files_within_1_mib(tmp_path: Path, grow: int) -> None:
    (tmp_path / "a.txt").write_bytes(b"a" * (FILE_MAX_BYTES - 10) + b"0123456789")
    edit = tools_in(tmp_path)["edit_file"]
    replacement = "9876543210" + "x" * grow
    if grow == 0:
        run(edit, path="a.txt", old_string="0123456789", new_string=replacement)
        assert (tmp_path / "a.txt").stat().st_size == FILE_MAX_BYTES
    else:
        message = refused(edit, tmp_path, path="a.txt", old_string="0123456789", new_string=replacement)
        assert "would be larger than 1 MiB; nothing was changed" in message
        assert (tmp_path / "a.txt").read_bytes().endswith(b"0123456789")

"""`LogBuffer` and `cut_utf8` (docs/security.md, "Children"): lines ≤ 64 KiB cut on a UTF-8 boundary,
≤ 4 MiB in all, oldest lines dropped first, a child's output fed in raw chunks as it comes off the pipe."""

from __future__ import annotations

import tracemalloc

import pytest

from vllm_use.logbuffer import COST_MAX, LINE_MAX, LINE_OVERHEAD, TOTAL_MAX, LogBuffer, cut_utf8

KiB = 1024
MiB = 1024 * KiB
WIDE = ["\u00e9", "\u20ac", "\U0001f600"]  # 2, 3 and 4 bytes in UTF-8


def fed(*chunks: bytes, close: bool = True, **limits: int) -> LogBuffer:
    buffer = LogBuffer(**limits)
    for chunk in chunks:
        buffer.feed(chunk)
    if close:
        buffer.close()
    return buffer


# --- cut_utf8 -------------------------------------------------------------------------------------------


def test_cut_leaves_short_data_alone() -> None:
    assert cut_utf8(b"abc", 3) == b"abc"
    assert cut_utf8("\u20ac".encode(), 3) == "\u20ac".encode()
    assert cut_utf8(b"", 0) == b""


@pytest.mark.parametrize("char", WIDE)
def test_cut_steps_back_over_a_straddling_character(char: str) -> None:
    encoded = char.encode()
    for inside in range(1, len(encoded)):  # the limit falls after `inside` bytes of the character
        data = b"a" * 10 + encoded + b"tail"

        cut = cut_utf8(data, 10 + inside)

        assert cut == b"a" * 10, (char, inside)


@pytest.mark.parametrize("char", WIDE)
def test_cut_keeps_a_character_that_ends_at_the_limit(char: str) -> None:
    data = b"a" * 10 + char.encode() + b"tail"

    assert cut_utf8(data, 10 + len(char.encode())).decode() == "a" * 10 + char


def test_cut_of_invalid_utf8_keeps_the_line() -> None:
    # No character is longer than 4 bytes, so a valid cut never steps back more than 3.
    data = b"\x80" * 100

    assert len(cut_utf8(data, 50)) >= 47


# --- one line -------------------------------------------------------------------------------------------


def test_line_of_exactly_the_limit_is_kept_whole() -> None:
    assert fed(b"a" * LINE_MAX + b"\n").lines() == ["a" * LINE_MAX]


def test_line_one_byte_over_the_limit_is_cut_to_the_limit() -> None:
    assert fed(b"a" * LINE_MAX + b"b\n").lines() == ["a" * LINE_MAX]


@pytest.mark.parametrize("char", WIDE)
def test_line_cut_never_splits_a_multibyte_character(char: str) -> None:
    encoded = char.encode()
    for inside in range(1, len(encoded)):
        prefix = b"a" * (LINE_MAX - inside)

        [line] = fed(prefix + encoded + b"more\n").lines()

        assert line.encode() == prefix, (char, inside)


@pytest.mark.parametrize("char", WIDE)
def test_line_cut_on_a_character_split_across_chunks(char: str) -> None:
    encoded = char.encode()
    prefix = b"a" * (LINE_MAX - 1)

    buffer = fed(prefix + encoded[:1], encoded[1:] + b"more\n", b"next\n")

    assert buffer.lines() == ["a" * (LINE_MAX - 1), "next"]


def test_multibyte_character_ending_at_the_limit_is_kept() -> None:
    prefix = "a" * (LINE_MAX - 4)

    assert fed((prefix + "\U0001f600" + "more\n").encode()).lines() == [prefix + "\U0001f600"]


def test_huge_single_line_in_chunks_holds_about_one_line() -> None:
    chunk = b"x" * (4 * KiB)
    buffer = LogBuffer()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(10 * MiB // len(chunk)):  # 10 MiB without a newline
            buffer.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    buffer.feed(b"\nnext line\n")

    assert peak - base < LINE_MAX + 32 * KiB, peak - base
    assert buffer.lines() == ["x" * LINE_MAX, "next line"]
    assert buffer.size == LINE_MAX + 1 + len("next line") + 1


# --- line endings and reading back ----------------------------------------------------------------------


def test_partial_last_line_is_kept_on_close() -> None:
    buffer = fed(b"one\ntw", b"o", close=False)
    assert buffer.lines() == ["one"]

    buffer.close()
    buffer.close()

    assert buffer.lines() == ["one", "two"]


def test_close_without_a_partial_line_adds_nothing() -> None:
    assert fed(b"one\n").lines() == ["one"]


def test_crlf_endings_are_removed() -> None:
    assert fed(b"a\r\nb\r\n").lines() == ["a", "b"]
    assert fed(b"a\r", b"\nb\r", b"\n").lines() == ["a", "b"]  # \r and \n in different chunks
    assert fed(b"last\r").lines() == ["last"]


def test_empty_lines_are_kept() -> None:
    assert fed(b"a\n\nb\n").lines() == ["a", "", "b"]


def test_invalid_utf8_reads_back_with_replacement_characters() -> None:
    assert fed(b"bad \xff byte\n").lines() == ["bad \ufffd byte"]


def test_terminal_colour_codes_are_removed() -> None:
    assert fed(b"\x1b[1m\x1b[31mError: boom\x1b[0m\n").lines() == ["Error: boom"]


def test_tail_returns_the_newest_lines() -> None:
    buffer = fed(b"1\n2\n3\n")

    assert buffer.lines(2) == ["2", "3"]
    assert buffer.lines() == ["1", "2", "3"]


# --- the total cap --------------------------------------------------------------------------------------


def test_total_cap_drops_the_oldest_lines_first() -> None:
    buffer = fed(b"aaaa\nbbbb\ncccc\ndddd\n", total_max=15)  # each line costs 5 bytes (with its \n)

    assert buffer.lines() == ["bbbb", "cccc", "dddd"]
    assert buffer.size == 15
    assert buffer.dropped_lines == 1


def test_total_of_exactly_the_cap_drops_nothing_and_one_byte_more_drops_the_oldest() -> None:
    line_bytes = TOTAL_MAX // 64 - 1  # 64 lines of 65535 bytes + 64 newlines = exactly 4 MiB
    lines = [f"{i:05d}".encode() + b"x" * (line_bytes - 5) for i in range(64)]
    buffer = fed(b"".join(line + b"\n" for line in lines))
    assert buffer.size == TOTAL_MAX
    assert buffer.dropped_lines == 0
    assert buffer.lines()[0].startswith("00000")

    buffer.feed(b"z\n")

    kept = buffer.lines()
    assert buffer.dropped_lines == 1
    assert kept[0].startswith("00001") and kept[-1] == "z"
    assert len(kept) == 64
    assert buffer.size == sum(len(line.encode()) + 1 for line in kept) <= TOTAL_MAX


def test_many_small_lines_stay_under_the_cap_keeping_the_newest() -> None:
    buffer = LogBuffer()
    for i in range(10 * MiB // 1024):
        buffer.feed(f"{i:07d} ".encode() + b"y" * 1015 + b"\n")  # 1 KiB per line

    kept = buffer.lines()
    assert buffer.size <= TOTAL_MAX
    assert sum(len(line.encode()) + 1 for line in kept) == buffer.size
    assert kept[-1].startswith(f"{10 * MiB // 1024 - 1:07d} ")
    numbers = [int(line[:7]) for line in kept]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def test_millions_of_empty_lines_stay_within_the_memory_budget() -> None:
    buffer = LogBuffer()
    chunk = b"\n" * 1_000_000
    for _ in range(3):
        buffer.feed(chunk)
    # Text bytes alone (one per line) would keep all 3 million lines; their real cost evicts them.
    assert buffer.cost <= COST_MAX
    assert len(buffer.lines()) == COST_MAX // (1 + LINE_OVERHEAD)
    assert buffer.dropped_lines == 3_000_000 - len(buffer.lines())


def test_the_cost_of_a_line_counts_its_bytes_and_its_bookkeeping() -> None:
    buffer = fed(b"abc\n\n")
    assert buffer.size == 4 + 1
    assert buffer.cost == 4 + 1 + 2 * LINE_OVERHEAD

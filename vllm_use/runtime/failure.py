"""Why a `vllm serve` failed to start, in one line, from its last log lines (docs/runtime.md,
"Failed starts").

A failed start used to say only "vllm exited with status 1" while the reason sat in a log box the
operator had to find and scroll. vLLM says the reason in one of two ways, both read here from the
end of its output (docs/vllm-facts.md):

- the reaper's `[vllm-use] cannot start vllm: No such file or directory` (exit 127): no vLLM there;
- an argparse error (exit status 2): `vllm serve: error: argument --dtype: invalid choice: …`;
- an exception ending a traceback, raw on stderr or in a logger's lines
  (`(EngineCore_DP0 pid=7) ERROR 12-02 06:00:00 [core.py:708] ValueError: …`):
  `TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser` (vLLM's checks of its
  serve arguments), `pydantic_core._pydantic_core.ValidationError: 1 validation error for
  CacheConfig` followed by the field and pydantic's message, `RuntimeError: Engine core
  initialization failed. See root cause above.` (the root cause is the exception before it).

`explain` returns the reason and whether it is the *options'* fault: vLLM refused what it was
given (an argparse error, or a TypeError/ValueError/ValidationError of its argument and config
checks) as opposed to a failure of the machine or the engine (memory, a crash, a signal). The
first is the operator's mistake, in the options or the model's files (the API answers 422
`start_refused`); the second stays a child's failure (502 `runtime_failed`). Pure functions: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A logger's prefix before the message: "(APIServer pid=12) ERROR 12-02 06:00:00 [file.py:10] ".
_PREFIX = re.compile(
    r"^(?:\([\w.:-]+ pid=\d+\) )?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?"
)
_ARGPARSE = re.compile(r"^[\w .-]*: error: (?P<message>.+)$")
# The reaper's own line when the command itself cannot be run (reaper.py, exit 127).
_NOT_STARTED = re.compile(r"^\[vllm-use\] (?P<message>cannot start .+)$")
# "TypeError: …", "pydantic_core._pydantic_core.ValidationError: …", "KeyboardInterrupt".
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<message>.*))?$"
)
# An exception that only points at another one printed before it.
_POINTER = re.compile(r"see (?:the )?(?:root cause|stack trace)", re.IGNORECASE)
# vLLM's last lines when a start failed for memory: the machine, not the options
# (deployments/instances.py makes room and retries on the same words).
OUT_OF_MEMORY = re.compile(
    r"out of memory|OutOfMemoryError|Free memory on device|No available memory for the cache", re.IGNORECASE
)
# The exceptions of vLLM's checks of its arguments and configuration (and argparse's own).
_REFUSALS = frozenset({"TypeError", "ValueError", "ValidationError", "ArgumentTypeError", "ArgumentError"})
REASON_MAX = 500


@dataclass(frozen=True)
class Explanation:
    reason: str | None  # vLLM's own words, one line, at most REASON_MAX characters
    refused: bool  # vLLM refused its options or model files (the operator's mistake), not the machine


def _message(line: str) -> str:
    return _PREFIX.sub("", line.rstrip())


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"


def _validation(lines: list[str], at: int, head: str) -> str:
    """pydantic's "1 validation error for CacheConfig", then the field and its message (or "Value
    error, …" of a check), then "For further information visit …", which is left out."""
    detail = []
    for line in lines[at + 1 : at + 3]:
        text = _message(line).strip()
        if not text or text.startswith("For further information"):
            break
        detail.append(re.sub(r"^Value error, ", "", re.sub(r"\s*\[type=.*$", "", text)))
    return ": ".join([head, *detail]) if detail else head


def explain(lines: list[str], exit_code: int | None) -> Explanation:
    """The reason of a failed start from vLLM's last `lines` (oldest first) and its exit status."""
    messages = [_message(line) for line in lines]
    for text in reversed(messages):
        found = _NOT_STARTED.match(text)
        if found:  # vLLM is not installed there: the machine's setup, not the options
            return Explanation(_short(f"{found['message']} (is vLLM installed? --vllm-bin names it)"), False)
    for text in reversed(messages):
        found = _ARGPARSE.match(text)
        if found:
            return Explanation(_short(found["message"]), refused=exit_code == 2)
    exceptions = [(i, m) for i, m in enumerate(messages) if _EXCEPTION.match(m)]
    if not exceptions:
        return Explanation(None, refused=False)
    at, text = exceptions[-1]
    found = _EXCEPTION.match(text)
    assert found is not None
    if _POINTER.search(found["message"] or "") and len(exceptions) > 1:
        at, text = exceptions[-2]  # the root cause, printed before the exception that points at it
        found = _EXCEPTION.match(text)
        assert found is not None
    kind, message = found["type"], (found["message"] or "").strip()
    message = re.sub(r"^Error: ", "", message)  # vLLM's "TypeError: Error: --x requires --y"
    if kind == "ValidationError":
        message = _validation(messages, at, message)
    reason = _short(message or kind)
    memory = bool(OUT_OF_MEMORY.search("\n".join(messages)))
    return Explanation(reason, refused=kind in _REFUSALS and not memory and exit_code not in (None, 0))

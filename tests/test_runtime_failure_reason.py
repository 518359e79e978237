"""The reason of a failed start, read from vLLM's own last lines (vllm_use/runtime/failure.py,
docs/runtime.md "Failed starts"): its argparse error, else the exception that ended its traceback
(the root cause when the last one only points at it), and whether vLLM refused what it was given
(the operator's mistake, 422) or failed otherwise (502). The lines are vLLM 0.32's, as
docs/vllm-facts.md records them.
"""

from __future__ import annotations

from vllm_use.runtime.failure import explain


def test_the_reason_is_vllms_argparse_error_or_its_root_exception() -> None:
    argparse = [
        "usage: vllm serve [model_tag] [options]",
        "vllm serve: error: argument --dtype: invalid choice: 'x' (choose from auto, half)",
    ]
    assert explain(argparse, 2).reason == "argument --dtype: invalid choice: 'x' (choose from auto, half)"
    assert explain(argparse, 2).refused

    tools = [
        "Traceback (most recent call last):",
        '  File "/opt/vllm/bin/vllm", line 10, in <module>',
        "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser",
    ]
    assert explain(tools, 1).reason == "--enable-auto-tool-choice requires --tool-call-parser"
    assert explain(tools, 1).refused

    cache = [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
        "gpu_memory_utilization",
        "  Input should be less than or equal to 1 [type=less_than_equal, input_value=5.0]",
    ]
    assert explain(cache, 1).reason == (
        "1 validation error for CacheConfig: gpu_memory_utilization: Input should be less than or equal to 1"
    )

    # The engine's root cause, logged by its process, before the exception that points at it; memory
    # is the machine's, not the options'.
    engine = [
        "(EngineCore_DP0 pid=7) ERROR 12-02 06:00:00 [core.py:708] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=7) ERROR 12-02 06:00:00 [core.py:708] ValueError: No available memory for "
        "the cache blocks. Try increasing `gpu_memory_utilization`.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    why = explain(engine, 1)
    assert why.reason == "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
    assert not why.refused
    assert explain(["INFO: loading", "Killed"], 137) == explain([], 137)  # nothing to say: no reason


def test_a_missing_vllm_says_so_and_is_not_the_options_fault() -> None:
    why = explain(["[vllm-use] cannot start /opt/none/vllm: No such file or directory"], 127)
    assert (
        why.reason
        == "cannot start /opt/none/vllm: No such file or directory (is vLLM installed? --vllm-bin names it)"
    )
    assert not why.refused

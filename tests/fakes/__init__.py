"""Small, faithful fakes of what the machine lacks, each compared with the real thing:

- `vllm.py`: the fake `vllm` executable (run it by its path, `FAKE_VLLM`; `fake_vllm_bin` bakes
  its FAKE_VLLM_* knobs into a wrapper script), for the runtime supervisor's tests;
- `upstream.py`: an in-process vLLM HTTP server that records what it received, for the gateway's;
- `shapes.py`: what vLLM 0.32 answers, the one home of the shapes both fakes of it serve;
- `hub.py`: the Hugging Face Hub, for the real `hf download` CLI;
- `nvml/pynvml.py`: NVIDIA's NVML (`FAKE_NVML`: put that directory first on a server's PYTHONPATH),
  its GPUs read from `$FAKE_NVML_DIR` (tests/support/gpus.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE_VLLM = Path(__file__).resolve().parent / "vllm.py"
FAKE_NVML = Path(__file__).resolve().parent / "nvml"


def _export(knob: str, value: object) -> str:
    return f"export FAKE_VLLM_{knob.upper()}={shlex.quote(str(value))}"


def fake_vllm_bin(
    directory: Path, *, by_name: dict[str, dict[str, object]] | None = None, **knobs: object
) -> Path:
    """A `vllm` for `--vllm-bin`: the fake with `FAKE_VLLM_<KNOB>=value` set, e.g. `load_seconds=2`.
    vllm-use passes its children an allow-listed environment, so knobs put in the server's
    environment never reach the fake: the wrapper sets them. `by_name` adds knobs for one served
    model name (a deployment's name, `--served-model-name=<name>`): `{"slow": {"load_seconds": 3}}`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vllm"
    exports = "".join(_export(k, v) + "\n" for k, v in knobs.items())
    if by_name:
        cases = "".join(
            f"  *{shlex.quote(f' --served-model-name={name} ')}*) "
            + "; ".join(_export(k, v) for k, v in extra.items())
            + " ;;\n"
            for name, extra in by_name.items()
        )
        exports += f'case " $* " in\n{cases}esac\n'
    path.write_text(
        f'#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_VLLM))} "$@"\n'
    )
    path.chmod(0o755)
    return path

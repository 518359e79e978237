"""Capacity and sleep on a GPU machine (docs/router.md, "Capacity" and "Sleep"): the memory budget,
NVML's free memory, a start that fails for memory, and vLLM's sleep mode with its memory check.

This machine has no NVIDIA driver, so the server under test imports the fake NVML
(tests/fakes/nvml/pynvml.py, first on its PYTHONPATH) and its deployments run the fake vLLM, which
records in the same directory the GPU memory it holds: awake, asleep, or not given back.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import FAKE_NVML, fake_vllm_bin
from tests.support.deployments import (
    START_TIMEOUT_S,
    add_deployment,
    alive,
    chat,
    instance,
    load,
    states,
)
from tests.support.gpus import GIB, TOTAL, gpu_server, gpus_file, held
from tests.support.prometheus import read_metrics, value
from tests.support.server import eventually, free_port, start_server
from vllm_use.deployments.instances import (
    SLEEP_CHECK_DEFAULT_S,
    SLEEP_CHECK_ENV,
    SLEEP_CHECK_S,
    WAKE_TIMEOUT_S,
    sleep_check_s,
)
from vllm_use.runtime.supervisor import REAP_CAP_S, TERM_GRACE_S

# The sleep check's interval for the tests that wait it out (a sleep that keeps its memory): long
# enough for the fake's /sleep and a few NVML reads, far below the real 30 s.
SHORT_CHECK_S = 2


def test_the_memory_budget_holds_at_its_edge_and_nvml_must_show_the_memory_free(tmp_path: Path) -> None:
    server = gpu_server(tmp_path, "--max-loaded", "8")
    try:
        assert server.fetch("/api/gpus").json()["status"] == "available"
        add_deployment(server, "a", 0.45, pinned=True)
        add_deployment(server, "b", 0.5, pinned=True)
        add_deployment(server, "c", 0.05)
        add_deployment(server, "big", 0.96)
        # 0.45 + 0.5 = the budget (0.95): both load.
        assert load(server, "a").json()["state"] == "ready"
        assert load(server, "b").json()["state"] == "ready"
        # One more share would pass it, and a and b are pinned: refused, naming the GPU and the budget.
        r = load(server, "c")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        assert "GPU 0" in r.text and "--gpu-memory-budget 0.95" in r.text, r.text
        assert "retry-after" in r.headers
        # A share above the budget never fits: a 409 at once, whatever is loaded.
        r = load(server, "big")
        assert r.status_code == 409 and "--gpu-memory-budget" in r.text, r.text
        # Unpinned, b is the least recently used idle one on that GPU: it is stopped for c.
        b_pid = instance(server, "b")["pid"]
        assert server.fetch("/api/deployments/b", "PATCH", json={"pinned": False}).status_code == 200
        assert load(server, "c").json()["state"] == "ready"
        assert states(server)["b"] == "unloaded" and not alive(b_pid)
    finally:
        server.stop()


def test_a_request_waits_until_nvml_shows_the_memory_free(tmp_path: Path) -> None:
    """Something outside vllm-use holds 40 GiB: a deployment wanting 0.9 (72 GiB) fits the budget
    but not the GPU. A /v1 request waits; when the memory is freed, it loads and is answered."""
    server = gpu_server(tmp_path, external=40 * GIB)
    try:
        add_deployment(server, "a", 0.9)
        r = server.fetch("/api/deployments/a/load", "POST")
        assert r.status_code == 503 and "NVML shows 40.0 GiB free" in r.text, r.text
        secret = server.create_key("inference")[1]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(chat, server, secret, "a")
            eventually(lambda: instance(server, "a")["waiting"] == 1, timeout=START_TIMEOUT_S)
            assert states(server)["a"] == "unloaded" and not waiting.done()
            gpus_file(tmp_path / "nvml", external=0)  # the other program ended
            answer = waiting.result(timeout=START_TIMEOUT_S)
        assert answer.status_code == 200, answer.text
        assert held(server, instance(server, "a")["pid"]) == int(0.9 * TOTAL)
    finally:
        server.stop()


def test_a_start_that_fails_for_memory_evicts_one_more_and_is_tried_once_again(tmp_path: Path) -> None:
    """The fake's start fails with CUDA out of memory beside any other holder (a model whose peak
    passes its share): the request's load stops the idle instance and starts again, once."""
    server = gpu_server(tmp_path, "--max-loaded", "4", oom_beside_others=1)
    try:
        add_deployment(server, "first", 0.3)
        add_deployment(server, "second", 0.3)
        assert load(server, "first").json()["state"] == "ready"  # alone on the GPU: it starts
        secret = server.create_key("inference")[1]
        answer = chat(server, secret, "second")
        assert answer.status_code == 200, answer.text
        assert states(server) == {"first": "unloaded", "second": "ready"}
        assert "failed for GPU memory" in server.log()
        # Out of memory with nothing left to evict: the failure is the client's 502, once.
        server.fetch("/api/deployments/first", "PATCH", json={"pinned": True})
        assert server.fetch("/api/deployments/second/unload", "POST").status_code == 200
        assert load(server, "first").json()["state"] == "ready"
        add_deployment(server, "third", 0.3)
        r = chat(server, secret, "third")
        assert r.status_code == 502 and "failed to load" in r.text, r.text
        assert "out of memory" in " ".join(instance(server, "third")["last_lines"])
    finally:
        server.stop()


# --- sleep -------------------------------------------------------------------------------------------


def test_an_idle_instance_sleeps_gives_its_memory_back_and_a_request_wakes_it(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    server = gpu_server(tmp_path, record=str(records / "start-{pid}.json"))
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep", idle_timeout_s=1)
        add_deployment(server, "awake", 0.4)
        secret = server.create_key("inference")[1]
        assert chat(server, secret, "nap").status_code == 200
        pid = instance(server, "nap")["pid"]
        awake = held(server, pid)
        assert awake == int(0.5 * TOTAL)
        # vLLM was started in sleep mode, with the dev routes in its own environment only.
        (record,) = [json.loads(p.read_text()) for p in records.glob("start-*.json")]
        assert "--enable-sleep-mode" in record["argv"] and record["env"]["VLLM_SERVER_DEV_MODE"] == "1"
        assert instance(server, "nap")["sleep_supported"] is True

        eventually(lambda: states(server)["nap"] == "sleeping", timeout=1 + SLEEP_CHECK_S)
        eventually(lambda: held(server, pid) < 0.1 * awake, timeout=SLEEP_CHECK_S)
        assert alive(pid)  # asleep, not stopped
        listed = server.fetch("/v1/models", token=None, headers={"Authorization": f"Bearer {secret}"}).json()
        assert {m["id"]: m.get("status") for m in listed["data"]}["nap"] == {"value": "sleeping"}
        assert states(server)["nap"] == "sleeping"  # reading does not wake it
        # A request wakes it (the same process) and is answered.
        assert chat(server, secret, "nap").status_code == 200
        assert instance(server, "nap")["pid"] == pid and held(server, pid) == awake
        # The dev routes are never reachable through the gateway.
        for path in (
            "/v1/sleep",
            "/v1/wake_up",
            "/v1/is_sleeping",
            "/v1/load_lora_adapter",
            "/v1/collective_rpc",
        ):
            r = server.fetch(path, "POST", token=None, headers={"Authorization": f"Bearer {secret}"})
            assert r.status_code == 404, (path, r.status_code)
        # A deployment whose idle_action is stop runs without sleep mode and cannot be put to sleep.
        assert load(server, "awake").json()["state"] == "ready"
        r = server.fetch("/api/deployments/awake/sleep", "POST")
        assert r.status_code == 409 and "without vLLM's sleep mode" in r.text, r.text
    finally:
        server.stop()


def test_sleep_and_wake_by_the_api_and_eviction_puts_a_sleeper_aside(tmp_path: Path) -> None:
    server = gpu_server(tmp_path, "--max-loaded", "1")
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        add_deployment(server, "other", 0.5)
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        r = server.fetch("/api/deployments/nap/sleep", "POST")
        assert r.status_code == 202 and r.json()["state"] == "sleeping", r.text
        eventually(lambda: held(server, pid) < 0.1 * int(0.5 * TOTAL), timeout=SLEEP_CHECK_S)
        r = server.fetch(
            f"/api/deployments/nap/wake?wait={WAKE_TIMEOUT_S:g}", "POST", timeout=WAKE_TIMEOUT_S + 10
        )
        assert r.status_code == 200 and r.json()["state"] == "ready" and r.json()["pid"] == pid, r.text
        # --max-loaded 1: loading "other" puts the idle sleeper-to-be to sleep rather than stopping it.
        assert load(server, "other").json()["state"] == "ready"
        assert states(server) == {"nap": "sleeping", "other": "ready"} and alive(pid)
        # And asking for "nap" wakes it, making room again: "other" (idle_action stop) is stopped.
        secret = server.create_key("inference")[1]
        assert chat(server, secret, "nap").status_code == 200
        assert states(server) == {"nap": "ready", "other": "unloaded"}
        assert instance(server, "nap")["pid"] == pid
        # GET /metrics counted each of those (docs/observability.md, "Metrics").
        samples = read_metrics(server, server.create_key("metrics")[1])
        events = ("loads", "sleeps", "wakes", "evictions")
        counted = {
            name: [value(samples, f"vllm_use_deployment_{event}_total", deployment=name) for event in events]
            for name in ("nap", "other")
        }
        assert counted == {"nap": [1, 2, 2, 1], "other": [1, 0, 0, 1]}
        # Bad requests change nothing: not asleep → 409; unknown → 404.
        assert server.fetch("/api/deployments/nap/wake", "POST").status_code == 409
        assert server.fetch("/api/deployments/nobody/sleep", "POST").status_code == 404
    finally:
        server.stop()


def test_a_sleep_that_keeps_the_memory_is_undone_by_a_stop(tmp_path: Path) -> None:
    """vLLM answers /sleep 200 and /is_sleeping true but NVML still shows the memory held: after the
    check's time the instance is stopped. The check is shortened to SHORT_CHECK_S (its test hook,
    docs/router.md): this test waits it out."""
    server = gpu_server(tmp_path, sleep_keeps_memory=1, env={SLEEP_CHECK_ENV: f"{SHORT_CHECK_S:g}"})
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        wait = SLEEP_CHECK_S + 10  # the deadline of the default check: the short one must end well within
        r = server.fetch(f"/api/deployments/nap/sleep?wait={wait:g}", "POST", timeout=wait + 10)
        assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
        eventually(lambda: not alive(pid), timeout=TERM_GRACE_S + REAP_CAP_S)
        assert "sleep failed" in server.log(), server.log()
        assert f"after {SHORT_CHECK_S:g} s it still holds" in server.log(), server.log()
    finally:
        server.stop()


def test_a_failed_wake_stops_the_instance_and_starts_it_cold_once(tmp_path: Path) -> None:
    server = gpu_server(tmp_path, wake_fails=1)
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        assert server.fetch(f"/api/deployments/nap/sleep?wait={SLEEP_CHECK_S:g}", "POST").json()["state"] == (
            "sleeping"
        )
        secret = server.create_key("inference")[1]
        answer = chat(server, secret, "nap")  # the wake fails: a fresh start answers it
        assert answer.status_code == 200, answer.text
        again = instance(server, "nap")
        assert again["state"] == "ready" and again["pid"] != pid and not alive(pid)
        assert "waking failed" in server.log()
    finally:
        server.stop()


def test_max_sleep_stops_a_sleeper(tmp_path: Path) -> None:
    server = gpu_server(tmp_path, "--max-sleep", "1")
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        r = server.fetch(f"/api/deployments/nap/sleep?wait={SLEEP_CHECK_S:g}", "POST")
        assert r.json()["state"] == "sleeping", r.text
        eventually(lambda: states(server)["nap"] == "unloaded", timeout=1 + TERM_GRACE_S + REAP_CAP_S)
        assert not alive(pid)
    finally:
        server.stop()


@pytest.mark.parametrize("verb", ["sleep", "wake"])
def test_without_nvidia_gpus_sleep_is_refused_and_idle_sleep_stops(tmp_path: Path, verb: str) -> None:
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300)
    first = free_port()
    server = start_server(
        tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}"
    )
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        assert load(server, "nap").json()["state"] == "ready"
        assert instance(server, "nap")["sleep_supported"] is False
        r = server.fetch(f"/api/deployments/nap/{verb}", "POST")
        assert r.status_code == 409, r.text
        assert states(server)["nap"] == "ready"
    finally:
        server.stop()


@pytest.mark.parametrize("keeps_memory", [False, True])
def test_the_gpu_sleep_check_tool_runs_against_the_fakes(tmp_path: Path, keeps_memory: bool) -> None:
    """tools/gpu_sleep_check.py is for a GPU machine; here it runs against the fake vLLM and NVML, so
    that it works when one is lent, and says "not ok" when the memory is kept."""
    nvml = tmp_path / "nvml"
    nvml.mkdir()
    gpus_file(nvml)
    knobs = {"sleep_keeps_memory": 1} if keeps_memory else {}
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=120, nvml_dir=str(nvml), **knobs)
    model = tmp_path / "model"
    model.mkdir()
    tool = Path(__file__).resolve().parents[1] / "tools" / "gpu_sleep_check.py"
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML), "FAKE_NVML_DIR": str(nvml)}
    done = subprocess.run(
        [
            sys.executable,
            str(tool),
            str(model),
            "--vllm-bin",
            str(vllm),
            "--start-timeout",
            str(START_TIMEOUT_S),
            "--sleep-check",
            # Only the memory-kept run waits the check out; the other must pass it, so it keeps the
            # full interval (a busy machine may take more than the short one to give memory back).
            str(SHORT_CHECK_S if keeps_memory else SLEEP_CHECK_DEFAULT_S),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT_S + SLEEP_CHECK_S + WAKE_TIMEOUT_S,
    )
    report = json.loads(done.stdout)
    if keeps_memory:
        assert done.returncode == 1 and report["ok"] is False, report
        assert report["error"] == f"TimeoutError: memory given back within {SHORT_CHECK_S:g} s", report
    else:
        assert done.returncode == 0 and report["ok"] is True, report
        assert report["awake_mib"] == int(0.5 * TOTAL) // 2**20
        assert report["asleep_mib"] < report["awake_mib"] / 10 and report["woken_mib"] == report["awake_mib"]
        assert report["completion"]


def test_the_sleep_check_hook_takes_only_a_shorter_positive_interval() -> None:
    """VLLM_USE_TEST_SLEEP_CHECK_S (docs/router.md, "Sleep") shortens the check, never lengthens it."""
    assert sleep_check_s({}) == SLEEP_CHECK_DEFAULT_S == 30
    assert sleep_check_s({SLEEP_CHECK_ENV: "2"}) == 2
    assert sleep_check_s({SLEEP_CHECK_ENV: "30"}) == 30  # the edge: the default itself
    for refused in ("30.5", "0", "-1", "nan", "inf", "soon", ""):
        assert sleep_check_s({SLEEP_CHECK_ENV: refused}) == SLEEP_CHECK_DEFAULT_S, refused

"""The vLLM supervisor with the fake `vllm`: switch, stop, restart, options, the lifecycle lock,
and the start's contract (docs/runtime.md): 202 at once, `?wait=` for the outcome, one start at a time.

The real CPU vLLM runs in tests/test_runtime_real.py; failure modes are in test_runtime_failures.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FAKE_VLLM, fake_vllm_bin
from tests.support.real_vllm import SETTLE_AFTER_TIMEOUT_S, STOP_BOUND_S, settle
from tests.support.server import ADMIN_TOKEN, Server, eventually, free_port, start_server
from vllm_use.runtime.supervisor import REAP_CAP_S

UPSTREAM_KEY = "upstream-secret-key-0123456789"
START_TIMEOUT_S = 30  # the fake is healthy after 0.3 s; a slower machine still fits


def group_alive(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != b"Z":
                pids.append(int(entry))
    return pids


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# Allowed extra flags (vllm_use/runtime/options.py), with values at the edge of their bounds.
ALLOWED_SWITCHES = [
    "--enforce-eager",
    "--disable-log-stats",
    "--disable-uvicorn-access-log",
    "--enable-chunked-prefill",
    "--async-scheduling",
    "--enable-prompt-tokens-details",
    "--enable-force-include-usage",
    "--disable-sliding-window",
    "--disable-hybrid-kv-cache-manager",
    "--enable-expert-parallel",
    "--disable-custom-all-reduce",
    "--enable-sleep-mode",
    "--long-prefill-token-threshold-adaptive",
    "--return-tokens-as-token-ids",
]
AT_THE_LIMIT = {
    "--seed": str(2**32 - 1),
    "--block-size": "4096",
    "--max-num-batched-tokens": "10000000",
    "--max-num-active-seqs": "1",
    "--max-num-queued-reqs": "1000000",
    "--max-num-queued-tokens": "1",
    "--long-prefill-token-threshold": "0",
    "--max-logprobs": "1024",
    "--stream-interval": "1",
    "--data-parallel-size": "1",
    "--max-parallel-loading-workers": "64",
    "--max-cudagraph-capture-size": "65536",
    "--renderer-num-workers": "1",
    "--optimization-level": "3",
    "--cpu-offload-gb": "0",
    "--watermark": "0.99",
    "--kv-cache-memory-bytes": "1024T",
    "--kv-cache-dtype": "fp8_e5m2",
    "--generation-config": "vllm",
    "--scheduling-policy": "priority",
    "--tokenizer-mode": "mistral",
    "--performance-mode": "throughput",
    "--attention-backend": "TORCH_SDPA",
}
EVERY_FLAG_ONCE = [{"name": k, "values": [v]} for k, v in AT_THE_LIMIT.items()] + [
    {"name": name} for name in ALLOWED_SWITCHES
]


def switch(server: Server, model_id: str, **options: Any) -> httpx.Response:
    """runtime.switch, waiting for its outcome."""
    options = {"start_timeout_s": START_TIMEOUT_S, **options}
    body = {"model_id": model_id, "options": options}
    return settle(server, "/api/runtime/switch", body, start_timeout_s=options["start_timeout_s"])


def ready_switch(server: Server, model_id: str, **options: Any) -> dict[str, Any]:
    r = switch(server, model_id, **options)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "ready", r.text
    return r.json()


def register_local(server: Server, name: str) -> str:
    model_dir = server.data_dir / "models" / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


@pytest.fixture
def runtime_server(tmp_path: Path):
    record = tmp_path / "records"
    record.mkdir()
    port = free_port()
    vllm = fake_vllm_bin(tmp_path / "bin", record=record / "{pid}.json", spawn_children=2)
    server = start_server(
        tmp_path / "data",
        "--vllm-bin",
        str(vllm),
        "--runtime-port",
        str(port),
        "--upstream-api-key",
        UPSTREAM_KEY,
    )
    server.runtime_port = port  # type: ignore[attr-defined]
    server.records = record  # type: ignore[attr-defined]
    yield server
    server.fetch("/api/runtime/stop", "POST")
    server.stop()


def records(server: Any) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(server.records.iterdir())]


def chat(server: Server, model: str) -> str:
    """Through the gateway: the runtime's port itself wants the child's own key."""
    _, key = server.create_key("inference")
    r = server.fetch(
        "/v1/chat/completions",
        "POST",
        json={"model": model, "messages": [{"role": "user", "content": "hello"}]},
        token=key,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_switch_runs_a_ready_model_and_reports_it(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    status = ready_switch(runtime_server, model_id)
    assert status["active_model_id"] == model_id
    assert status["port"] == runtime_server.runtime_port
    assert status["model"] == str(runtime_server.data_dir / "models" / "alpha")
    assert status["options"]["served_model_name"] == "alpha"
    assert status["pid"] in group_alive(status["pgid"])
    assert status["uptime_s"] >= 0
    assert chat(runtime_server, "alpha")
    assert runtime_server.fetch("/api/runtime").json()["state"] == "ready"
    assert runtime_server.fetch("/api/runtime/logs?tail=5").json()["lines"]


def test_switch_to_another_model_replaces_the_whole_process_tree(runtime_server: Any) -> None:
    first, second = register_local(runtime_server, "alpha"), register_local(runtime_server, "beta")
    before = ready_switch(runtime_server, first)
    assert len(group_alive(before["pgid"])) >= 4  # reaper, vllm, EngineCore, Worker
    after = ready_switch(runtime_server, second)
    assert after["active_model_id"] == second
    assert group_alive(before["pgid"]) == []
    assert chat(runtime_server, "beta")


def test_stop_leaves_no_process_of_the_group_and_closes_the_port(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    status = ready_switch(runtime_server, model_id)
    stopped = runtime_server.fetch("/api/runtime/stop", "POST")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert group_alive(status["pgid"]) == []
    assert not port_open(runtime_server.runtime_port)


def test_child_environment_holds_no_admin_token_or_upstream_key(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    ready_switch(runtime_server, model_id, gpu_ids=[1, 0])
    (record,) = records(runtime_server)
    env_text = json.dumps(record["env"])
    assert ADMIN_TOKEN not in env_text and UPSTREAM_KEY not in env_text
    assert not any(k.startswith("VLLM_USE_") for k in record["env"])
    assert record["env"]["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert record["argv"][1:3] == ["serve", str(runtime_server.data_dir / "models" / "alpha")]


@pytest.mark.parametrize(
    "options",
    [
        {"gpu_memory_utilization": 0},
        {"gpu_memory_utilization": 1.01},
        {"gpu_memory_utilization": "NaN"},
        {"gpu_memory_utilization": "inf"},
        {"gpu_ids": [0, 0]},
        {"extra_args": [{"name": "--max-model-len", "values": ["4"]}]},
        {"extra_args": [{"name": "--port", "values": ["1"]}]},
        {"extra_args": [{"name": "--seed", "values": ["1"]}, {"name": "--seed", "values": ["2"]}]},
        {"extra_args": [{"name": "--enforce-eager"}, {"name": "--no-enforce-eager"}]},
        {"extra_args": [{"name": "--seed", "values": ["--trust-remote-code"]}]},
        {"served_model_name": "--trust-remote-code"},
        {"quantization": "--trust-remote-code"},
        {"tool_call_parser": "hermes --trust-remote-code"},
        {"served_model_name": "bad\nname"},
        {"extra_args": [{"name": "--attention-backend", "values": ["a\u0007b"]}]},
        {"extra_args": EVERY_FLAG_ONCE[:33]},  # 33 distinct allowed flags: more than 32
        {"extra_args": [{"name": "--seed", "values": ["1", "2"]}]},  # one value at most
        {"extra_args": [{"name": "--seed", "values": ["1" * 65]}]},  # 64 bytes a value at most
        {"extra_args": [{"name": "--seed", "values": [str(2**32)]}]},  # out of the flag's bounds
        {"extra_args": [{"name": "--enforce-eager", "values": ["1"]}]},  # a switch takes no value
        {"extra_args": [{"name": "--seed"}]},  # a valued flag needs its value
        {"extra_args": [{"name": "-x"}]},
        {"extra_args": [{"name": "--bad=flag"}]},
        {"model": "/somewhere/else"},
        {"port": 80},
        {"start_timeout_s": 0},
    ],
)
def test_bad_options_are_refused_before_any_process_starts(runtime_server: Any, options: dict) -> None:
    model_id = register_local(runtime_server, "alpha")
    r = runtime_server.fetch("/api/runtime/switch", "POST", json={"model_id": model_id, "options": options})
    assert r.status_code == 400, r.text  # answered at once: nothing was started to wait for
    assert r.json()["error"]["code"] == "invalid_arguments"
    assert records(runtime_server) == []
    assert runtime_server.fetch("/api/runtime").json()["state"] == "stopped"


def test_option_bounds_pass_at_the_limit(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    extra = EVERY_FLAG_ONCE[:32]
    options = {
        "gpu_memory_utilization": 1.0,
        "extra_args": extra,
        "enable_prefix_caching": False,
        "distributed_executor_backend": "mp",
    }
    ready_switch(runtime_server, model_id, **options)
    argv = records(runtime_server)[0]["argv"]
    assert "--gpu-memory-utilization=1.0" in argv and "--no-enable-prefix-caching" in argv
    assert "--distributed-executor-backend=mp" in argv
    assert {f"{name}={value}" for name, value in AT_THE_LIMIT.items()} <= set(argv)
    assert set(ALLOWED_SWITCHES[: 32 - len(AT_THE_LIMIT)]) <= set(argv)


def test_restart_with_invalid_options_leaves_the_healthy_process_running(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    before = ready_switch(runtime_server, model_id)
    bad = runtime_server.fetch("/api/runtime/restart", "POST", json={"options": {"gpu_ids": [3, 3]}})
    assert bad.status_code == 400
    status = runtime_server.fetch("/api/runtime").json()
    assert status["state"] == "ready" and status["pid"] == before["pid"]
    options = {"max_model_len": 256, "start_timeout_s": START_TIMEOUT_S}
    good = settle(
        runtime_server, "/api/runtime/restart", {"options": options}, start_timeout_s=START_TIMEOUT_S
    )
    assert good.status_code == 200, good.text
    assert good.json()["pid"] != before["pid"] and good.json()["active_model_id"] == model_id
    assert "--max-model-len=256" in records(runtime_server)[-1]["argv"]


def test_delete_refuses_the_running_model_until_it_is_stopped(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    ready_switch(runtime_server, model_id)
    r = runtime_server.fetch(f"/api/models/{model_id}?files=true", "DELETE")
    assert r.status_code == 409
    assert (runtime_server.data_dir / "models" / "alpha").is_dir()
    runtime_server.fetch("/api/runtime/stop", "POST")
    # runtime.switch saved a deployment of it (docs/router.md): that is deleted first, by name.
    r = runtime_server.fetch(f"/api/models/{model_id}?files=true", "DELETE")
    assert r.status_code == 409 and "alpha" in r.json()["error"]["message"], r.text
    assert runtime_server.fetch("/api/deployments/alpha", "DELETE").status_code == 200
    assert runtime_server.fetch(f"/api/models/{model_id}?files=true", "DELETE").status_code == 200


def test_switch_refuses_a_directory_replaced_by_a_symlink(runtime_server: Any, tmp_path: Path) -> None:
    model_id = register_local(runtime_server, "alpha")
    model_dir = runtime_server.data_dir / "models" / "alpha"
    elsewhere = tmp_path / "elsewhere"
    model_dir.rename(elsewhere)
    model_dir.symlink_to(elsewhere)
    r = runtime_server.fetch("/api/runtime/switch", "POST", json={"model_id": model_id})
    assert r.status_code == 409, r.text
    assert records(runtime_server) == []


def test_switch_needs_a_ready_model(runtime_server: Any) -> None:
    hf = runtime_server.fetch("/api/models/huggingface", "POST", json={"repository": "org/x"}).json()["model"]
    assert runtime_server.fetch("/api/runtime/switch", "POST", json={"model_id": hf["id"]}).status_code == 409
    assert runtime_server.fetch("/api/runtime/switch", "POST", json={"model_id": "0" * 32}).status_code == 404
    assert runtime_server.fetch("/api/runtime/switch", "POST", json={"model_id": "X"}).status_code == 400


def test_direct_start_then_switch_takes_over(runtime_server: Any) -> None:
    direct = runtime_server.data_dir / "models" / "direct"
    direct.mkdir(parents=True)
    (direct / "config.json").write_text("{}")
    options = {"model": str(direct), "start_timeout_s": START_TIMEOUT_S}
    r = settle(runtime_server, "/api/runtime/start", {"options": options}, start_timeout_s=START_TIMEOUT_S)
    assert r.status_code == 200, r.text
    started = r.json()
    assert started["active_model_id"] is None and started["state"] == "ready"
    again = runtime_server.fetch("/api/runtime/start", "POST", json={"options": {"model": str(direct)}})
    assert again.status_code == 409
    model_id = register_local(runtime_server, "alpha")
    switched = ready_switch(runtime_server, model_id)
    assert switched["active_model_id"] == model_id
    assert group_alive(started["pgid"]) == []


def test_start_needs_a_model(runtime_server: Any) -> None:
    r = runtime_server.fetch("/api/runtime/start", "POST", json={"options": {}})
    assert r.status_code == 400
    assert r.json()["error"]["errors"][0]["loc"] == ["options.model"]


def test_sigterm_stops_the_runtime_with_the_server(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--vllm-bin", str(FAKE_VLLM), "--runtime-port", str(free_port()))
    model_id = register_local(server, "alpha")
    status = ready_switch(server, model_id)
    assert server.stop() == 0
    eventually(lambda: group_alive(status["pgid"]) == [], timeout=REAP_CAP_S)


def test_the_gateway_upstream_follows_the_runtime_port(runtime_server: Any) -> None:
    assert (
        runtime_server.fetch("/api/runtime").json()["upstream"]
        == f"http://127.0.0.1:{runtime_server.runtime_port}"
    )
    model_id = register_local(runtime_server, "alpha")
    other = free_port()
    status = ready_switch(runtime_server, model_id, port=other)
    assert status["port"] == other
    assert status["upstream"] == f"http://127.0.0.1:{other}"


def test_an_explicit_upstream_wins(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data", "--vllm-bin", str(FAKE_VLLM), "--upstream", "http://localhost:9999"
    )
    try:
        assert server.fetch("/api/runtime").json()["upstream"] == "http://localhost:9999"
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- starting


@pytest.fixture
def slow_server(tmp_path: Path):
    """A server whose fake vLLM loads for a minute (FAKE_VLLM_LOAD_SECONDS): a start stays
    `starting` until the test stops it."""
    record = tmp_path / "records"
    record.mkdir()
    vllm = fake_vllm_bin(
        tmp_path / "bin", record=record / "{pid}.json", load_seconds=60, spawn_children=2, max_lifetime=120
    )
    server = start_server(tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-port", str(free_port()))
    server.records = record  # type: ignore[attr-defined]
    yield server
    server.fetch("/api/runtime/stop", "POST")
    server.stop()


def status_of(server: Server) -> dict[str, Any]:
    r = server.fetch("/api/runtime")
    assert r.status_code == 200, r.text
    return r.json()


def settled(server: Server) -> dict[str, Any]:
    """The status once the start has left `starting`, within its start timeout."""
    return eventually(
        lambda: (s := status_of(server))["state"] != "starting" and s,
        timeout=START_TIMEOUT_S + SETTLE_AFTER_TIMEOUT_S,
    )


def test_switch_answers_202_at_once_and_the_start_goes_on_without_a_waiter(runtime_server: Any) -> None:
    model_id = register_local(runtime_server, "alpha")
    body = {"model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}}
    r = runtime_server.fetch("/api/runtime/switch", "POST", json=body)
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert accepted["state"] == "starting" and accepted["active_model_id"] == model_id
    assert accepted["start_timeout_s"] == START_TIMEOUT_S and accepted["starting_for_s"] >= 0
    # Nobody waits: the supervisor's own readiness task takes the start to ready.
    done = settled(runtime_server)
    assert done["state"] == "ready" and done["pgid"] == accepted["pgid"], done
    assert done["starting_for_s"] is None and done["last_line"] is None
    assert chat(runtime_server, "alpha")


def test_a_wait_that_runs_out_answers_202_while_vllm_still_loads(slow_server: Any) -> None:
    model_id = register_local(slow_server, "alpha")
    r = slow_server.fetch(
        "/api/runtime/switch?wait=1", "POST", json={"model_id": model_id}, timeout=1 + STOP_BOUND_S
    )
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "starting"  # the fake loads for a minute: the wait ran out first
    assert status_of(slow_server)["state"] == "starting"


def test_status_shows_a_loading_starts_progress_and_last_line(slow_server: Any) -> None:
    model_id = register_local(slow_server, "alpha")
    body = {"model_id": model_id, "options": {"start_timeout_s": 120}}
    accepted = slow_server.fetch("/api/runtime/switch", "POST", json=body).json()
    loading = eventually(
        lambda: "Initializing a V1 LLM engine" in ((s := status_of(slow_server))["last_line"] or "") and s
    )
    assert loading["state"] == "starting" and loading["pgid"] == accepted["pgid"]
    assert loading["start_timeout_s"] == 120
    assert loading["starting_for_s"] >= accepted["starting_for_s"]
    assert loading["uptime_s"] is None


def test_two_switches_at_once_one_starts_and_the_other_gets_409(slow_server: Any) -> None:
    model_id = register_local(slow_server, "alpha")
    both = threading.Barrier(2)

    def call() -> httpx.Response:
        with httpx.Client(timeout=STOP_BOUND_S, trust_env=False) as client:
            both.wait()
            return client.post(
                slow_server.base_url + "/api/runtime/switch",
                json={"model_id": model_id},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        answers = [f.result() for f in [pool.submit(call) for _ in range(2)]]

    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    started = next(a for a in answers if a.status_code == 202).json()
    error = next(a for a in answers if a.status_code == 409).json()["error"]
    assert error["code"] == "conflict" and "in progress" in error["message"] and error["state"] == "starting"
    (record,) = eventually(lambda: records(slow_server))  # one vLLM was started, the winner's
    assert record["pid"] in group_alive(started["pgid"])
    assert status_of(slow_server)["pgid"] == started["pgid"]


@pytest.mark.parametrize("second", ["start", "switch", "restart"])
def test_a_start_in_progress_is_never_replaced_behind_its_callers_back(slow_server: Any, second: str) -> None:
    model_id = register_local(slow_server, "alpha")
    first = slow_server.fetch("/api/runtime/switch", "POST", json={"model_id": model_id})
    assert first.status_code == 202, first.text
    body = {
        "start": {"options": {"model": str(slow_server.data_dir / "models" / "alpha")}},
        "switch": {"model_id": model_id},
        "restart": {},
    }[second]
    r = slow_server.fetch(f"/api/runtime/{second}", "POST", json=body)
    assert r.status_code == 409, r.text
    assert "in progress" in r.json()["error"]["message"]
    now = status_of(slow_server)
    assert now["state"] == "starting" and now["pgid"] == first.json()["pgid"]


@pytest.mark.parametrize(
    ("query", "body_extra", "loc"),
    [
        ("", {"wait": 5}, "wait"),  # a query parameter, not a body field
        ("?wait=601", {}, "wait"),
        ("?wait=-1", {}, "wait"),
        ("?wait=1.5", {}, "wait"),
        ("?wait=soon", {}, "wait"),
        ("?wait=1&wait=2", {}, "wait"),
    ],
)
def test_a_bad_wait_is_refused_naming_it_and_starts_nothing(
    runtime_server: Any, query: str, body_extra: dict[str, Any], loc: str
) -> None:
    model_id = register_local(runtime_server, "alpha")
    r = runtime_server.fetch(f"/api/runtime/switch{query}", "POST", json={"model_id": model_id, **body_extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["errors"][0]["loc"] == [loc]
    assert records(runtime_server) == []
    assert status_of(runtime_server)["state"] == "stopped"


def test_openapi_documents_the_202_and_the_bounded_wait(runtime_server: Any) -> None:
    doc = runtime_server.fetch("/api/openapi.json").json()
    for name in ("start", "switch", "restart"):
        operation = doc["paths"][f"/api/runtime/{name}"]["post"]
        assert {"200", "202", "409", "502"} <= set(operation["responses"]), name
        assert operation["responses"]["202"]["content"] == operation["responses"]["200"]["content"]
        (wait,) = [p for p in operation["parameters"] if p["name"] == "wait"]
        assert wait["in"] == "query" and not wait["required"]
        assert wait["schema"]["minimum"] == 0 and wait["schema"]["maximum"] == 600
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert "wait" not in body["properties"]

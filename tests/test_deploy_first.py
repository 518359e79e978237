"""A failed start explains itself, and what vLLM would refuse is refused before anything runs
(issue 17, finding 8; docs/runtime.md, "Failed starts" and "Options that go together"):

- options that vLLM accepts only together (`enable_auto_tool_choice` without `tool_call_parser`…)
  are a 400 naming the field at create, update, switch and start: nothing is saved or spawned;
- a start that vLLM refuses (its checks of the options against the model) answers 422
  `start_refused`, not a 5xx, and the instance's or runtime's `error` carries vLLM's own reason;
  a real failure of the child (the engine dying) stays a 502 `runtime_failed`.

Real server over HTTP, the fake vLLM (tests/fakes/vllm.py, which prints vLLM 0.32's own lines).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import fake_vllm_bin
from tests.support.deployments import START_TIMEOUT_S, create, load, register
from tests.support.server import Server, free_port, start_server

TOOLS_ALONE = {"enable_auto_tool_choice": True}
# Above the model's max_position_embeddings (config.json below): only vLLM knows that one.
THRESHOLD_ABOVE = {"extra_args": [{"name": "--long-prefill-token-threshold", "values": ["4096"]}]}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records"
    path.mkdir()
    return path


@pytest.fixture
def server(tmp_path: Path, records: Path) -> Iterator[Server]:
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=120, record=records / "{pid}.json")
    first = free_port()
    srv = start_server(
        tmp_path / "data",
        "--vllm-bin",
        str(vllm),
        "--runtime-ports",
        f"{first}-{first + 9}",
        "--runtime-port",
        str(free_port()),
    )
    try:
        yield srv
    finally:
        srv.fetch("/api/runtime/stop", "POST")
        srv.stop()


def small_model(server: Server, name: str = "alpha") -> str:
    """A ready model whose config.json says 2048 positions (the fake reads it as vLLM does)."""
    model_id = register(server, name)
    (server.data_dir / "models" / name / "config.json").write_text('{"max_position_embeddings": 2048}')
    return model_id


def field_errors(r: Any) -> dict[str, str]:
    return {".".join(e["loc"]): e["msg"] for e in r.json()["error"]["errors"]}


def test_an_option_that_needs_another_is_refused_at_create_update_and_switch_and_nothing_spawns(
    server: Server, records: Path
) -> None:
    model_id = small_model(server)
    body = {"name": "tools", "model_id": model_id, "options": TOOLS_ALONE}

    r = create(server, body)
    assert r.status_code == 400, r.text
    assert "options.enable_auto_tool_choice" in field_errors(r)
    assert "tool_call_parser" in field_errors(r)["options.enable_auto_tool_choice"]
    assert server.fetch("/api/deployments").json()["deployments"] == []  # nothing saved

    assert create(server, {"name": "tools", "model_id": model_id}).status_code == 201
    r = server.fetch("/api/deployments/tools", "PATCH", json={"options": TOOLS_ALONE})
    assert r.status_code == 400 and "options.enable_auto_tool_choice" in field_errors(r), r.text
    assert server.fetch("/api/deployments/tools").json()["options"] == {}  # unchanged

    r = server.fetch("/api/runtime/switch", "POST", json={"model_id": model_id, "options": TOOLS_ALONE})
    assert r.status_code == 400 and "options.enable_auto_tool_choice" in field_errors(r), r.text
    path = str(server.data_dir / "models" / "alpha")
    r = server.fetch("/api/runtime/start", "POST", json={"options": {"model": path, **TOOLS_ALONE}})
    assert r.status_code == 400 and "options.enable_auto_tool_choice" in field_errors(r), r.text

    # With the parser the same options are fine: the deployment is saved as given.
    fixed = {"options": {**TOOLS_ALONE, "tool_call_parser": "hermes"}}
    assert server.fetch("/api/deployments/tools", "PATCH", json=fixed).status_code == 200
    assert server.fetch("/api/runtime").json()["state"] == "stopped"
    assert list(records.iterdir()) == []  # no vLLM was ever started


def test_a_row_saved_before_the_rule_is_refused_at_load_and_nothing_spawns(
    tmp_path: Path, records: Path
) -> None:
    """A deployment saved with an option that needs another (by an older vllm-use) still reads, and
    its load is the 400 naming the field, before room is made or anything spawns."""
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=120, record=records / "{pid}.json")
    first = free_port()
    flags = ("--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}")
    server = start_server(tmp_path / "data", *flags)
    try:
        assert create(server, {"name": "old", "model_id": small_model(server)}).status_code == 201
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "data" / "vllm-use.db") as db:
        db.execute("""UPDATE deployments SET options = '{"enable_auto_tool_choice":true}'""")
    server = start_server(tmp_path / "data", *flags)
    try:
        assert server.fetch("/api/deployments/old").json()["options"] == {"enable_auto_tool_choice": True}
        r = load(server, "old")
        assert r.status_code == 400 and "options.enable_auto_tool_choice" in field_errors(r), r.text
        assert server.fetch("/api/deployments/old").json()["instance"]["state"] == "unloaded"
        assert list(records.iterdir()) == []
    finally:
        server.stop()


def test_extra_flags_that_disagree_with_typed_options_are_refused_naming_extra_args(server: Server) -> None:
    model_id = small_model(server)
    options = {
        "max_model_len": 1024,
        "extra_args": [{"name": "--long-prefill-token-threshold", "values": ["4096"]}],
    }
    r = create(server, {"name": "long", "model_id": model_id, "options": options})
    assert r.status_code == 400, r.text
    assert "cannot be greater than max_model_len (1024)" in field_errors(r)["options.extra_args"]


def test_a_start_vllm_refuses_is_a_422_with_vllms_reason_not_a_5xx(server: Server) -> None:
    model_id = small_model(server)
    assert (
        create(server, {"name": "long", "model_id": model_id, "options": THRESHOLD_ABOVE}).status_code == 201
    )

    r = load(server, "long")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "start_refused"
    reason = "long_prefill_token_threshold (4096) cannot be greater than the max_model_len (2048)"
    assert reason in error["message"]
    assert any("ValidationError" in line for line in error["last_lines"])
    instance = server.fetch("/api/deployments/long").json()["instance"]
    assert instance["state"] == "failed"
    assert reason in instance["error"]  # the deployment's status says why, not only "status 1"

    # The runtime's start alike: runtime.switch waits for it and gets the 422 with the reason.
    body = {"model_id": model_id, "options": {"served_model_name": "long2", **THRESHOLD_ABOVE}}
    r = server.fetch(
        f"/api/runtime/switch?wait={START_TIMEOUT_S}", "POST", json=body, timeout=START_TIMEOUT_S + 10
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "start_refused", r.text
    status = server.fetch("/api/runtime").json()
    assert status["state"] == "failed" and reason in status["error"], status


def test_an_engine_that_dies_at_start_stays_a_502_and_says_its_last_exception(tmp_path: Path) -> None:
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=120, fail_on_start=1)
    first = free_port()
    server = start_server(
        tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}"
    )
    try:
        model_id = register(server, "alpha")
        assert create(server, {"name": "crash", "model_id": model_id}).status_code == 201
        r = load(server, "crash")
        assert r.status_code == 502 and r.json()["error"]["code"] == "runtime_failed", r.text
        assert r.json()["error"]["message"] == (
            "vllm exited with status 1: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}"
        )
    finally:
        server.stop()


def test_a_missing_vllm_is_named_in_the_failure(tmp_path: Path) -> None:
    first = free_port()
    missing = str(tmp_path / "nowhere" / "vllm")
    server = start_server(tmp_path / "data", "--vllm-bin", missing, "--runtime-ports", f"{first}-{first + 9}")
    try:
        assert create(server, {"name": "none", "model_id": register(server, "alpha")}).status_code == 201
        r = load(server, "none")
        assert r.status_code == 502 and r.json()["error"]["code"] == "runtime_failed", r.text
        assert f"cannot start {missing}: No such file or directory" in r.json()["error"]["message"]
        assert "is vLLM installed?" in server.fetch("/api/deployments/none").json()["instance"]["error"]
    finally:
        server.stop()

"""Deployments as saved records (docs/router.md, "Deployments"): create, read, change and delete them
over /api and MCP, every rule checked at its edge, and each kept across a restart of vllm-use.

Loading, routing and idle handling come with instances (issue 14's later parts); these tests are
about what is saved.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import fake_vllm_bin
from tests.support.deployments import (
    LONG,
    START_TIMEOUT_S,
    alive,
    chat,
    create,
    deploy,
    instance,
    load,
    on_demand_server,
    register,
    states,
    streaming,
)
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.deployments.records import ALIASES_MAX, IDLE_TIMEOUT_MAX_S, STOP_TIMEOUT_MAX_S
from vllm_use.runtime.supervisor import REAP_CAP_S, TERM_GRACE_S


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "data", "--model-aliases", "fast=tiny")
    yield srv
    srv.stop()


@pytest.fixture
def model_id(server: Server) -> str:
    return register(server, "alpha")


@pytest.fixture(scope="module")
def shared_model_id(shared_server: Server) -> str:
    """A model on the module's `shared_server`, for the refusals: they save nothing (each checks
    that no deployment is listed), so they share one server rather than start one each."""
    return register(shared_server, "alpha")


def names(server: Server) -> list[str]:
    r = server.fetch("/api/deployments")
    assert r.status_code == 200, r.text
    return [d["name"] for d in r.json()["deployments"]]


def test_a_deployment_is_saved_with_its_defaults_and_read_back(server: Server, model_id: str) -> None:
    r = create(server, {"name": "llama", "model_id": model_id, "options": {"max_model_len": 4096}})
    assert r.status_code == 201, r.text
    saved = r.json()
    assert saved["instance"] == {
        "state": "unloaded",
        "port": None,
        "pid": None,
        "pgid": None,
        "error": None,
        "last_lines": [],
        "restart_required": False,
        "in_flight": 0,
        "waiting": 0,
        "last_used": None,
        "idle_deadline": None,
        "sleep_supported": False,  # no NVIDIA GPU here: idle_action sleep stops
        "asleep": False,
    }
    assert {k: v for k, v in saved.items() if not k.endswith("_at") and k != "instance"} == {
        "name": "llama",
        "model_id": model_id,
        "options": {"max_model_len": 4096},
        "aliases": [],
        "pinned": False,
        "load_on_start": False,
        "idle_timeout_s": 0,
        "idle_action": "stop",
        "stop_timeout_s": 10,
    }
    assert server.fetch("/api/deployments/llama").json() == saved
    assert server.fetch("/api/deployments").json() == {"deployments": [saved]}


def test_names_with_slashes_are_reached_percent_encoded(server: Server, model_id: str) -> None:
    assert create(server, {"name": "org/model:q4", "model_id": model_id}).status_code == 201
    assert server.fetch("/api/deployments/org%2Fmodel:q4").json()["name"] == "org/model:q4"
    assert server.fetch("/api/deployments/org%2Fmodel:q4", "DELETE").json() == {"deleted": "org/model:q4"}
    assert names(server) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "-leading-dash"}, "name"),
        ({"name": "x" * 257}, "name"),
        ({"name": "tab\tinside"}, "name"),
        ({"model_id": "not-an-id"}, "model_id"),
        ({"options": {"port": 9000}}, "options"),
        ({"options": {"served_model_name": "other"}}, "options"),
        ({"options": {"model": "/elsewhere"}}, "options"),
        ({"options": {"extra_args": [{"name": "--chat-template", "values": ["x"]}]}}, "options"),
        ({"aliases": ["a", "a"]}, "aliases"),
        ({"aliases": ["llama"]}, None),  # repeats the name
        ({"aliases": [f"a{i}" for i in range(ALIASES_MAX + 1)]}, "aliases"),
        ({"idle_timeout_s": -1}, "idle_timeout_s"),
        ({"idle_timeout_s": IDLE_TIMEOUT_MAX_S + 1}, "idle_timeout_s"),
        ({"idle_action": "nap"}, "idle_action"),
        ({"stop_timeout_s": 0}, "stop_timeout_s"),
        ({"stop_timeout_s": STOP_TIMEOUT_MAX_S + 1}, "stop_timeout_s"),
        ({"pinned": "yes"}, "pinned"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_saves_nothing(
    shared_server: Server, shared_model_id: str, change: dict[str, Any], field: str | None
) -> None:
    r = create(shared_server, {"name": "llama", "model_id": shared_model_id, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_arguments"
    if field is not None:
        assert error["errors"][0]["loc"][0] == field, error
    assert names(shared_server) == []


def test_the_limits_hold_at_their_edges(server: Server, model_id: str) -> None:
    body = {
        "name": "x" * 256,
        "model_id": model_id,
        "aliases": [f"a{i}" for i in range(ALIASES_MAX)],
        "idle_timeout_s": IDLE_TIMEOUT_MAX_S,
        "stop_timeout_s": STOP_TIMEOUT_MAX_S,
        "idle_action": "sleep",
    }
    r = create(server, body)
    assert r.status_code == 201, r.text
    assert r.json()["aliases"] == body["aliases"] and r.json()["idle_action"] == "sleep"
    low = {"name": "low", "model_id": model_id, "idle_timeout_s": 0, "stop_timeout_s": 1}
    assert create(server, low).status_code == 201


def test_names_and_aliases_are_unique_across_deployments_and_model_aliases(
    server: Server, model_id: str
) -> None:
    assert create(server, {"name": "llama", "model_id": model_id, "aliases": ["ll"]}).status_code == 201
    for taken in ("llama", "ll", "fast"):  # a deployment's name, its alias, one of --model-aliases
        as_name = create(server, {"name": taken, "model_id": model_id})
        as_alias = create(server, {"name": "other", "model_id": model_id, "aliases": [taken]})
        for r in (as_name, as_alias):
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "conflict" and taken in r.json()["error"]["message"]
    assert names(server) == ["llama"]
    # Its own names are not taken from itself: an update may keep them.
    r = server.fetch("/api/deployments/llama", "PATCH", json={"aliases": ["ll", "l2"], "pinned": True})
    assert r.status_code == 200, r.text


def test_the_model_must_be_registered_and_ready(server: Server, model_id: str) -> None:
    r = create(server, {"name": "llama", "model_id": "0" * 32})
    assert r.status_code == 404, r.text
    hub = server.fetch(
        "/api/models/huggingface", "POST", json={"repository": "acme/not-downloaded", "revision": "main"}
    )
    assert hub.status_code == 201, hub.text
    r = create(server, {"name": "llama", "model_id": hub.json()["model"]["id"]})
    assert r.status_code == 409 and "registered" in r.json()["error"]["message"], r.text
    assert names(server) == []


def test_trust_remote_code_needs_the_operators_consent(shared_server: Server, shared_model_id: str) -> None:
    body = {"name": "llama", "model_id": shared_model_id, "options": {"trust_remote_code": True}}
    r = create(shared_server, body)
    assert r.status_code == 400 and "--allow-remote-code" in r.json()["error"]["message"], r.text
    assert names(shared_server) == []


def test_an_update_changes_only_what_it_names_and_is_checked_as_a_whole(
    server: Server, model_id: str
) -> None:
    other_model = register(server, "beta")
    body = {"name": "llama", "model_id": model_id, "options": {"max_model_len": 2048}, "aliases": ["ll"]}
    created = create(server, body).json()
    r = server.fetch("/api/deployments/llama", "PATCH", json={"model_id": other_model, "idle_timeout_s": 300})
    assert r.status_code == 200, r.text
    updated = r.json()
    assert updated["model_id"] == other_model and updated["idle_timeout_s"] == 300
    assert updated["options"] == {"max_model_len": 2048} and updated["aliases"] == ["ll"]
    assert updated["created_at"] == created["created_at"] and updated["updated_at"] >= created["updated_at"]
    # Refused changes change nothing.
    for change, status in (
        ({"aliases": ["llama"]}, 400),  # an alias repeating the name
        ({"options": {"port": 9000}}, 400),
        ({"model_id": "0" * 32}, 404),
        ({"name": "renamed"}, 400),  # the name is in the path, not the body
    ):
        r = server.fetch("/api/deployments/llama", "PATCH", json=change)
        assert r.status_code == status, (change, r.text)
    assert server.fetch("/api/deployments/llama").json() == updated
    assert server.fetch("/api/deployments/nope", "PATCH", json={"pinned": True}).status_code == 404


def test_a_model_that_a_deployment_serves_cannot_be_deleted(server: Server, model_id: str) -> None:
    assert create(server, {"name": "llama", "model_id": model_id}).status_code == 201
    r = server.fetch(f"/api/models/{model_id}", "DELETE")
    assert r.status_code == 409 and "llama" in r.json()["error"]["message"], r.text
    assert server.fetch("/api/deployments/llama", "DELETE").status_code == 200
    assert server.fetch("/api/deployments/llama", "DELETE").status_code == 404
    assert server.fetch(f"/api/models/{model_id}", "DELETE").status_code == 200


def test_deployments_are_kept_across_a_restart_and_a_hand_edited_row_is_reported(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "data")
    try:
        model_id = register(server, "alpha")
        first = create(server, {"name": "llama", "model_id": model_id, "load_on_start": True}).json()
    finally:
        server.stop()
    server = start_server(tmp_path / "data")
    try:
        (again,) = server.fetch("/api/deployments").json()["deployments"]
        assert {**again, "instance": None} == {
            **first,
            "instance": None,
        }  # (its load at start is another test)
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "data" / "vllm-use.db") as db:
        db.execute("UPDATE deployments SET idle_action = 'nap'")
    server = start_server(tmp_path / "data")
    try:
        r = server.fetch("/api/deployments")
        assert r.status_code == 500 and r.json()["error"]["code"] == "corrupt_record", r.text
        assert "idle_action" in r.json()["error"]["message"]
    finally:
        server.stop()


def test_mcp_sees_the_same_methods_with_its_own_scopes(server: Server, model_id: str) -> None:
    runtime_key = server.create_key("mcp.runtime")[1]
    read_key = server.create_key("mcp.read")[1]

    def call(name: str, arguments: dict[str, Any], token: str) -> dict[str, Any]:
        return server.mcp("tools/call", {"name": name, "arguments": arguments}, token=token).json()

    made = call("deployments.create", {"name": "llama", "model_id": model_id}, runtime_key)
    assert made["result"]["isError"] is False, made
    refused = call("deployments.create", {"name": "two", "model_id": model_id}, read_key)
    assert refused["error"]["message"] == "Unknown tool: deployments.create", refused
    listed = call("deployments.list", {}, read_key)["result"]["structuredContent"]
    assert [d["name"] for d in listed["deployments"]] == ["llama"]


# --- instances: load, route, unload ----------------------------------------------------------------


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Server]:
    """A server whose deployments run the fake vLLM on a few free ports."""
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300)
    first = free_port()
    ports = f"{first}-{first + 9}"
    srv = start_server(
        tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", ports, "--max-loaded", "4"
    )
    yield srv
    srv.stop()


def test_a_loaded_deployment_answers_by_name_and_alias_and_unloads(router: Server) -> None:
    model_id = register(router, "alpha")
    body = {
        "name": "llama",
        "model_id": model_id,
        "aliases": ["ll"],
        "options": {"start_timeout_s": START_TIMEOUT_S},
    }
    assert create(router, body).status_code == 201
    secret = router.create_key("inference")[1]
    r = load(router, "llama")
    assert r.status_code == 200, r.text
    loaded = r.json()
    assert loaded["state"] == "ready" and loaded["name"] == "llama" and loaded["pid"], loaded
    instance = router.fetch("/api/deployments/llama").json()["instance"]
    assert instance["state"] == "ready" and instance["port"] == loaded["port"]
    for model in ("llama", "ll"):  # the alias is rewritten to the served name the instance knows
        r = chat(router, secret, model)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "llama"
    assert load(router, "llama").status_code == 409  # loaded already

    r = router.fetch("/api/deployments/llama/unload", "POST")
    assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
    assert not alive(loaded["pid"])


def test_two_deployments_run_side_by_side_and_delete_stops_its_instance(router: Server) -> None:
    first, second = register(router, "alpha"), register(router, "beta")
    options = {"start_timeout_s": START_TIMEOUT_S}
    assert create(router, {"name": "one", "model_id": first, "options": options}).status_code == 201
    assert create(router, {"name": "two", "model_id": second, "options": options}).status_code == 201
    one, two = load(router, "one").json(), load(router, "two").json()
    assert one["state"] == two["state"] == "ready" and one["port"] != two["port"]
    secret = router.create_key("inference")[1]
    assert chat(router, secret, "one").json()["model"] == "one"
    assert chat(router, secret, "two").json()["model"] == "two"
    assert router.fetch(f"/api/models/{first}", "DELETE").status_code == 409
    r = router.fetch("/api/deployments/one", "DELETE")
    assert r.status_code == 200, r.text
    assert not alive(one["pid"])
    assert chat(router, secret, "one").status_code != 200
    assert chat(router, secret, "two").status_code == 200


def test_sigkill_of_vllm_use_takes_every_instance_with_it(router: Server) -> None:
    model_id = register(router, "alpha")
    options = {"start_timeout_s": START_TIMEOUT_S}
    pids = []
    for name in ("one", "two"):
        assert create(router, {"name": name, "model_id": model_id, "options": options}).status_code == 201
        pids.append(load(router, name).json()["pid"])
    assert all(alive(pid) for pid in pids)
    router.proc.kill()
    router.proc.wait(10)
    # Each instance's reaper sees its parent die and kills its group (docs/runtime.md).
    eventually(lambda: not any(alive(pid) for pid in pids), timeout=REAP_CAP_S)


def test_an_idle_instance_is_stopped_after_its_timeout_counted_from_its_last_request(tmp_path: Path) -> None:
    """The timer starts when the instance is ready and again when a request ends; a request in
    flight holds it off (the fake streams slowly here, for longer than the timeout)."""
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300, token_seconds=0.05)
    first = free_port()
    router = start_server(
        tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}"
    )
    try:
        model_id = register(router, "alpha")
        idle_s = 3
        options = {"start_timeout_s": START_TIMEOUT_S}
        body = {"name": "llama", "model_id": model_id, "idle_timeout_s": idle_s, "options": options}
        assert create(router, body).status_code == 201
        loaded = load(router, "llama").json()
        assert loaded["state"] == "ready" and loaded["idle_deadline"] is not None
        secret = router.create_key("inference")[1]
        # A stream that outlasts the timeout (300 pieces, 0.05 s apart): the instance stays while it runs.
        with streaming(router, secret, "llama") as chunks:
            instance = router.fetch("/api/deployments/llama").json()["instance"]
            assert instance["in_flight"] == 1 and instance["idle_deadline"] is None
            started = time.monotonic()
            for _ in chunks:
                if time.monotonic() - started > idle_s + 1:
                    break
            assert router.fetch("/api/deployments/llama").json()["instance"]["state"] == "ready"

        def idle_again() -> dict[str, Any] | None:
            instance = router.fetch("/api/deployments/llama").json()["instance"]
            return instance if instance["in_flight"] == 0 and instance["idle_deadline"] else None

        instance = eventually(idle_again, timeout=START_TIMEOUT_S)  # the client left: the relay ends
        assert instance["idle_deadline"] > instance["last_used"]

        def unloaded() -> bool:
            return router.fetch("/api/deployments/llama").json()["instance"]["state"] == "unloaded"

        eventually(unloaded, timeout=idle_s + TERM_GRACE_S + REAP_CAP_S)  # the timer, then the stop
        assert not alive(loaded["pid"])
    finally:
        router.stop()


def test_load_on_start_loads_at_boot_and_the_others_are_listed_unloaded(tmp_path: Path) -> None:
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300)
    first = free_port()
    flags = ("--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}")
    server = start_server(tmp_path / "data", *flags)
    try:
        model_id = register(server, "alpha")
        options = {"start_timeout_s": START_TIMEOUT_S}
        for name, at_start in (("boot", True), ("later", False)):
            body = {"name": name, "model_id": model_id, "load_on_start": at_start, "options": options}
            assert create(server, body).status_code == 201
    finally:
        server.stop()
    server = start_server(tmp_path / "data", *flags)
    try:

        def states() -> dict[str, str]:
            listed = server.fetch("/api/deployments").json()["deployments"]
            return {d["name"]: d["instance"]["state"] for d in listed}

        eventually(lambda: states() == {"boot": "ready", "later": "unloaded"}, timeout=START_TIMEOUT_S)
        secret = server.create_key("inference")[1]
        assert chat(server, secret, "boot").status_code == 200
        pid = server.fetch("/api/deployments/boot").json()["instance"]["pid"]
    finally:
        server.stop()
    assert not alive(pid)  # a clean stop of vllm-use stops its instances


# --- loading on demand -------------------------------------------------------------------------------


def test_a_request_for_an_unloaded_deployment_loads_it_and_waits_without_a_byte(tmp_path: Path) -> None:
    """Four requests at once for an unloaded deployment: one load (one vLLM started), all four
    answered once it is ready."""
    records = tmp_path / "records"
    records.mkdir()
    server = on_demand_server(tmp_path, load_seconds=2, record=str(records / "start-{pid}.json"))
    try:
        secret = deploy(server)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: chat(server, secret, "llama"), range(4)))
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert all(r.json()["model"] == "llama" for r in answers)
        assert len(list(records.glob("start-*.json"))) == 1
        instance = server.fetch("/api/deployments/llama").json()["instance"]
        assert instance["state"] == "ready" and instance["in_flight"] == 0
    finally:
        server.stop()


def test_no_autoload_answers_409_model_not_loaded(tmp_path: Path) -> None:
    server = on_demand_server(tmp_path, "--no-autoload")
    try:
        secret = deploy(server)
        r = chat(server, secret, "llama")
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_loaded", r.text
        assert server.fetch("/api/deployments/llama").json()["instance"]["state"] == "unloaded"
        assert load(server, "llama").status_code == 200
        assert chat(server, secret, "llama").status_code == 200
    finally:
        server.stop()


def test_a_load_longer_than_the_wait_is_503_with_retry_after_and_goes_on(tmp_path: Path) -> None:
    server = on_demand_server(tmp_path, "--load-wait-timeout", "1", load_seconds=4)
    try:
        secret = deploy(server)
        r = chat(server, secret, "llama")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        assert int(r.headers["retry-after"]) > 0
        # The load was not abandoned: a later request finds the instance ready.
        eventually(
            lambda: server.fetch("/api/deployments/llama").json()["instance"]["state"] == "ready",
            timeout=START_TIMEOUT_S,
        )
        assert chat(server, secret, "llama").status_code == 200
    finally:
        server.stop()


def test_max_waiting_holds_at_its_edge(tmp_path: Path) -> None:
    """--max-waiting 1: one request waits for the load, a second at the same time gets 503."""
    server = on_demand_server(tmp_path, "--max-waiting", "1", load_seconds=3)
    try:
        secret = deploy(server)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(chat, server, secret, "llama")
            eventually(
                lambda: server.fetch("/api/deployments/llama").json()["instance"]["state"] == "starting",
                timeout=START_TIMEOUT_S,
            )
            second = chat(server, secret, "llama")
            assert second.status_code == 503 and second.json()["error"]["code"] == "model_loading", (
                second.text
            )
            assert "retry-after" in second.headers
            assert first.result().status_code == 200
    finally:
        server.stop()
    zero = on_demand_server(tmp_path / "zero", "--max-waiting", "0")
    try:
        secret = deploy(zero)
        assert chat(zero, secret, "llama").status_code == 503  # none may wait: load it by hand
    finally:
        zero.stop()


def test_a_failed_load_is_a_502_without_vllms_lines(tmp_path: Path) -> None:
    server = on_demand_server(tmp_path, fail_on_start=1)
    try:
        secret = deploy(server)
        r = chat(server, secret, "llama")
        assert r.status_code == 502, r.text
        assert r.json()["error"]["message"] == "the model llama failed to load"
        instance = server.fetch("/api/deployments/llama").json()["instance"]
        assert instance["state"] == "failed" and instance["last_lines"]  # the operator sees them
    finally:
        server.stop()


# --- capacity -----------------------------------------------------------------------------------------


def test_max_loaded_one_evicts_the_idle_instance_and_a_request_waits_for_room(tmp_path: Path) -> None:
    # The default --load-wait-timeout (600 s): the wait below includes a start of vLLM.
    server = on_demand_server(tmp_path, "--max-loaded", "1", token_seconds=0.05)
    try:
        secret = deploy(server, "one")
        add_second(server)
        first = load(server, "one").json()
        assert first["state"] == "ready"
        # "two" is asked for: "one" is idle, so it is stopped (its whole group) and "two" loads.
        assert chat(server, secret, "two").status_code == 200
        assert states(server) == {"one": "unloaded", "two": "ready"}
        assert not alive(first["pid"])
        # While "two" streams it is not idle: a request for "one" waits for room, without a byte,
        # and gets it when the stream ends.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with streaming(server, secret, "two") as rest:
                waiting = pool.submit(chat, server, secret, "one")
                eventually(lambda: instance(server, "one")["waiting"] == 1, timeout=START_TIMEOUT_S)
                assert states(server) == {"one": "unloaded", "two": "ready"}
                assert instance(server, "two")["in_flight"] == 1 and not waiting.done()
                next(rest)  # still streaming
            answer = waiting.result(timeout=START_TIMEOUT_S)
        assert answer.status_code == 200, answer.text
        assert states(server) == {"one": "ready", "two": "unloaded"}
    finally:
        server.stop()


def test_a_pinned_instance_is_never_evicted_and_a_request_for_room_times_out(tmp_path: Path) -> None:
    """No room can come while "one" is pinned, so the short --load-wait-timeout only ends a wait
    that nothing would end; nothing starts within it."""
    server = on_demand_server(tmp_path, "--max-loaded", "1", "--load-wait-timeout", "2")
    try:
        secret = deploy(server, "one")
        add_second(server)
        assert load(server, "one").json()["state"] == "ready"
        assert server.fetch("/api/deployments/one", "PATCH", json={"pinned": True}).status_code == 200
        refused = chat(server, secret, "two")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_loading", refused.text
        assert "retry-after" in refused.headers
        assert instance(server, "two")["waiting"] == 0
        assert states(server) == {"one": "ready", "two": "unloaded"}
        # deployments.load does not wait for room: 503 at once, naming why.
        r = server.fetch("/api/deployments/two/load", "POST")
        assert r.status_code == 503 and "--max-loaded 1" in r.json()["error"]["message"], r.text
        # Unpinned, "one" is evicted for a load that waits as long as a start needs.
        assert server.fetch("/api/deployments/one", "PATCH", json={"pinned": False}).status_code == 200
        assert load(server, "two").json()["state"] == "ready"
        assert states(server) == {"one": "unloaded", "two": "ready"}
    finally:
        server.stop()


def add_second(server: Server) -> None:
    """A deployment "two" of a second model."""
    second = register(server, "beta")
    body = {"name": "two", "model_id": second, "options": {"start_timeout_s": START_TIMEOUT_S}}
    assert create(server, body).status_code == 201


def test_v1_models_lists_every_deployment_and_alias_and_never_loads_one(router: Server) -> None:
    vision = register(router, "vision")
    (router.data_dir / "models" / "vision" / "config.json").write_text(
        json.dumps({"max_position_embeddings": 4096, "vision_config": {"hidden_size": 8}})
    )
    plain = register(router, "plain")
    options = {"start_timeout_s": START_TIMEOUT_S}
    body = {"name": "see", "model_id": vision, "aliases": ["eyes"], "options": options}
    assert create(router, body).status_code == 201  # its card is read when it is saved
    body = {"name": "talk", "model_id": plain, "options": {**options, "max_model_len": 1024}}
    assert create(router, body).status_code == 201
    secret = router.create_key("inference")[1]

    def listed() -> dict[str, dict[str, Any]]:
        r = router.fetch("/v1/models", token=None, headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text
        return {entry["id"]: entry for entry in r.json()["data"]}

    models = listed()  # no vLLM runs at all
    assert set(models) == {"see", "eyes", "talk"}
    assert models["see"]["status"] == {"value": "unloaded"} and models["eyes"]["root"] == "see"
    assert models["see"]["max_model_len"] == 4096 and models["see"]["input_modalities"] == ["text", "image"]
    assert models["talk"]["max_model_len"] == 1024 and models["talk"]["input_modalities"] == ["text"]
    assert models["see"]["owned_by"] == "vllm-use" and isinstance(models["see"]["created"], int)
    instance = router.fetch("/api/deployments/see").json()["instance"]
    assert instance["state"] == "unloaded" and instance["last_used"] is None  # listing is not use

    assert load(router, "see").json()["state"] == "ready"
    before = router.fetch("/api/deployments/see").json()["instance"]
    assert listed()["see"]["status"] == {"value": "loaded"} and listed()["talk"]["status"] == {
        "value": "unloaded"
    }
    after = router.fetch("/api/deployments/see").json()["instance"]
    assert after["idle_deadline"] == before["idle_deadline"] and after["last_used"] == before["last_used"]


def test_a_conversation_id_naming_another_deployment_than_the_body_is_refused(router: Server) -> None:
    model_id = register(router, "alpha")
    options = {"start_timeout_s": START_TIMEOUT_S}
    for name, aliases in (("one", ["uno"]), ("two", [])):
        body = {"name": name, "model_id": model_id, "aliases": aliases, "options": options}
        assert create(router, body).status_code == 201
    secret = router.create_key("inference")[1]
    body = {"model": "one", "messages": [{"role": "user", "content": "hi"}], "stream": True}

    def send(conversation: str) -> Any:
        headers = {"Authorization": f"Bearer {secret}", "X-Conversation-Id": conversation}
        return router.fetch("/v1/chat/completions", "POST", json=body, token=None, headers=headers)

    refused = send("c1::two")
    assert refused.status_code == 400 and "same deployment" in refused.json()["error"]["message"], (
        refused.text
    )
    assert router.fetch("/api/deployments/one").json()["instance"]["state"] == "unloaded"  # nothing loaded
    assert send("c2::uno").status_code == 200  # an alias of the same deployment
    assert send("c3").status_code == 200


def test_a_change_to_a_loaded_deployment_applies_at_its_next_load(router: Server) -> None:
    model_id = register(router, "alpha")
    options = {"start_timeout_s": START_TIMEOUT_S}
    assert create(router, {"name": "llama", "model_id": model_id, "options": options}).status_code == 201
    assert load(router, "llama").json()["restart_required"] is False
    r = router.fetch("/api/deployments/llama", "PATCH", json={"options": {**options, "max_model_len": 1024}})
    assert r.status_code == 200 and r.json()["instance"]["restart_required"] is True, r.text
    assert router.fetch("/api/deployments/llama/unload", "POST").json()["restart_required"] is False
    reloaded = load(router, "llama").json()
    assert reloaded["state"] == "ready" and reloaded["restart_required"] is False


def test_an_instance_dying_mid_stream_ends_its_session_with_an_error_and_lookup_says_interrupted(
    tmp_path: Path,
) -> None:
    server = on_demand_server(tmp_path, token_seconds=0.05)
    try:
        secret = deploy(server, "llama")
        auth = {"Authorization": f"Bearer {secret}"}
        body = {
            "model": "llama",
            "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 400,
            "stream": True,
        }
        url = server.base_url + "/v1/chat/completions"
        headers = {**auth, "X-Conversation-Id": "dies::llama"}
        with server.client.stream("POST", url, json=body, headers=headers) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            received = next(chunks)
            os.kill(instance(server, "llama")["pid"], signal.SIGKILL)  # vLLM dies under the stream
            with contextlib.suppress(httpx.HTTPError):
                for chunk in chunks:
                    received += chunk
        assert b"upstream" in received.rsplit(b"data:", 1)[-1], received[-300:]
        r = server.fetch(
            "/v1/streams/lookup", "POST", json={"conversation_ids": ["dies"]}, token=None, headers=auth
        )
        (session,) = r.json()["sessions"]
        assert session["is_done"] is True and session["interrupted"] is True, session
        # A session that ends well is not interrupted.
        eventually(lambda: states(server)["llama"] == "failed", timeout=REAP_CAP_S)  # its death is seen
        assert chat(server, secret, "llama").status_code == 200  # loads it again
        quick = {**body, "messages": [{"role": "user", "content": "hi"}]}
        headers = {**auth, "X-Conversation-Id": "fine::llama"}
        assert (
            server.fetch("/v1/chat/completions", "POST", json=quick, token=None, headers=headers).status_code
            == 200
        )
        r = server.fetch(
            "/v1/streams/lookup", "POST", json={"conversation_ids": ["fine"]}, token=None, headers=auth
        )
        assert r.json()["sessions"][0]["interrupted"] is False
    finally:
        server.stop()


def test_runtime_switch_saves_a_deployment_and_runs_it_alone(tmp_path: Path) -> None:
    """runtime.* on top of deployments (docs/router.md, "runtime.* and deployments")."""
    runtime_port = free_port()
    server = on_demand_server(tmp_path, "--runtime-port", str(runtime_port), "--max-loaded", "4")
    try:
        secret = deploy(server, "other")  # an ordinary deployment, loaded on its own port
        assert load(server, "other").json()["state"] == "ready"
        gamma_id = register(server, "gamma")
        switch = f"/api/runtime/switch?wait={START_TIMEOUT_S}"
        r = server.fetch(switch, "POST", json={"model_id": gamma_id, "options": {"max_model_len": 512}})
        assert r.status_code == 200, r.text
        status = r.json()
        assert (
            status["state"] == "ready" and status["port"] == runtime_port and status["deployment"] == "gamma"
        )
        assert {i["name"]: i["state"] for i in status["instances"]} == {"gamma": "ready", "other": "unloaded"}
        saved = server.fetch("/api/deployments/gamma").json()
        assert saved["model_id"] == gamma_id and saved["options"] == {"max_model_len": 512}
        assert saved["instance"]["port"] == runtime_port and saved["instance"]["pid"] == status["pid"]
        assert chat(server, secret, "gamma").status_code == 200  # routed by name
        # Without options the saved ones stay; the runtime restarts it (a switch to it).
        r = server.fetch(switch, "POST", json={"model_id": gamma_id})
        assert r.json()["state"] == "ready" and r.json()["options"]["max_model_len"] == 512, r.text
        r = server.fetch(
            f"/api/runtime/restart?wait={START_TIMEOUT_S}", "POST", json={"options": {"max_model_len": 256}}
        )
        assert r.status_code == 200 and r.json()["deployment"] == "gamma", r.text
        assert server.fetch("/api/deployments/gamma").json()["options"] == {"max_model_len": 256}
        # A name taken by a deployment of another model is a conflict, and nothing stops.
        beta = register(server, "beta")
        r = server.fetch(switch, "POST", json={"model_id": beta, "options": {"served_model_name": "other"}})
        assert r.status_code == 409 and "other" in r.json()["error"]["message"], r.text
        assert states(server)["gamma"] == "ready"
        # Another switch takes the runtime: "gamma" is unloaded, an ordinary deployment from now.
        r = server.fetch(switch, "POST", json={"model_id": beta})
        assert r.json()["deployment"] == "beta" and r.json()["port"] == runtime_port, r.text
        assert states(server) == {"gamma": "unloaded", "beta": "ready", "other": "unloaded"}
        assert chat(server, secret, "gamma").status_code == 200  # autoloaded, on a port of its own
        assert instance(server, "gamma")["port"] != runtime_port
        # runtime.stop stops every vLLM.
        r = server.fetch("/api/runtime/stop", "POST")
        assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
        assert set(states(server).values()) == {"unloaded"}
        # A request for the runtime's deployment starts it on the runtime again.
        assert chat(server, secret, "beta").status_code == 200
        assert server.fetch("/api/runtime").json()["state"] == "ready"
    finally:
        server.stop()


def test_a_load_refused_for_good_is_the_requests_answer_at_once(tmp_path: Path) -> None:
    """A load that cannot begin for a reason no wait cures (the model's directory is gone) answers
    the request with that refusal (409), instead of waiting --load-wait-timeout for room."""
    server = on_demand_server(tmp_path, "--load-wait-timeout", "120")
    try:
        secret = deploy(server, "llama")
        shutil.rmtree(server.data_dir / "models" / "alpha")
        started = time.monotonic()
        r = chat(server, secret, "llama")
        assert r.status_code == 409 and "no longer a real directory" in r.text, r.text
        assert time.monotonic() - started < 120  # not the wait's end
        assert states(server) == {"llama": "unloaded"}
    finally:
        server.stop()


def test_an_unknown_model_is_404_model_not_found_in_the_callers_shape(tmp_path: Path) -> None:
    server = on_demand_server(tmp_path, "--model-aliases", "fast=llama")
    try:
        secret = deploy(server, "llama")
        auth = {"Authorization": f"Bearer {secret}"}
        r = chat(server, secret, "nope")
        assert r.status_code == 404, r.text
        assert (
            r.json()["error"]["code"] == "model_not_found"
            and "GET /v1/models" in r.json()["error"]["message"]
        )
        body = {"model": "nope", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        r = server.fetch("/v1/messages", "POST", json=body, token=None, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
        assert states(server) == {"llama": "unloaded"}  # nothing loaded for it
        # An alias of --model-aliases whose target is a deployment reaches that deployment.
        r = chat(server, secret, "fast")
        assert r.status_code == 200 and r.json()["model"] == "llama", r.text
    finally:
        server.stop()

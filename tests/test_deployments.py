"""Deployments as saved records (docs/router.md, "Deployments"): create, read, change and delete them
over /api and MCP, every rule checked at its edge, and each kept across a restart of vllm-use.

Loading, routing and idle handling come with instances (issue 14's later parts); these tests are
about what is saved.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Server, start_server
from vllm_use.deployments.records import ALIASES_MAX, IDLE_TIMEOUT_MAX_S, STOP_TIMEOUT_MAX_S


def register(server: Server, name: str) -> str:
    """A ready local model `name` (a directory with a config.json); its id."""
    directory = server.data_dir / "models" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "data", "--model-aliases", "fast=tiny")
    yield srv
    srv.stop()


@pytest.fixture
def model_id(server: Server) -> str:
    return register(server, "alpha")


def create(server: Server, body: dict[str, Any]) -> Any:
    return server.fetch("/api/deployments", "POST", json=body)


def names(server: Server) -> list[str]:
    r = server.fetch("/api/deployments")
    assert r.status_code == 200, r.text
    return [d["name"] for d in r.json()["deployments"]]


def test_a_deployment_is_saved_with_its_defaults_and_read_back(server: Server, model_id: str) -> None:
    r = create(server, {"name": "llama", "model_id": model_id, "options": {"max_model_len": 4096}})
    assert r.status_code == 201, r.text
    saved = r.json()
    assert {k: v for k, v in saved.items() if not k.endswith("_at")} == {
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
    server: Server, model_id: str, change: dict[str, Any], field: str | None
) -> None:
    r = create(server, {"name": "llama", "model_id": model_id, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_arguments"
    if field is not None:
        assert error["errors"][0]["loc"][0] == field, error
    assert names(server) == []


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


def test_trust_remote_code_needs_the_operators_consent(server: Server, model_id: str) -> None:
    r = create(server, {"name": "llama", "model_id": model_id, "options": {"trust_remote_code": True}})
    assert r.status_code == 400 and "--allow-remote-code" in r.json()["error"]["message"], r.text
    assert names(server) == []


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
        assert server.fetch("/api/deployments").json() == {"deployments": [first]}
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

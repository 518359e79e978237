"""`models.add` (POST /api/models, docs/models-and-downloads.md "Add model"): one step from a repository
name to a downloading model, checked against the hub before anything is saved (issue 17, finding 1).

A real `vllm-use serve` with the real `hf` CLI against `FakeHub` (tests/fakes/hub.py), which answers
model info, `auth-check` and downloads as the Hub does for missing, private and gated repositories.
One server and hub serve the whole module; each test uses its own repository names and looks only at
its own models.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.hub import FakeHub
from tests.support import deployments
from tests.support.server import Server, eventually, free_port, start_server

HF = str(Path(sys.executable).with_name("hf"))
CONFIG = b'{"model_type": "llama"}\n'
FILES = {"config.json": CONFIG, "model.safetensors": b"\1" * 4096}


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    with FakeHub() as running:
        yield running


@pytest.fixture(scope="module")
def server(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("add-model")
    running = start_server(
        root / "data", "--hf-bin", HF, env={"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hfhome")}
    )
    yield running
    running.stop()


def add(server: Server, **body: Any) -> Any:
    return server.fetch("/api/models", "POST", json=body)


def models_of(server: Server, repository: str) -> list[dict[str, Any]]:
    return [m for m in server.fetch("/api/models").json()["models"] if m["repository"] == repository]


def tasks_of(server: Server, repository: str) -> list[dict[str, Any]]:
    return [t for t in server.fetch("/api/downloads").json()["downloads"] if t["repository"] == repository]


def downloaded(server: Server, model_id: str) -> dict[str, Any]:
    def ready() -> Any:
        model = server.fetch(f"/api/models/{model_id}").json()["model"]
        assert model["status"] != "failed", model
        return model["status"] == "ready" and model

    return eventually(ready, timeout=60, interval=0.1)


def error_of(response: Any) -> tuple[str, list[list[str]]]:
    error = response.json()["error"]
    return error["message"], [e["loc"] for e in error.get("errors", [])]


def test_adding_a_repository_registers_it_and_downloads_it_at_once(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/found", FILES)

    r = add(server, source="acme/found")

    assert r.status_code == 201, r.text
    model, task = r.json()["model"], r.json()["task"]
    assert (model["repository"], model["revision"], model["name"]) == ("acme/found", "main", "acme/found")
    assert model["status"] == "downloading"
    assert task["model_id"] == model["id"] and task["status"] in ("pending", "running")
    done = downloaded(server, model["id"])
    assert (Path(done["path"]) / "config.json").read_bytes() == CONFIG
    assert [t["status"] for t in tasks_of(server, "acme/found")] == ["succeeded"]


def test_a_mistyped_repository_is_refused_before_anything_is_saved(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/tiny-chat", FILES)

    r = add(server, source="acme/tiny-chatt")

    assert r.status_code == 404, r.text
    message, locs = error_of(r)
    assert message.startswith("acme/tiny-chatt was not found on the hub (check the spelling")
    assert locs == [["source"]]
    assert models_of(server, "acme/tiny-chatt") == []
    assert tasks_of(server, "acme/tiny-chatt") == []


def test_a_gated_repository_needs_a_token_with_access(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/gated", FILES)
    hub.require_token("acme/gated", "hf_granted", gated=True)

    without = add(server, source="acme/gated")
    refused = add(server, source="acme/gated", token="hf_someone_else")

    assert without.status_code == 400, without.text
    message, locs = error_of(without)
    assert "acme/gated is gated" in message and "token" in message
    assert locs == [["token"]]
    assert refused.status_code == 400 and error_of(refused)[1] == [["token"]]
    assert models_of(server, "acme/gated") == []
    hub.reset_requests()
    granted = add(server, source="acme/gated", token="hf_granted")
    assert granted.status_code == 201, granted.text
    downloaded(server, granted.json()["model"]["id"])
    assert "Bearer hf_granted" in hub.authorizations()  # the check and the download used the token
    assert "hf_granted" not in server.fetch("/api/models").text


def test_a_private_repository_says_a_token_is_needed(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/private", FILES)
    hub.require_token("acme/private", "hf_mine")

    without = add(server, source="acme/private")
    wrong = add(server, source="acme/private", token="hf_wrong")

    assert without.status_code == 404, without.text
    assert "a private repository also needs a token" in error_of(without)[0]
    assert wrong.status_code == 400 and error_of(wrong) == (
        "the hub refused this token (invalid credentials); check it, or leave it empty for a public repository",
        [["token"]],
    )
    assert models_of(server, "acme/private") == []
    mine = add(server, source="acme/private", token="hf_mine")
    assert mine.status_code == 201, mine.text
    downloaded(server, mine.json()["model"]["id"])


def test_an_unknown_revision_is_refused_naming_the_revision(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/revisions", FILES)

    r = add(server, source="acme/revisions", revision="v9")

    assert r.status_code == 404, r.text
    assert error_of(r) == ("acme/revisions has no revision 'v9' on the hub", [["revision"]])
    assert models_of(server, "acme/revisions") == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": ""}, "source"),
        ({}, "source"),
        ({"source": "-acme/x"}, "source"),
        ({"source": "acme/x--y"}, "source"),
        ({"source": "acme/x", "revision": "has space"}, "revision"),
        ({"source": "acme/x", "revision": "-flag"}, "revision"),
        ({"source": "acme/x", "token": "with space"}, "token"),
        ({"source": "acme/x", "name": " "}, "name"),
        ({"source": "acme/x", "extra": 1}, "extra"),
        ({"source": "no-such-dir"}, "source"),
        ({"source": "../outside"}, "source"),
        ({"source": "a/b/c"}, "source"),
        ({"source": "somedir", "token": "hf_x"}, "token"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_changes(
    server: Server, hub: FakeHub, body: dict[str, Any], field: str
) -> None:
    before = server.fetch("/api/models").json()
    hub.reset_requests()

    r = add(server, **body)

    assert r.status_code == 400, r.text
    assert [field] in error_of(r)[1], r.text
    assert server.fetch("/api/models").json() == before
    assert hub.requests == []  # refused before the hub is asked


def test_a_directory_under_the_models_root_is_added_ready(server: Server) -> None:
    directory = server.data_dir / "models" / "handmade"
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(CONFIG)

    r = add(server, source="handmade")

    assert r.status_code == 201, r.text
    assert r.json()["task"] is None
    model = r.json()["model"]
    assert (model["source"], model["status"], model["name"], model["path"]) == (
        "local",
        "ready",
        "handmade",
        str(directory),
    )


def test_adding_a_registered_repository_again_is_refused_naming_it(server: Server, hub: FakeHub) -> None:
    hub.add_repo("acme/twice", FILES)
    first = add(server, source="acme/twice", name="Twice")
    assert first.status_code == 201, first.text
    downloaded(server, first.json()["model"]["id"])

    again = add(server, source="acme/twice")

    assert again.status_code == 409, again.text
    assert error_of(again)[0].startswith("acme/twice@main is already registered as Twice (downloaded)")
    assert len(models_of(server, "acme/twice")) == 1


def test_an_unreachable_hub_refuses_the_add_naming_it(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    server = start_server(tmp_path / "data", "--hf-bin", HF, env={"HF_ENDPOINT": nowhere})
    try:
        r = server.fetch("/api/models", "POST", json={"source": "acme/anything"})

        assert r.status_code == 502, r.text
        message = r.json()["error"]["message"]
        assert message.startswith(f"the Hugging Face Hub at {nowhere} could not be asked")
        assert "nothing was added" in message
        assert server.fetch("/api/models").json() == {"models": []}
        assert server.fetch("/api/downloads").json() == {"downloads": []}
    finally:
        server.stop()


def test_deleting_a_deployed_model_is_refused_naming_the_deployment_and_model(server: Server) -> None:
    model_id = deployments.register(server, "served-here")
    r = deployments.create(server, {"name": "team-chat", "model_id": model_id})
    assert r.status_code == 201, r.text

    refused = server.fetch(f"/api/models/{model_id}", "DELETE")

    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith("served-here is served by the deployment team-chat;")
    assert model_id not in message
    assert server.fetch(f"/api/models/{model_id}").status_code == 200

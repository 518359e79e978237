"""What the deployments' tests share (tests/test_deployments.py, tests/test_capacity.py,
tests/test_router_edges.py): a model to deploy, the calls to /api/deployments and /v1, and a server
whose deployments run the fake vLLM, on a machine without GPUs or with one (the fake NVML)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fakes import fake_vllm_bin
from tests.support.server import Server, free_port, start_server

START_TIMEOUT_S = 60  # the fake is healthy within a second; the bound only ends a hang

LONG = " ".join(["word"] * 300)  # the fake echoes it one piece per word: 300 pieces


def register(server: Server, name: str) -> str:
    """A ready local model `name` (a directory with a config.json); its id."""
    directory = server.data_dir / "models" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


def create(server: Server, body: dict[str, Any]) -> Any:
    return server.fetch("/api/deployments", "POST", json=body)


def load(server: Server, name: str) -> Any:
    return server.fetch(
        f"/api/deployments/{name}/load?wait={START_TIMEOUT_S}", "POST", timeout=START_TIMEOUT_S + 10
    )


def chat(server: Server, secret: str, model: str) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return server.fetch(
        "/v1/chat/completions", "POST", json=body, token=None, headers={"Authorization": f"Bearer {secret}"}
    )


@contextlib.contextmanager
def streaming(server: Server, secret: str, model: str) -> Iterator[Iterator[bytes]]:
    """A long stream from `model` (LONG echoed, one piece per word), open after its first chunk;
    yields the rest of its raw chunks. Keep them referenced: a dropped httpx `iter_raw` generator
    closes the stream."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 400,
        "stream": True,
    }
    url, auth = server.base_url + "/v1/chat/completions", {"Authorization": f"Bearer {secret}"}
    with server.client.stream("POST", url, json=body, headers=auth) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        next(chunks)
        yield chunks


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def on_demand_server(tmp_path: Path, *flags: str, **knobs: object) -> Server:
    vllm = fake_vllm_bin(tmp_path / "bin", max_lifetime=300, **knobs)
    first = free_port()
    return start_server(
        tmp_path / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 9}", *flags
    )


def deploy(server: Server, name: str = "llama") -> str:
    model_id = register(server, "alpha")
    body = {"name": name, "model_id": model_id, "options": {"start_timeout_s": START_TIMEOUT_S}}
    assert create(server, body).status_code == 201
    return server.create_key("inference")[1]


def add_deployment(server: Server, name: str, share: float | None = None, **fields: Any) -> None:
    """A deployment `name` of its own model `name`; `share`: its gpu_memory_utilization."""
    model_id = register(server, name)
    options: dict[str, Any] = {"start_timeout_s": START_TIMEOUT_S}
    if share is not None:
        options["gpu_memory_utilization"] = share
    r = create(server, {"name": name, "model_id": model_id, "options": options, **fields})
    assert r.status_code == 201, r.text


def states(server: Server) -> dict[str, str]:
    return {d["name"]: d["instance"]["state"] for d in server.fetch("/api/deployments").json()["deployments"]}


def instance(server: Server, name: str) -> dict[str, Any]:
    r = server.fetch(f"/api/deployments/{name}")
    assert r.status_code == 200, r.text
    return r.json()["instance"]

"""`deployments.logs` (docs/router.md, "Instances"): vLLM's output of a deployment's instance, bounded
as `runtime.logs` is, kept after the instance stops; none for a deployment never loaded."""

from __future__ import annotations

from pathlib import Path

from tests.support.deployments import START_TIMEOUT_S, create, deploy, load, on_demand_server, register
from tests.support.server import Server, eventually

TAIL_MAX = 100_000  # runtime.logs's bound (docs/runtime.md)


def lines(server: Server, name: str, query: str = "") -> list[str]:
    r = server.fetch(f"/api/deployments/{name}/logs{query}")
    assert r.status_code == 200, r.text
    return r.json()["lines"]


def test_logs_show_the_instance_output_within_the_tail_bounds(tmp_path: Path) -> None:
    server = on_demand_server(tmp_path)
    try:
        deploy(server, "llama")
        model_id = register(server, "beta")
        assert create(server, {"name": "idle", "model_id": model_id}).status_code == 201
        assert lines(server, "llama") == []  # saved, never loaded

        assert load(server, "llama").json()["state"] == "ready"
        # The pipe is read as the child writes: the line may land just after /health answered.
        eventually(lambda: any("Application startup complete" in line for line in lines(server, "llama")))
        everything = lines(server, "llama", f"?tail={TAIL_MAX}")
        assert any("Uvicorn running on http://" in line for line in everything), everything
        assert len(lines(server, "llama", "?tail=1")) == 1
        assert len(lines(server, "llama", "?tail=2")) == 2
        for bad in (0, TAIL_MAX + 1):
            r = server.fetch(f"/api/deployments/llama/logs?tail={bad}")
            assert r.status_code == 400 and "tail" in r.text, r.text
        # The bound is runtime.logs's, published as one schema.
        methods = {m["name"]: m for m in server.fetch("/api/methods").json()["methods"]}
        tail = methods["deployments.logs"]["input_schema"]["properties"]["tail"]
        assert tail == methods["runtime.logs"]["input_schema"]["properties"]["tail"]
        assert methods["deployments.logs"]["route"] == "GET /api/deployments/{name}/logs"

        # Another deployment's instance is another log; an unloaded one keeps its last start's.
        assert lines(server, "idle") == []
        r = server.fetch("/api/deployments/llama/unload", "POST", timeout=START_TIMEOUT_S)
        assert r.status_code == 200 and r.json()["state"] == "unloaded", r.text
        assert any("Application startup complete" in line for line in lines(server, "llama"))

        r = server.fetch("/api/deployments/nobody/logs")
        assert r.status_code == 404 and "nobody" in r.text, r.text
    finally:
        server.stop()

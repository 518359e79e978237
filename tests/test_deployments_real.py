"""Deployments with the real CPU build of vLLM serving the two tiny local models (docs/router.md, end to
end), in one scenario over two lifetimes of vllm-use on one data directory:

1. `--max-loaded 2`: a `/v1` request by name ("one") and one by alias ("second" of "two"), sent
   together, load both deployments; both instances are ready and alive at once, and each answers
   the `openai` SDK by its name. A clean stop of vllm-use stops both.
2. Started again on the same data with `--max-loaded 1`: "one" (`load_on_start`) becomes ready by
   itself and answers without a load call while "two" is listed `unloaded`; a request for "two"
   evicts "one" (its whole process group), and a SIGKILL of vllm-use leaves no process of any
   instance.

Slow on purpose: the file costs 4 vLLM starts, ~35 s each on 2 cores (the two started together take
as long as two in a row), ~60 s each when the machine is busy: two in the first lifetime, then "one"
at start and "two" evicting it. Fewer cannot cover it: two must be live at once, a restart must
start one by itself, and an eviction starts one beyond the limit.
"""

from __future__ import annotations

import concurrent.futures
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.real_vllm import (
    SETTLE_AFTER_TIMEOUT_S,
    STOP_BOUND_S,
    RealVllm,
    group_members,
    serving_real_vllm,
)
from tests.support.server import START_TIMEOUT_S, Server, eventually, free_port
from vllm_use.app import SHUTDOWN_GRACE_S
from vllm_use.runtime.supervisor import REAP_CAP_S

OPTIONS = {
    "dtype": "float32",
    "max_model_len": 512,
    "start_timeout_s": 300,
    "extra_args": [{"name": "--enforce-eager"}, {"name": "--kv-cache-memory-bytes", "values": ["64M"]}],
}
LOAD_WAIT_S = OPTIONS["start_timeout_s"]
# A start settles (ready or failed) within its start timeout and the failing of one that timed out.
SETTLE_S = OPTIONS["start_timeout_s"] + SETTLE_AFTER_TIMEOUT_S
GENERATE_S = 60  # 8 tokens of a tiny model on a busy 2-core machine: a few seconds
# A /v1 request that loads waits for room (stopping an idle instance), then for the load
# (--load-wait-timeout), then generates.
REQUEST_S = STOP_BOUND_S + LOAD_WAIT_S + GENERATE_S
# A clean stop of vllm-use stops the runtime's child (none here), then each instance in turn, each
# within the supervisor's stop bound, then closes connections (docs/router.md, "At start").
CLEAN_STOP_S = (1 + 2) * STOP_BOUND_S + SHUTDOWN_GRACE_S
# The whole scenario with each step at its bound; pytest's default (300 s) is about one start's.
SCENARIO_S = 2 * START_TIMEOUT_S + 2 * REQUEST_S + CLEAN_STOP_S + SETTLE_S + 3 * GENERATE_S + REAP_CAP_S


def serve_flags(first_port: int, max_loaded: int) -> tuple[str, ...]:
    return (
        "--runtime-ports",
        f"{first_port}-{first_port + 9}",
        "--max-loaded",
        str(max_loaded),
        "--load-wait-timeout",
        str(LOAD_WAIT_S),
    )


def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=server.create_key("inference")[1],
        base_url=server.base_url + "/v1",
        http_client=httpx.Client(trust_env=False, timeout=REQUEST_S),
        max_retries=0,
    )


def ask(client: openai.OpenAI, model: str, deployment: str | None = None) -> str | None:
    """Chat with `model` (a deployment's name, or an alias of `deployment`); vLLM answers as the name."""
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
    )
    assert reply.model == (deployment or model)
    return reply.choices[0].message.content


def instance(server: Server, name: str) -> dict[str, Any]:
    return server.fetch(f"/api/deployments/{name}").json()["instance"]


def alive(found: dict[str, Any]) -> set[str]:
    """The names of the processes of an instance's group; its pid among them, or an empty set."""
    members = dict(group_members(found["pgid"]))
    return set(members.values()) if found["pid"] in members else set()


def has_engine(names: set[str]) -> bool:
    return any(name.startswith("VLLM::EngineCor") for name in names)


def listed(client: openai.OpenAI) -> dict[str, str]:
    """`GET /v1/models` through the SDK: each name's status (docs/router.md)."""
    return {m.id: (m.model_extra or {})["status"]["value"] for m in client.models.list()}


@pytest.mark.timeout(SCENARIO_S)
def test_two_real_deployments_serve_at_once_then_one_loads_at_restart_is_evicted_and_dies_with_vllm_use(
    tmp_path: Path, real_vllm: RealVllm, tiny_models: tuple[Path, Path]
) -> None:
    first_port = free_port()
    models = dict(zip(("tiny-one", "tiny-two"), tiny_models, strict=True))

    # --- 1. two deployments loaded at once -------------------------------------------------------
    with serving_real_vllm(tmp_path, real_vllm, models, *serve_flags(first_port, 2)) as server:
        saved = {"one": {"load_on_start": True}, "two": {"aliases": ["second"]}}
        for name, fields in saved.items():
            r = server.fetch(
                "/api/models/local", "POST", json={"name": f"tiny-{name}", "path": f"tiny-{name}"}
            )
            assert r.status_code == 201, r.text
            body = {"name": name, "model_id": r.json()["model"]["id"], "options": OPTIONS, **fields}
            created = server.fetch("/api/deployments", "POST", json=body)
            assert created.status_code == 201, created.text
        client = sdk(server)
        # No vLLM runs yet: saving a deployment with load_on_start does not load it.
        assert listed(client) == {"one": "unloaded", "two": "unloaded", "second": "unloaded"}

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            answers = [pool.submit(ask, client, "one"), pool.submit(ask, client, "second", "two")]
            assert all(answer.result() is not None for answer in answers)  # each bounded by REQUEST_S

        one, two = instance(server, "one"), instance(server, "two")
        assert one["state"] == two["state"] == "ready", (one, two)
        assert one["port"] != two["port"] and one["pgid"] != two["pgid"]
        assert has_engine(alive(one)) and has_engine(alive(two)), (alive(one), alive(two))
        assert listed(client) == {"one": "loaded", "two": "loaded", "second": "loaded"}
        assert ask(client, "one") is not None and ask(client, "two") is not None
        # The same instances answered: none was stopped to make room (--max-loaded 2).
        assert (instance(server, "one")["pid"], instance(server, "two")["pid"]) == (one["pid"], two["pid"])
        assert has_engine(alive(one)) and has_engine(alive(two))

        assert server.stop(signal.SIGTERM, timeout=CLEAN_STOP_S) == 0, server.log()[-4000:]
    assert group_members(one["pgid"]) == [] and group_members(two["pgid"]) == []

    # --- 2. the same data started again: load_on_start, then eviction and SIGKILL ----------------
    # No models to copy: the data directory of the first lifetime is used as it was left.
    with serving_real_vllm(tmp_path, real_vllm, {}, *serve_flags(first_port, 1)) as server:
        client = sdk(server)
        assert {d["name"] for d in server.fetch("/api/deployments").json()["deployments"]} == {"one", "two"}

        def one_settled() -> dict[str, Any] | None:
            found = instance(server, "one")
            assert found["state"] in ("unloaded", "starting", "ready"), found  # not failed
            return found if found["state"] == "ready" else None

        one = eventually(one_settled, timeout=SETTLE_S, interval=0.5)  # loaded by itself
        assert instance(server, "two")["state"] == "unloaded"
        assert listed(client) == {"one": "loaded", "two": "unloaded", "second": "unloaded"}
        assert has_engine(alive(one)), alive(one)
        assert ask(client, "one") is not None  # no load call: the instance loaded at start answers
        assert instance(server, "one")["pid"] == one["pid"]

        assert ask(client, "two") is not None  # --max-loaded 1: "one" is idle, so it makes room
        assert instance(server, "one")["state"] == "unloaded"
        assert group_members(one["pgid"]) == []  # its whole tree is gone
        two = instance(server, "two")
        assert two["state"] == "ready" and has_engine(alive(two)), two

        server.stop(signal.SIGKILL)
        eventually(lambda: group_members(two["pgid"]) == [], timeout=REAP_CAP_S)

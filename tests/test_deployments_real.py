"""Deployments with the real CPU build of vLLM serving the two tiny local models (docs/router.md, end to
end): a `/v1` request by deployment name loads it, `--max-loaded 1` makes the second evict the first
(its whole process group), and a SIGKILL of vllm-use leaves no process of any instance.

Slow on purpose (each load starts a real engine, ~20-60 s on 2 cores): one scenario, two loads.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import openai

from tests.support.real_vllm import RealVllm, group_members, serving_real_vllm
from tests.support.server import eventually, free_port
from vllm_use.runtime.supervisor import REAP_CAP_S

OPTIONS = {
    "dtype": "float32",
    "max_model_len": 512,
    "start_timeout_s": 300,
    "extra_args": [{"name": "--enforce-eager"}, {"name": "--kv-cache-memory-bytes", "values": ["64M"]}],
}
LOAD_WAIT_S = OPTIONS["start_timeout_s"]


def test_two_real_deployments_load_on_demand_evict_each_other_and_die_with_vllm_use(
    tmp_path: Path, real_vllm: RealVllm, tiny_models: tuple[Path, Path]
) -> None:
    first_port = free_port()
    flags = ("--runtime-ports", f"{first_port}-{first_port + 9}", "--max-loaded", "1")
    flags += ("--load-wait-timeout", str(LOAD_WAIT_S))
    models = dict(zip(("tiny-one", "tiny-two"), tiny_models, strict=True))
    with serving_real_vllm(tmp_path, real_vllm, models, *flags) as server:
        for name in ("one", "two"):
            r = server.fetch(
                "/api/models/local", "POST", json={"name": f"tiny-{name}", "path": f"tiny-{name}"}
            )
            assert r.status_code == 201, r.text
            body = {"name": name, "model_id": r.json()["model"]["id"], "options": OPTIONS}
            assert server.fetch("/api/deployments", "POST", json=body).status_code == 201
        client = openai.OpenAI(
            api_key=server.create_key("inference")[1],
            base_url=server.base_url + "/v1",
            http_client=httpx.Client(trust_env=False, timeout=LOAD_WAIT_S + 60),
            max_retries=0,
        )
        assert {m.id for m in client.models.list()} == {"one", "two"}  # no vLLM runs yet

        def ask(model: str) -> str | None:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
            )
            assert reply.model == model
            return reply.choices[0].message.content

        assert ask("one") is not None  # loaded for this request
        one = server.fetch("/api/deployments/one").json()["instance"]
        assert one["state"] == "ready"
        names = {name for _, name in group_members(one["pgid"])}
        assert any(name.startswith("VLLM::EngineCor") for name in names), names

        assert ask("two") is not None  # --max-loaded 1: "one" is idle, so it makes room
        assert server.fetch("/api/deployments/one").json()["instance"]["state"] == "unloaded"
        assert group_members(one["pgid"]) == []  # its whole tree is gone
        two = server.fetch("/api/deployments/two").json()["instance"]
        assert two["state"] == "ready" and group_members(two["pgid"])

        server.stop(signal.SIGKILL)
        eventually(lambda: group_members(two["pgid"]) == [], timeout=REAP_CAP_S)

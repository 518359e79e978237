"""The runtime can't be turned against the machine (docs/runtime.md, docs/security.md).

Each test reproduces one way in that an outside review found, against a real `vllm-use serve` and the
fake vLLM (tests/fakes/vllm.py, which records its argv and environment): code or files through
`extra_args`, remote code and models outside the models root without the operator's consent, secrets
in the children's environment, an open `/v1` on the runtime's loopback port, a foreign process on
that port taken for vLLM, and a `vllm_use/` package planted in the server's working directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import fake_vllm_bin
from tests.support import REPO
from tests.support.real_vllm import group_alive, settle
from tests.support.server import ADMIN_TOKEN, Server, eventually, free_port, start_server

SECRETS = {
    "GITHUB_TOKEN": "ghp_reviewsecret0123456789abcdef",
    "AWS_SECRET_ACCESS_KEY": "aws-review-secret-0123456789",
    "HF_TOKEN": "hf_reviewsecret0123456789",
    "OPENAI_API_KEY": "sk-review-secret-0123456789",
    "VLLM_API_KEY": "outer-vllm-key-0123456789",
}


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """`launch(*flags, env=…, **knobs)`: a server supervising the fake vLLM, one model dir `alpha`."""
    started: list[Server] = []

    def make(*flags: str, env: dict[str, str] | None = None, **knobs: Any) -> Server:
        n = len(started)
        records = tmp_path / f"records{n}"
        records.mkdir()
        port = int(knobs.pop("runtime_port", 0) or free_port())
        fake = fake_vllm_bin(tmp_path / f"bin{n}", record=records / "{pid}.json", max_lifetime=120, **knobs)
        server = start_server(
            tmp_path / f"data{n}", "--vllm-bin", str(fake), "--runtime-port", str(port), *flags, env=env
        )
        server.runtime_port = port  # type: ignore[attr-defined]
        server.records = records  # type: ignore[attr-defined]
        model = server.data_dir / "models" / "alpha"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        started.append(server)
        return server

    yield make
    for server in started:
        if server.proc.poll() is None:
            server.fetch("/api/runtime/stop", "POST")
            server.stop()


def records(server: Any) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(server.records.iterdir())]


def register(server: Server, name: str = "alpha") -> str:
    r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


START_TIMEOUT_S = 60


def switch(server: Server, **options: Any) -> httpx.Response:
    """runtime.switch of `alpha`, waiting for its outcome (a 400 comes at once)."""
    body = {"model_id": register(server), "options": {"start_timeout_s": START_TIMEOUT_S, **options}}
    return settle(server, "/api/runtime/switch", body, start_timeout_s=START_TIMEOUT_S)


def start(server: Server, model: str) -> httpx.Response:
    body = {"options": {"model": model, "start_timeout_s": START_TIMEOUT_S}}
    return settle(server, "/api/runtime/start", body, start_timeout_s=START_TIMEOUT_S)


def assert_refused_before_any_process(server: Any, r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_arguments"
    for word in words:
        assert word in error["message"], error
    assert records(server) == []
    assert server.fetch("/api/runtime").json()["state"] == "stopped"


class Listener:
    """Another local process on the runtime's port: answers 200 `{}` to anything, records each request."""

    def __init__(self, port: int) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    held = Listener(free_port())
    yield held
    held.close()


# ---------------------------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("--tool-parser-plugin", ["/tmp/plugin.py"]),  # reproduced: the plugin ran before the model loaded
        ("--reasoning-parser-plugin", ["/tmp/plugin.py"]),
        ("--io-processor-plugin", ["plugin"]),
        ("--middleware", ["evil.App"]),
        ("--logits-processors", ["evil.Processor"]),
        ("--chat-template", ["/etc/passwd"]),
        ("--enable-log-requests", []),  # reproduced: every prompt in runtime.logs
        ("--enable-log-outputs", []),
        ("--log-config-file", ["/tmp/logging.json"]),
        ("--allowed-local-media-path", ["/"]),
        ("--ssl-keyfile", ["/tmp/key.pem"]),
        ("--uds", ["/tmp/vllm.sock"]),
        ("--hf-overrides", ['{"architectures": ["Evil"]}']),
        ("--compilation-config", ['{"level": 3}']),
        ("--download-dir", ["/etc"]),
        ("--api-key", ["chosen-key"]),
        ("--generation-config", ["/tmp"]),  # allowed, but only as auto or vllm
        ("--tokenizer-mode", ["custom"]),  # allowed, but only built-in tokenizers
        ("--kv-cache-memory-bytes", ["64M --trust-remote-code"]),  # reproduced: a 500 after vLLM started
        ("--kv-cache-memory-bytes", ["4GiB"]),  # not vLLM's syntax: it would fail after starting
        ("--attention-backend", ["vllm.evil:Backend"]),
    ],
)
def test_extra_args_outside_the_allow_list_are_refused_before_any_process_starts(
    launch: Callable[..., Server], name: str, values: list[str]
) -> None:
    server = launch()
    r = switch(server, extra_args=[{"name": name, "values": values}])
    assert_refused_before_any_process(server, r, name)


def test_the_allowed_flags_reach_vllm_as_flag_equals_value(launch: Callable[..., Server]) -> None:
    server = launch()
    extra = [
        {"name": "--enforce-eager"},
        {"name": "--kv-cache-memory-bytes", "values": ["64M"]},
        {"name": "--no-enable-chunked-prefill"},
        {"name": "--scheduling-policy", "values": ["priority"]},
        {"name": "--cpu-offload-gb", "values": ["1.5"]},
    ]
    r = switch(server, extra_args=extra)
    assert r.status_code == 200, r.text
    argv = records(server)[0]["argv"]
    assert argv[-5:] == [
        "--enforce-eager",
        "--kv-cache-memory-bytes=64M",
        "--no-enable-chunked-prefill",
        "--scheduling-policy=priority",
        "--cpu-offload-gb=1.5",
    ]


def test_the_published_schema_lists_the_allowed_flags(launch: Callable[..., Server]) -> None:
    server = launch()
    methods = {m["name"]: m for m in server.fetch("/api/methods").json()["methods"]}
    for method in ("runtime.start", "runtime.switch", "runtime.restart"):
        allowed = methods[method]["input_schema"]["$defs"]["ExtraArg"]["properties"]["name"]["enum"]
        assert {"--enforce-eager", "--kv-cache-memory-bytes"} <= set(allowed)
        assert not [f for f in allowed if "plugin" in f or "log-requests" in f or f == "--middleware"]


def test_trust_remote_code_needs_the_operators_allow_remote_code(launch: Callable[..., Server]) -> None:
    server = launch()
    r = switch(server, trust_remote_code=True)
    assert_refused_before_any_process(server, r, "--allow-remote-code")
    assert r.json()["error"]["errors"][0]["loc"] == ["options.trust_remote_code"]

    allowed = launch("--allow-remote-code")
    r = switch(allowed, trust_remote_code=True)
    assert r.status_code == 200, r.text
    assert "--trust-remote-code" in records(allowed)[0]["argv"]


def test_start_outside_the_models_root_needs_the_operators_allow_any_model_path(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    server = launch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    (server.data_dir / "models" / "link").symlink_to(elsewhere)
    for model in (
        "org/some-model",  # a Hub id: vLLM would fetch it
        str(elsewhere),
        str(server.data_dir / "models" / "link"),  # inside by name, outside in fact
        str(server.data_dir / "models" / ".." / ".." / "elsewhere"),
        "alpha",  # relative: to whatever directory vLLM runs in
        str(server.data_dir / "models"),  # the root itself is no model
    ):
        assert_refused_before_any_process(server, start(server, model), "--allow-any-model-path")

    inside = start(server, str(server.data_dir / "models" / "alpha"))
    assert inside.status_code == 200, inside.text

    allowed = launch("--allow-any-model-path")
    r = start(allowed, "org/some-model")
    assert r.status_code == 200, r.text
    assert records(allowed)[0]["argv"][2] == "org/some-model"


# ---------------------------------------------------------------------------------------------- children


def test_vllm_gets_an_allow_listed_environment_and_its_own_key(launch: Callable[..., Server]) -> None:
    kept = {"HF_ENDPOINT": "http://127.0.0.1:9", "VLLM_CPU_KVCACHE_SPACE": "1", "LC_ALL": "C.UTF-8"}
    dropped = {"PYTHONPATH": "/planted", "SOME_TOOL_SETTING": "x", "VLLM_USE_SOMETHING": "1"}
    server = launch(env={**SECRETS, **kept, **dropped})
    assert switch(server).status_code == 200
    env = records(server)[0]["env"]

    assert not [name for name, value in env.items() if value in SECRETS.values()]
    assert {name: env.get(name) for name in kept} == kept
    assert not set(dropped) & set(env)
    assert env["VLLM_API_KEY"] and env["VLLM_API_KEY"] != SECRETS["VLLM_API_KEY"]
    assert env["PYTHONUNBUFFERED"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"


def test_the_runtime_port_refuses_v1_without_the_childs_key(launch: Callable[..., Server]) -> None:
    server = launch()
    status = switch(server)
    assert status.status_code == 200, status.text
    url = f"http://127.0.0.1:{server.runtime_port}"  # type: ignore[attr-defined]
    (record,) = records(server)
    child_key = record["env"]["VLLM_API_KEY"]

    with httpx.Client(timeout=10, trust_env=False) as direct:
        assert direct.get(url + "/v1/models").status_code == 401
        assert direct.get(url + "/v1/models", headers={"Authorization": "Bearer guess"}).status_code == 401
        assert (
            direct.get(url + "/v1/models", headers={"Authorization": f"Bearer {child_key}"}).status_code
            == 200
        )
    _, key = server.create_key("inference")
    assert server.fetch("/v1/models", token=key).status_code == 200  # the gateway injects the child's key

    shown = [
        status.text,
        server.fetch("/api/runtime").text,
        server.fetch("/api/runtime/logs").text,
        server.fetch("/api/system").text,
        json.dumps(record["argv"]),
        server.log(),
    ]
    assert not [text for text in shown if child_key in text]


def test_the_gateway_sends_nothing_to_the_runtime_port_when_no_model_is_ready(
    launch: Callable[..., Server], listener: Listener
) -> None:
    port = listener.server.server_address[1]
    server = launch(runtime_port=port, fail_on_start=1)
    _, key = server.create_key("inference")
    body = {"model": "alpha", "messages": [{"role": "user", "content": "a prompt for nobody"}]}

    stopped = server.fetch("/v1/chat/completions", "POST", json=body, token=key)
    assert stopped.status_code == 502, stopped.text
    assert "no model is running" in stopped.json()["error"]["message"]

    failed = switch(server)  # vLLM dies while loading: the runtime is `failed`
    assert failed.status_code == 502
    # "alpha" is a deployment now (runtime.switch saved it): asking for it loads it again, which
    # fails again; the answer says so and nothing went to the port's foreign listener.
    after = server.fetch("/v1/chat/completions", "POST", json=body, token=key)
    assert after.status_code == 502 and "alpha failed to load" in after.json()["error"]["message"]
    assert not [r for r in listener.requests if r[1].startswith("/v1")]


def test_a_foreign_listener_on_the_runtime_port_fails_the_start(
    launch: Callable[..., Server], listener: Listener
) -> None:
    port = listener.server.server_address[1]
    # The fake takes 60 s to bind (the real one imports for ~10 s): the listener answers /health first.
    server = launch(runtime_port=port, import_seconds=60)
    r = switch(server)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "runtime_failed"
    assert f"port {port} is held by another process" in error["message"]
    status = server.fetch("/api/runtime").json()
    assert status["state"] == "failed" and f"port {port}" in status["error"]
    assert not group_alive(status["pgid"])  # reaped before the failure was published

    _, key = server.create_key("inference")
    listed = server.fetch("/v1/models", token=key)  # vllm-use answers: "alpha" is a deployment now
    assert listed.status_code == 200 and listed.json()["data"][0]["status"] == {"value": "failed"}, (
        listed.text
    )
    assert {path for _, path, _ in listener.requests} <= {"/health"}  # no prompt and no key went there
    assert all(auth is None for _, _, auth in listener.requests)


PLANTED_REAPER = """
import pathlib
pathlib.Path({marker!r}).write_text("planted code ran")
raise SystemExit(1)
"""


def test_a_vllm_use_package_planted_in_the_servers_directory_never_runs(tmp_path: Path) -> None:
    planted, marker = tmp_path / "workdir", tmp_path / "marker"
    (planted / "vllm_use" / "runtime").mkdir(parents=True)
    (planted / "vllm_use" / "__init__.py").write_text("")
    (planted / "vllm_use" / "runtime" / "__init__.py").write_text("")
    (planted / "vllm_use" / "runtime" / "reaper.py").write_text(PLANTED_REAPER.format(marker=str(marker)))
    data = tmp_path / "data"
    (data / "models" / "alpha").mkdir(parents=True)
    (data / "models" / "alpha" / "config.json").write_text("{}")
    server = serve_from(planted, data, "--vllm-bin", str(fake_vllm_bin(tmp_path / "bin")))
    try:
        r = switch(server)
        assert r.status_code == 200, r.text
        assert not marker.exists()
        server.fetch("/api/runtime/stop", "POST")
    finally:
        server.stop()


def serve_from(workdir: Path, data: Path, *flags: str) -> Server:
    """`vllm-use serve` started in `workdir`, as an installed server would be: the directory is not on
    its own `sys.path` (`-I`), but it is its working directory, inherited by default by its children."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    env.update(VLLM_USE_ADMIN_TOKEN=ADMIN_TOKEN, VLLM_USE_LOG_LEVEL="info")
    cmd = [sys.executable, "-I", "-m", "vllm_use", "serve", "--port", str(port), "--data-dir", str(data)]
    cmd += ["--runtime-port", str(free_port()), *flags]
    log_path = data.parent / f"server-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    server = Server(f"http://127.0.0.1:{port}", data, log_path, proc)

    def healthy() -> bool:
        assert proc.poll() is None, server.log()
        try:
            return server.client.get(server.base_url + "/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(healthy, timeout=20)
    except AssertionError:
        server.stop(signal.SIGKILL)
        raise
    assert Path(os.readlink(f"/proc/{proc.pid}/cwd")) == workdir
    assert REPO != workdir
    return server

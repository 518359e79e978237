"""`tests/fakes/vllm.py` behaves like the real CPU vLLM as recorded in docs/vllm-facts.md.

The supervisor's unit tests rely on this fake, so these tests pin the behaviours that matter to it: the
version line, a closed port while loading (connection refused, not 503), `/health` 200 once ready, OpenAI
shapes, SIGTERM → exit 0, children in the same process group that outlive a SIGKILL of the main pid, the
record file, the failure knobs, the engine dying mid-stream and uvicorn's keep-alive. Its HTTP shapes
are compared with the real vLLM's by tests/test_fakes_match_vllm.py. Every process is started in its own
session and its group is killed at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FAKE_VLLM
from tests.support.server import eventually, free_port
from vllm_use.gateway.upstream import IDLE_TIMEOUT_S

FAKE = str(FAKE_VLLM)
POOL_IDLE_S = IDLE_TIMEOUT_S


@dataclass
class Fake:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    record: Path
    model: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def rec(self) -> dict[str, Any]:
        return json.loads(self.record.read_text())

    def phase(self) -> str | None:
        return self.rec()["phase"] if self.record.exists() else None

    def wait_ready(self, timeout: float = 10.0) -> None:
        eventually(lambda: self.phase() == "ready" or self.proc.poll() is not None, timeout)
        assert self.proc.poll() is None, self.text()


def port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def alive(pid: int) -> bool:
    """Running, not a zombie (PID 1 of a container may never reap the orphans we make)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10, trust_env=False) as c:
        yield c


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "tiny"
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048})
    )
    return d


@pytest.fixture
def launch(tmp_path: Path, model_dir: Path) -> Iterator[Callable[..., Fake]]:
    started: list[Fake] = []

    def start(
        *flags: str,
        model: str | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        load: float = 0.05,
        stderr_apart: bool = False,
    ) -> Fake:
        n = len(started)
        port = port or free_port()
        log, record = tmp_path / f"fake{n}.log", tmp_path / f"fake{n}.json"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_VLLM_", "VLLM_"))}
        child_env.update(
            FAKE_VLLM_RECORD=str(record), FAKE_VLLM_LOAD_SECONDS=str(load), FAKE_VLLM_MAX_LIFETIME="60"
        )
        child_env.update(env or {})
        model = str(model_dir) if model is None else model
        argv = [FAKE, "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags]
        with open(log, "wb") as out:
            err_target: Any = subprocess.STDOUT
            if stderr_apart:
                err_target = open(tmp_path / f"fake{n}.err", "wb")
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err_target,
                    env=child_env,
                    start_new_session=True,
                )
            finally:
                if stderr_apart:
                    err_target.close()
        fake = Fake(proc, port, log, record, model)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        pgid = fake.proc.pid  # start_new_session: the group is the main pid, even after it died
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        fake.proc.wait(5)


def test_version_runs_as_an_executable() -> None:
    assert os.access(FAKE, os.X_OK)
    assert Path(FAKE).read_text().startswith("#!/usr/bin/env python3\n")
    done = subprocess.run([FAKE, "--version"], capture_output=True, timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"0.32.0+fake\n", b"")


def test_port_is_refused_while_loading_then_health_is_200(
    launch: Callable[..., Fake], client: httpx.Client
) -> None:
    fake = launch("--served-model-name", "tiny", load=1.0)
    eventually(lambda: "Initializing a V1 LLM engine" in fake.text(), 5)
    assert fake.rec()["phase"] == "loading"
    assert port_closed(fake.port)  # connection refused, not a 503
    fake.wait_ready()
    assert "Application startup complete." in fake.text()
    assert f"Uvicorn running on http://127.0.0.1:{fake.port}" in fake.text()
    health = client.get(fake.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert client.get(fake.url + "/version").json() == {"version": "0.32.0+fake"}
    assert fake.rec()["phase"] == "ready"
    assert '"GET /health HTTP/1.1" 200 OK' in eventually(lambda: "/health" in fake.text() and fake.text())


def test_models_and_chat_completions(
    launch: Callable[..., Fake], client: httpx.Client, model_dir: Path
) -> None:
    fake = launch("--served-model-name", "tiny", "alias", "--max-model-len", "512")
    fake.wait_ready()
    models = client.get(fake.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny", "alias"]
    first = models["data"][0]
    assert (first["object"], first["owned_by"], first["root"], first["max_model_len"]) == (
        "model",
        "vllm",
        str(model_dir),
        512,
    )

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there world"}]}
    chat = client.post(fake.url + "/v1/chat/completions", json=body).json()
    assert chat["object"] == "chat.completion" and chat["model"] == "tiny"
    assert chat["choices"][0]["message"] == chat["choices"][0]["message"] | {
        "role": "assistant",
        "content": "Echo: hello there world",
    }
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"]["completion_tokens"] == 4
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 4
    short = client.post(fake.url + "/v1/chat/completions", json=body | {"max_tokens": 2}).json()
    assert (short["choices"][0]["message"]["content"], short["choices"][0]["finish_reason"]) == (
        "Echo: hello ",
        "length",
    )

    stream = body | {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", fake.url + "/v1/chat/completions", json=stream) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "tiny" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Echo: hello there world"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4

    completion = client.post(
        fake.url + "/v1/completions", json={"model": "alias", "prompt": "one two"}
    ).json()
    assert (completion["object"], completion["choices"][0]["text"]) == ("text_completion", "Echo: one two")

    missing = client.post(fake.url + "/v1/chat/completions", json=body | {"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    too_long = client.post(fake.url + "/v1/chat/completions", json=body | {"max_tokens": 10_000})
    assert too_long.status_code == 400
    assert "cannot be greater than max_model_len=512" in too_long.json()["error"]["message"]
    cut = client.post(fake.url + "/v1/chat/completions", json=body | {"max_tokens": 512}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"  # not over max_model_len: accepted, as vLLM 0.32
    assert client.post(fake.url + "/v1/chat/completions", content=b"{").status_code == 400
    assert client.get(fake.url + "/v1/embeddings").status_code == 404


def test_sigterm_exits_0_and_takes_the_children_along(
    launch: Callable[..., Fake], client: httpx.Client
) -> None:
    fake = launch(env={"FAKE_VLLM_SPAWN_CHILDREN": "2"})
    fake.wait_ready()
    children = [c["pid"] for c in fake.rec()["children"]]
    assert len(children) == 2 and all(alive(pid) for pid in children)
    fake.proc.send_signal(signal.SIGTERM)  # the main pid only, as in docs/vllm-facts.md
    assert fake.proc.wait(3) == 0
    assert "Shutting down" in fake.text()
    assert not any(alive(pid) for pid in children)
    assert fake.rec()["exit_reason"] == "signal SIGTERM"


def test_group_sigterm_while_loading_exits_0(launch: Callable[..., Fake]) -> None:
    fake = launch(load=30, env={"FAKE_VLLM_SPAWN_CHILDREN": "1"})
    eventually(lambda: fake.phase() == "loading", 5)
    [child] = fake.rec()["children"]
    assert child["name"] == "VLLM::EngineCore" and alive(child["pid"])
    os.killpg(fake.proc.pid, signal.SIGTERM)
    assert fake.proc.wait(3) == 0
    assert not alive(child["pid"])


def test_ignore_sigterm_needs_sigkill(launch: Callable[..., Fake], client: httpx.Client) -> None:
    fake = launch(env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    fake.wait_ready()
    os.killpg(fake.proc.pid, signal.SIGTERM)
    time.sleep(0.4)
    assert fake.proc.poll() is None
    assert client.get(fake.url + "/health").status_code == 200
    assert "ignoring SIGTERM" in fake.text()
    os.killpg(fake.proc.pid, signal.SIGKILL)
    assert fake.proc.wait(3) == -signal.SIGKILL


def test_children_share_the_group_and_outlive_a_sigkill_of_the_main_pid(launch: Callable[..., Fake]) -> None:
    fake = launch(env={"FAKE_VLLM_SPAWN_CHILDREN": "2"})
    fake.wait_ready()
    children = fake.rec()["children"]
    assert [c["name"] for c in children] == ["VLLM::EngineCore", "VLLM::Worker"]
    for c in children:
        assert os.getpgid(c["pid"]) == fake.proc.pid and os.getsid(c["pid"]) == fake.proc.pid
        assert Path(f"/proc/{c['pid']}/comm").read_text().strip() == c["name"][:15]
        assert Path(f"/proc/{c['pid']}/cmdline").read_bytes().split(b"\0")[0] == c["name"].encode()
    fake.proc.kill()  # SIGKILL to the main pid only: the real one orphans EngineCore and Worker
    assert fake.proc.wait(3) == -signal.SIGKILL
    time.sleep(0.3)
    assert all(alive(c["pid"]) for c in children)
    os.killpg(fake.proc.pid, signal.SIGTERM)  # the group outlives its leader
    eventually(lambda: not any(alive(c["pid"]) for c in children), 5)


def test_record_holds_argv_env_and_process_ids(launch: Callable[..., Fake], model_dir: Path) -> None:
    flags = [
        "--served-model-name", "tiny", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5",
        "--max-model-len", "1k", "--dtype", "float32", "--enable-prefix-caching", "--trust-remote-code",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--kv-cache-memory-bytes", "64M",
        "--no-enforce-eager", "--speculative-config", '{"n": 1}', "--some-switch", "--x=y",
    ]  # fmt: skip
    fake = launch(*flags, env={"CUDA_VISIBLE_DEVICES": "1,0", "HF_TOKEN": "hf_secret"})
    fake.wait_ready()
    rec = fake.rec()
    assert rec["argv"] == [
        FAKE,
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(fake.port),
        *flags,
    ]
    assert rec["pid"] == rec["pgid"] == rec["sid"] == fake.proc.pid
    assert rec["env"]["CUDA_VISIBLE_DEVICES"] == "1,0" and rec["env"]["HF_TOKEN"] == "hf_secret"
    args = rec["args"]
    assert args["served_model_name"] == ["tiny"] and args["tensor_parallel_size"] == 2
    assert (args["gpu_memory_utilization"], args["max_model_len"], args["dtype"]) == (0.5, 1000, "float32")
    assert args["enable_prefix_caching"] is True and args["trust_remote_code"] is True
    assert args["enforce_eager"] is False and args["kv_cache_memory_bytes"] == 64 * 1024 * 1024
    assert rec["extra_args"] == [
        {"name": "--speculative-config", "values": ['{"n": 1}']},
        {"name": "--some-switch", "values": []},
        {"name": "--x", "values": ["y"]},
    ]
    assert set(rec["open_fds"]) >= {"0", "1", "2"}
    assert int(rec["signal_masks"]["SigIgn"], 16) & (1 << (signal.SIGTERM - 1)) == 0


def test_missing_local_path_exits_1(launch: Callable[..., Fake], tmp_path: Path) -> None:
    fake = launch(model=str(tmp_path / "nope"), load=0)
    assert fake.proc.wait(5) == 1
    assert "Invalid repository ID or local directory specified" in fake.text()
    assert port_closed(fake.port)
    assert fake.rec()["exit_reason"] == "model_path"


def test_port_in_use_exits_1(launch: Callable[..., Fake]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        fake = launch(port=s.getsockname()[1])
        assert fake.proc.wait(5) == 1
    assert "Address already in use" in fake.text()


def test_config_errors_like_the_real_one(launch: Callable[..., Fake]) -> None:
    tool_choice = launch("--enable-auto-tool-choice")
    memory = launch("--gpu-memory-utilization", "1.5")
    dtype = launch("--dtype", "int3")
    strict = launch("--made-up", "1", env={"FAKE_VLLM_STRICT": "1"})
    assert tool_choice.proc.wait(5) == 1
    assert "--enable-auto-tool-choice requires --tool-call-parser" in tool_choice.text()
    assert memory.proc.wait(5) == 1
    assert dtype.proc.wait(5) == 2 and "invalid choice: 'int3'" in dtype.text()
    assert dtype.rec()["exit_code"] == 2
    assert strict.proc.wait(5) == 2
    assert "unrecognized arguments: --made-up 1" in strict.text()


def test_never_healthy_modes(launch: Callable[..., Fake], client: httpx.Client) -> None:
    unhealthy = launch(env={"FAKE_VLLM_NEVER_HEALTHY": "503"})
    closed = launch(env={"FAKE_VLLM_NEVER_HEALTHY": "closed"})
    unhealthy.wait_ready()
    assert client.get(unhealthy.url + "/health").status_code == 503
    assert client.get(unhealthy.url + "/v1/models").status_code == 200
    eventually(lambda: "still loading" in closed.text(), 5)
    time.sleep(0.2)
    assert port_closed(closed.port) and closed.proc.poll() is None


def test_exit_after_and_fail_on_start(launch: Callable[..., Fake], client: httpx.Client) -> None:
    dies = launch(env={"FAKE_VLLM_EXIT_AFTER": "0.6", "FAKE_VLLM_EXIT_CODE": "3"}, stderr_apart=True)
    fails = launch(env={"FAKE_VLLM_FAIL_ON_START": "7"}, load=0.4, stderr_apart=True)
    dies.wait_ready()
    assert client.get(dies.url + "/health").status_code == 200
    assert dies.proc.wait(5) == 3
    assert "FAKE_VLLM_EXIT_AFTER" in (dies.log.with_suffix(".err")).read_text().splitlines()[-1]
    assert fails.proc.wait(5) == 7
    last = fails.log.with_suffix(".err").read_text().splitlines()[-1]
    assert last.startswith("RuntimeError: Engine core initialization failed")
    assert "Uvicorn running" not in fails.log.with_suffix(".err").read_text()


def test_long_lines_alternate_between_stdout_and_stderr(launch: Callable[..., Fake]) -> None:
    env = {"FAKE_VLLM_LINES": "5", "FAKE_VLLM_LINE_BYTES": "70000", "FAKE_VLLM_LINE_FILL": "é"}
    fake = launch(env=env, stderr_apart=True)
    fake.wait_ready()
    err = fake.log.with_suffix(".err").read_bytes().split(b"\n")
    out = fake.log.read_bytes().split(b"\n")
    ours_out = [line for line in out if line.startswith(b"fake line ")]
    ours_err = [line for line in err if line.startswith(b"fake line ")]
    assert [line[:16] for line in ours_out] == [b"fake line 000000", b"fake line 000002"]
    assert [line[:16] for line in ours_err] == [b"fake line 000001", b"fake line 000003", b"fake line 000004"]
    assert all(len(line) == 70000 for line in ours_out + ours_err)
    assert b"FAKE_VLLM_LAST_LINE" in ours_err[-1] and ours_err[-1].decode("utf-8").count("é") > 30000


def test_api_key_guards_v1_only(launch: Callable[..., Fake], client: httpx.Client) -> None:
    fake = launch("--api-key", "k-123")
    fake.wait_ready()
    assert client.get(fake.url + "/v1/models").status_code == 401
    assert client.get(fake.url + "/v1/models", headers={"Authorization": "Bearer k-123"}).status_code == 200
    assert client.get(fake.url + "/health").status_code == 200


def test_client_disconnect_is_logged_as_an_abort(launch: Callable[..., Fake], client: httpx.Client) -> None:
    fake = launch(env={"FAKE_VLLM_TOKEN_SECONDS": "0.05"})
    fake.wait_ready()
    body = {"model": fake.model, "messages": [{"role": "user", "content": "w " * 200}], "stream": True}
    with client.stream("POST", fake.url + "/v1/chat/completions", json=body) as r:
        next(r.iter_lines())
    eventually(lambda: "Aborted request chatcmpl-" in fake.text(), 5)


def test_engine_death_mid_stream_is_an_in_band_error_then_exit_0(
    launch: Callable[..., Fake], client: httpx.Client
) -> None:
    """FAKE_VLLM_ENGINE_DIES=2: two pieces, then what vLLM 0.32 sends when its EngineCore dies
    (tests/fakes/shapes.py), a clean end, and the server exits 0."""
    fake = launch(env={"FAKE_VLLM_ENGINE_DIES": "2", "FAKE_VLLM_TOKEN_SECONDS": "0"})
    fake.wait_ready()
    body = {"model": fake.model, "messages": [{"role": "user", "content": "w " * 20}], "stream": True}
    with client.stream("POST", fake.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line]
    assert [json.loads(e.removeprefix("data: "))["choices"][0]["delta"] for e in events[:3]] == [
        {"role": "assistant", "content": ""},
        {"content": "Echo: "},
        {"content": "w "},
    ]
    assert json.loads(events[3].removeprefix("data: ")) == {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    assert events[4:] == ["data: [DONE]"]
    assert fake.proc.wait(5) == 0
    assert fake.rec()["exit_reason"] == "engine_died"
    assert "Finished server process" in fake.text()


def test_an_idle_connection_is_closed_after_a_response_a_fresh_one_is_not(
    launch: Callable[..., Fake],
) -> None:
    """uvicorn's keep-alive (measured on vLLM by tests/test_fakes_match_vllm.py): closed 5 s after the
    last response; a connection that has not asked anything yet is left open."""
    fake = launch()
    fake.wait_ready()
    fresh = socket.create_connection(("127.0.0.1", fake.port), timeout=10)
    used = socket.create_connection(("127.0.0.1", fake.port), timeout=10)
    sent = time.monotonic()  # the answer, and the idle time, come after: noise only makes it later
    used.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:  # /health: a head and an empty body
        answer += used.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200 ")
    used.settimeout(30)
    assert used.recv(1) == b""  # EOF: the server closed it
    assert time.monotonic() - sent >= POOL_IDLE_S  # not before the gateway's pool lets go of it
    fresh.setblocking(False)
    with pytest.raises(BlockingIOError):  # still open, nothing to read
        fresh.recv(1)
    fresh.close()
    used.close()

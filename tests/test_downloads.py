"""Downloads end to end (docs/models-and-downloads.md): a real `vllm-use serve` drives the real `hf` CLI
against `FakeHub`.

Every test starts its own server with `--hf-bin` set to this venv's `hf` and `HF_ENDPOINT` pointing at a
fake hub, so nothing reaches the internet. Processes are observed through /proc: the `hf` child is
found by its `--local-dir <models-dir>/<model-id>` argument.

Facts about the CLI these tests rely on (see tests/test_fakehub.py): bytes reach the disk in 10 MiB
chunks, so a file needs more than 10 MiB for a partial size to be visible; an LFS file
(`.safetensors`) is fetched through the hub's CDN redirect; `hf` keeps its bookkeeping in
`<local-dir>/.cache/huggingface/` (`download/<file>.metadata`, `trees/<sha>.json`, `.gitignore`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.hub import FakeHub
from tests.support.server import ADMIN_TOKEN, Server, eventually, start_server
from vllm_use.app import SHUTDOWN_GRACE_S
from vllm_use.downloads.manager import REAP_CAP_S, TERM_GRACE_S

HF = str(Path(sys.executable).with_name("hf"))
MiB = 1024 * 1024
KiB = 1024
REPO = "org/tiny"
CONFIG = b'{"model_type": "llama"}\n'
FINISHED = ("succeeded", "failed", "canceled")

Launch = Callable[..., Server]


# --- fixtures and helpers -------------------------------------------------------------------------------


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    """The shared `fake_hub` fixture (tests/conftest.py), under a shorter name."""
    return fake_hub


def hub_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hfhome")}


@pytest.fixture
def launch(tmp_path: Path, hub: FakeHub) -> Iterator[Launch]:
    """`launch(*flags, hf_bin=...)` starts a server on tmp_path/"data" (the same dir on every call)."""
    started: list[Server] = []

    def _launch(*flags: str, hf_bin: str = HF) -> Server:
        server = start_server(tmp_path / "data", "--hf-bin", hf_bin, *flags, env=hub_env(hub, tmp_path))
        started.append(server)
        return server

    yield _launch
    for server in started:  # the tests stop their servers; this only catches a failed assertion
        if server.proc.poll() is None:
            try:
                server.stop(signal.SIGTERM)
            except subprocess.TimeoutExpired:
                server.stop(signal.SIGKILL)
    for pid in pids_mentioning(str(tmp_path)):  # hf children a dead server left behind
        kill_quietly(pid)


def register(server: Server, repository: str = REPO) -> str:
    r = server.fetch("/api/models/huggingface", "POST", json={"repository": repository})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


def start(server: Server, model_id: str, **extra: Any) -> dict[str, Any]:
    r = server.fetch("/api/downloads", "POST", json={"model_id": model_id, **extra})
    assert r.status_code == 201, r.text
    return r.json()["task"]


def task_of(server: Server, task_id: str) -> dict[str, Any]:
    r = server.fetch(f"/api/downloads/{task_id}")
    assert r.status_code == 200, r.text
    return r.json()["task"]


def model_of(server: Server, model_id: str) -> dict[str, Any]:
    r = server.fetch(f"/api/models/{model_id}")
    assert r.status_code == 200, r.text
    return r.json()["model"]


def logs_of(server: Server, task_id: str) -> list[str]:
    r = server.fetch(f"/api/downloads/{task_id}/logs")
    assert r.status_code == 200, r.text
    return r.json()["lines"]


def tasks_list(server: Server) -> list[dict[str, Any]]:
    r = server.fetch("/api/downloads")
    assert r.status_code == 200, r.text
    return r.json()["downloads"]


def finished(server: Server, task_id: str, timeout: float = 30) -> dict[str, Any]:
    """The task once it is succeeded, failed or canceled."""
    return eventually(
        lambda: (t := task_of(server, task_id))["status"] in FINISHED and t, timeout=timeout, interval=0.1
    )


def succeeded(server: Server, task_id: str, timeout: float = 30) -> dict[str, Any]:
    task = finished(server, task_id, timeout)
    assert task["status"] == "succeeded", (task, logs_of(server, task_id))
    return task


def error_of(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


def names_field(response: httpx.Response, field: str) -> bool:
    """The error's message names `field` and so does a field path (`errors[].loc` or `loc`)."""
    error = error_of(response)
    locs = [e.get("loc", []) for e in error.get("errors", [])] + [error.get("loc", [])]
    return field in error["message"] and any(loc and loc[0] == field for loc in locs)


def payload_files(directory: Path) -> dict[str, bytes]:
    """The downloaded files, without hf's `.cache/huggingface` bookkeeping."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in directory.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(directory).parts
    }


# --- /proc ----------------------------------------------------------------------------------------------


def cmdlines() -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
    return out


def pids_mentioning(text: str) -> list[int]:
    needle = text.encode()
    return [pid for pid, argv in cmdlines().items() if pid != os.getpid() and any(needle in a for a in argv)]


def hf_pids(target: Path) -> list[int]:
    """Live processes running `hf download … --local-dir <target>`."""
    return [
        pid
        for pid, argv in cmdlines().items()
        if str(target).encode() in argv and b"download" in argv and not is_zombie(pid)
    ]


def the_hf_child(target: Path, timeout: float = 20) -> int:
    pids = eventually(lambda: hf_pids(target), timeout=timeout)
    assert len(pids) == 1, pids
    return pids[0]


def proc_stat(pid: int) -> list[str] | None:
    """Fields after the command name: state, ppid, pgrp, …"""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def is_zombie(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] == "Z"


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# --- the event stream -----------------------------------------------------------------------------------


class EventReader:
    """Reads `GET /api/downloads/events` in a thread; ends when the server ends the stream."""

    def __init__(self, server: Server) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.status: int | None = None
        self._url = server.base_url + "/api/downloads/events"
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=60), trust_env=False)
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "the event stream did not open"
        assert self.status == 200

    def _read(self) -> None:
        try:
            with self._client.stream(
                "GET", self._url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as r:
                self.status = r.status_code
                self._opened.set()
                name = "message"
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[len("event: ") :]
                    elif line.startswith("data: "):
                        self.events.append((name, json.loads(line[len("data: ") :])))
                    elif line == "":
                        name = "message"
        except httpx.HTTPError:
            pass
        finally:
            self._opened.set()

    def tasks(self, task_id: str) -> list[dict[str, Any]]:
        return [
            data["task"]
            for name, data in list(self.events)
            if name == "task" and data.get("type") == "task" and data["task"]["id"] == task_id
        ]

    def join(self) -> None:
        """Call after stopping the server (which ends the stream)."""
        self._thread.join(10)
        self._client.close()


def test_event_stream_opens_at_once_without_tasks(launch: Launch) -> None:
    server = launch()
    url = server.base_url + "/api/downloads/events"
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    with httpx.Client(timeout=httpx.Timeout(5), trust_env=False) as client:
        with client.stream("GET", url, headers=headers) as r:
            status, content_type = r.status_code, r.headers.get("content-type", "")
        unauthenticated = client.get(url)
    server.stop()

    assert status == 200
    assert content_type.startswith("text/event-stream")
    assert unauthenticated.status_code == 401


# --- the happy path -------------------------------------------------------------------------------------


def test_download_reports_progress_and_lands_byte_for_byte(launch: Launch, hub: FakeHub) -> None:
    files = {
        "config.json": CONFIG,
        "tokenizer.json": b'{"version": "1.0"}\n',
        "sub/notes.txt": b"nested\n",
        "model.safetensors": os.urandom(12 * MiB),  # > one 10 MiB chunk: a partial size shows on disk
    }
    hub.add_repo(REPO, files)
    hub.slow(REPO, "model.safetensors", bytes_per_second=6 * MiB)
    server = launch()
    model_id = register(server)

    task = start(server, model_id)
    reader = EventReader(server)

    assert task["model_id"] == model_id and task["repository"] == REPO and task["revision"] == "main"
    assert task["status"] in ("pending", "running")
    done = succeeded(server, task["id"])
    model = model_of(server, model_id)
    target = server.data_dir / "models" / model_id
    on_disk = payload_files(target)
    server.stop()
    reader.join()

    assert on_disk == files
    events = reader.tasks(task["id"])
    total = sum(len(b) for b in files.values())
    partial = [e for e in events if e["status"] == "running" and 0 < e["bytes_done"] < total]
    assert partial, [(e["status"], e["bytes_done"], e["bytes_total"]) for e in events]
    assert all(e["bytes_total"] == total for e in partial)
    assert events[-1]["status"] == "succeeded"
    assert model["status"] == "ready"
    assert model["path"] == str(target)
    assert model["size_bytes"] >= total
    assert done["exit_code"] == 0 and done["error"] is None


def test_model_size_counts_its_files_not_hf_bookkeeping(launch: Launch, hub: FakeHub) -> None:
    files = {"config.json": CONFIG, "model.safetensors": os.urandom(100 * KiB)}
    hub.add_repo(REPO, files)
    server = launch()
    model_id = register(server)

    done = succeeded(server, start(server, model_id)["id"])
    model = model_of(server, model_id)
    server.stop()

    target = server.data_dir / "models" / model_id
    on_disk = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    # hf keeps .gitignore, CACHEDIR.TAG, download/<file>.lock|.metadata and trees/<sha>.json there.
    assert [p for p in on_disk if not p.startswith(".cache/huggingface/")] == sorted(files)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    total = sum(len(b) for b in files.values())
    assert model["size_bytes"] == total
    assert done["bytes_done"] == done["bytes_total"] == total  # 100 %, not a little more


# --- the token ------------------------------------------------------------------------------------------


def test_token_reaches_only_the_hub_and_the_hf_environment(
    launch: Launch, hub: FakeHub, tmp_path: Path
) -> None:
    token = "hf_secret" + os.urandom(12).hex()
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": os.urandom(3 * MiB)})
    hub.require_token(REPO, token)
    hub.slow(REPO, "model.safetensors", bytes_per_second=2 * MiB)
    server = launch()
    model_id = register(server)

    r = server.fetch("/api/downloads", "POST", json={"model_id": model_id, "token": token})
    assert r.status_code == 201, r.text
    task_id = r.json()["task"]["id"]
    hf = the_hf_child(server.data_dir / "models" / model_id)
    child_env = environ_of(hf)
    argv_with_token = [pid for pid, argv in cmdlines().items() if any(token.encode() in a for a in argv)]
    succeeded(server, task_id)
    answers = [r.text, server.fetch(f"/api/downloads/{task_id}").text, server.fetch("/api/downloads").text]
    answers.append(json.dumps(logs_of(server, task_id)))
    assert server.stop() == 0

    assert set(hub.authorizations()) == {f"Bearer {token}"}
    assert child_env.get("HF_TOKEN") == token
    assert not [k for k, v in child_env.items() if ADMIN_TOKEN in v or k.startswith("VLLM_USE_")]
    assert argv_with_token == []
    assert not [a for a in answers if token in a]
    assert token not in server.log()
    assert ADMIN_TOKEN not in server.log()
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == []  # the database, its -wal/-shm, download logs, model files, HF_HOME


def test_hf_runs_in_the_models_dir_with_an_allow_listed_environment(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": os.urandom(3 * MiB)})
    hub.slow(REPO, "model.safetensors", bytes_per_second=2 * MiB)
    secrets = {"GITHUB_TOKEN": "ghp_not_for_hf_0123456789", "HF_TOKEN": "hf_not_from_our_env_0123456789"}
    server = start_server(tmp_path / "data", "--hf-bin", HF, env={**hub_env(hub, tmp_path), **secrets})
    try:
        model_id = register(server)
        task_id = start(server, model_id)["id"]
        hf = the_hf_child(server.data_dir / "models" / model_id)
        cwd, env = os.readlink(f"/proc/{hf}/cwd"), environ_of(hf)
        succeeded(server, task_id)
    finally:
        server.stop()
    assert cwd == str(server.data_dir / "models")  # ours, never the server's working directory
    assert not [name for name, value in env.items() if value in secrets.values()]
    assert env["HF_ENDPOINT"] == hub.url and env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1"
    assert set(hub.authorizations()) == set()


def test_a_download_that_cannot_fit_fails_before_hf_starts(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": b"\0" * KiB})
    hub.claim_size(REPO, "model.safetensors", 2**60)  # an exbibyte: more than any disk here
    server = launch()
    model_id = register(server)

    task = finished(server, start(server, model_id)["id"])
    model = model_of(server, model_id)
    lines = logs_of(server, task["id"])
    server.stop()

    models_dir = server.data_dir / "models"
    assert task["status"] == "failed" and task["exit_code"] is None
    assert re.fullmatch(
        rf"not enough disk space: needs 1152921\.5 TB, [0-9.]+ [kMGT]?B free in {re.escape(str(models_dir))}",
        task["error"],
    ), task["error"]
    assert model["status"] == "failed"
    assert not [r for r in hub.requests if "/resolve/" in r.path]  # hf never asked for a file
    assert lines == [] and not (models_dir / model_id / ".cache").exists()


def test_token_is_not_kept_for_a_retry(launch: Launch, hub: FakeHub) -> None:
    token = "hf_secret" + os.urandom(12).hex()
    hub.add_repo(REPO, {"config.json": CONFIG})
    hub.require_token(REPO, token)
    hub.missing(REPO)
    server = launch()
    model_id = register(server)
    task_id = start(server, model_id, token=token)["id"]
    assert finished(server, task_id)["status"] == "failed"
    hub.add_repo(REPO, {"config.json": CONFIG})  # back, still private
    seen = len(hub.requests)

    r = server.fetch(f"/api/downloads/{task_id}/retry", "POST", json={})
    assert r.status_code == 200, r.text
    again = finished(server, task_id)
    server.stop()

    assert again["status"] == "failed"  # no token this time: the private repo is not found
    assert [r for r in hub.requests[seen:] if "authorization" in r.headers] == []


# --- the queue ------------------------------------------------------------------------------------------


def test_second_start_waits_pending_and_runs_when_the_first_ends(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo("org/a", {"config.json": CONFIG, "model.safetensors": os.urandom(2 * MiB)})
    hub.slow("org/a", "model.safetensors", bytes_per_second=1 * MiB)
    hub.add_repo("org/b", {"config.json": CONFIG})
    server = launch("--max-parallel-downloads", "1")
    first_model, second_model = register(server, "org/a"), register(server, "org/b")
    first = start(server, first_model)
    the_hf_child(server.data_dir / "models" / first_model)

    second = start(server, second_model)

    assert second["status"] == "pending" and second["queue_position"] == 1
    assert task_of(server, second["id"])["status"] == "pending"
    assert model_of(server, second_model)["status"] == "downloading"
    assert hf_pids(server.data_dir / "models" / second_model) == []
    assert succeeded(server, first["id"])["status"] == "succeeded"
    assert succeeded(server, second["id"])["queue_position"] is None
    assert model_of(server, second_model)["status"] == "ready"
    server.stop()


def test_parallel_limit_holds_when_starts_arrive_together(launch: Launch, hub: FakeHub) -> None:
    repos = ["org/a", "org/b", "org/c"]
    for repo in repos:
        hub.add_repo(repo, {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
        hub.slow(repo, "model.safetensors", bytes_per_second=MiB)
    server = launch("--max-parallel-downloads", "1")
    model_ids = [register(server, repo) for repo in repos]
    targets = [server.data_dir / "models" / m for m in model_ids]

    with ThreadPoolExecutor(len(model_ids)) as pool:
        tasks = list(pool.map(lambda m: start(server, m), model_ids))
    most = 0

    def all_finished() -> bool:  # and, at every look until then, one download at most
        nonlocal most
        most = max(most, sum(1 for t in targets if hf_pids(t)))
        listed = tasks_list(server)
        assert len([t for t in listed if t["status"] == "running"]) <= 1, listed
        return all(t["status"] in FINISHED for t in listed)

    eventually(all_finished, timeout=30, interval=0.05)
    statuses = [task_of(server, t["id"])["status"] for t in tasks]
    server.stop()

    assert statuses == ["succeeded"] * 3
    assert most == 1
    assert hub.most_repos_streaming == 1  # the hub never sent two repos' files at the same time


def test_cancel_of_a_pending_task_is_immediate(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo("org/a", {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
    hub.block("org/a", "model.safetensors")
    hub.add_repo("org/b", {"config.json": CONFIG})
    server = launch("--max-parallel-downloads", "1")
    first_model, second_model = register(server, "org/a"), register(server, "org/b")
    first = start(server, first_model)
    the_hf_child(server.data_dir / "models" / first_model)
    second = start(server, second_model)
    assert second["status"] == "pending"

    r = server.fetch(f"/api/downloads/{second['id']}/cancel", "POST")

    assert r.status_code == 200, r.text
    assert r.json()["task"]["status"] == "canceled"
    assert r.json()["task"]["queue_position"] is None
    assert task_of(server, second["id"])["status"] == "canceled"
    assert model_of(server, second_model)["status"] == "canceled"
    assert task_of(server, first["id"])["status"] == "running"
    assert not [r for r in hub.requests if "/org/b/" in r.path]  # it never started
    server.stop()


def test_cancel_of_a_running_task_stops_its_process_group(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
    hub.block(REPO, "model.safetensors")
    server = launch()
    model_id = register(server)
    task_id = start(server, model_id)["id"]
    hf = the_hf_child(server.data_dir / "models" / model_id)
    pgid = os.getpgid(hf)
    assert pgid != os.getpgid(server.proc.pid)  # its own group, so the whole group can be signalled
    eventually(lambda: hub.gets(REPO, "model.safetensors"), timeout=20)

    r = server.fetch(f"/api/downloads/{task_id}/cancel", "POST")

    assert r.status_code == 200, r.text
    assert r.json()["task"]["status"] == "canceled"
    # The answer comes once hf has exited and been reaped, and its group was then SIGKILLed:
    # only the kernel's delivery of that signal may still be under way.
    assert not os.path.exists(f"/proc/{hf}")
    eventually(lambda: not group_members(pgid))
    assert model_of(server, model_id)["status"] == "canceled"
    assert task_of(server, task_id)["status"] == "canceled"
    server.stop()
    assert "ignored SIGTERM" not in server.log()  # hf exits on SIGTERM: no SIGKILL was needed


def test_cancel_of_a_finished_task_is_a_conflict(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    server = launch()
    model_id = register(server)
    task_id = start(server, model_id)["id"]
    succeeded(server, task_id)

    r = server.fetch(f"/api/downloads/{task_id}/cancel", "POST")

    assert r.status_code == 409, r.text
    assert error_of(r)["code"] == "conflict"
    assert "succeeded" in error_of(r)["message"] and "cancel" in error_of(r)["message"]
    assert task_of(server, task_id)["status"] == "succeeded"
    assert model_of(server, model_id)["status"] == "ready"
    server.stop()


def test_retry_reruns_a_canceled_task_under_its_id_and_refuses_a_succeeded_one(
    launch: Launch, hub: FakeHub
) -> None:
    hub.add_repo("org/a", {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
    hub.block("org/a", "model.safetensors")
    hub.add_repo("org/b", {"config.json": CONFIG})
    server = launch("--max-parallel-downloads", "1")
    first_model, second_model = register(server, "org/a"), register(server, "org/b")
    first = start(server, first_model)
    the_hf_child(server.data_dir / "models" / first_model)
    second = start(server, second_model)
    assert server.fetch(f"/api/downloads/{second['id']}/cancel", "POST").status_code == 200
    hub.unblock()
    succeeded(server, first["id"])

    refused = server.fetch(f"/api/downloads/{first['id']}/retry", "POST", json={})
    retried = server.fetch(f"/api/downloads/{second['id']}/retry", "POST", json={})

    assert refused.status_code == 409, refused.text
    assert "succeeded" in error_of(refused)["message"]
    assert retried.status_code == 200, retried.text
    assert retried.json()["task"]["id"] == second["id"]
    assert retried.json()["task"]["model_id"] == second_model
    assert retried.json()["task"]["error"] is None and retried.json()["task"]["finished_at"] is None
    assert succeeded(server, second["id"])["model_id"] == second_model
    assert model_of(server, second_model)["status"] == "ready"
    assert [t["id"] for t in tasks_list(server)].count(second["id"]) == 1
    server.stop()


def test_new_start_cannot_reuse_a_task_id(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo("org/a", {"config.json": CONFIG})
    hub.add_repo("org/b", {"config.json": CONFIG})
    server = launch()
    first_model, second_model = register(server, "org/a"), register(server, "org/b")
    task = start(server, first_model, id="my-task.1")
    succeeded(server, task["id"])
    before = tasks_list(server)

    r = server.fetch("/api/downloads", "POST", json={"id": "my-task.1", "model_id": second_model})

    assert r.status_code == 409, r.text
    assert names_field(r, "id")
    assert tasks_list(server) == before
    assert model_of(server, second_model)["status"] == "registered"
    server.stop()


# --- bad input ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, FakeHub, str]]:
    """A server with a hub and one registered model that is never downloaded."""
    root = tmp_path_factory.mktemp("idle")
    with FakeHub() as hub:
        hub.add_repo(REPO, {"config.json": CONFIG})
        server = start_server(root / "data", "--hf-bin", HF, env=hub_env(hub, root))
        try:
            yield server, hub, register(server)
        finally:
            server.stop()


BAD_STARTS = {
    "model-id-path-form": ({"model_id": "../../etc"}, "model_id"),
    "model-id-with-slash": ({"model_id": "0123456789abcdef/0123456789abcdef"}, "model_id"),
    "model-id-upper-case": ({"model_id": "0123456789ABCDEF0123456789ABCDEF"}, "model_id"),
    "model-id-33-chars": ({"model_id": "0" * 33}, "model_id"),
    "task-id-leading-dash": ({"id": "-x"}, "id"),
    "task-id-129-chars": ({"id": "a" * 129}, "id"),
    "task-id-with-space": ({"id": "a b"}, "id"),
    "task-id-empty": ({"id": ""}, "id"),
    "token-control-char": ({"token": "hf_abc\x01def"}, "token"),
    "token-newline": ({"token": "hf_abc\ndef"}, "token"),
    "token-space": ({"token": "hf_abc def"}, "token"),
    "token-4097-chars": ({"token": "h" * 4097}, "token"),
    "unknown-field": ({"repository": "org/other"}, "repository"),
}


@pytest.mark.parametrize("body,field", BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_start_refuses_bad_arguments_naming_the_field(
    idle: tuple[Server, FakeHub, str], body: dict[str, Any], field: str
) -> None:
    server, hub, model_id = idle
    before, requests = tasks_list(server), len(hub.requests)

    r = server.fetch("/api/downloads", "POST", json={"model_id": model_id, **body})

    assert r.status_code == 400, r.text
    assert names_field(r, field), r.text
    if field == "token":
        assert body["token"] not in r.text and body["token"] not in server.log()
    assert tasks_list(server) == before
    assert model_of(server, model_id)["status"] == "registered"
    assert len(hub.requests) == requests


@pytest.mark.parametrize("task_id", ["-x", "a" * 129, "a b", "a%2Fb", ".hidden"])
@pytest.mark.parametrize(
    "method,suffix", [("GET", ""), ("GET", "/logs"), ("POST", "/cancel"), ("POST", "/retry")]
)
def test_task_id_in_the_path_is_validated(
    idle: tuple[Server, FakeHub, str], task_id: str, method: str, suffix: str
) -> None:
    server = idle[0]
    path_id = task_id.replace(" ", "%20") if "%" not in task_id else task_id

    r = server.fetch(f"/api/downloads/{path_id}{suffix}", method)

    assert r.status_code == 400, r.text
    assert names_field(r, "id"), r.text


def test_start_of_a_local_model_is_a_conflict(idle: tuple[Server, FakeHub, str]) -> None:
    server = idle[0]
    (server.data_dir / "models" / "local-one").mkdir()
    r = server.fetch("/api/models/local", "POST", json={"name": "local", "path": "local-one"})
    assert r.status_code == 201, r.text
    local_id = r.json()["model"]["id"]
    before = tasks_list(server)

    r = server.fetch("/api/downloads", "POST", json={"model_id": local_id})

    assert r.status_code == 409, r.text
    assert "local" in error_of(r)["message"]
    assert tasks_list(server) == before
    assert model_of(server, local_id)["status"] == "ready"


def test_start_of_an_unknown_model_is_not_found(idle: tuple[Server, FakeHub, str]) -> None:
    server = idle[0]
    before = tasks_list(server)

    r = server.fetch("/api/downloads", "POST", json={"model_id": "0" * 32})

    assert r.status_code == 404, r.text
    assert tasks_list(server) == before


def test_limits_are_accepted_at_their_boundary(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    server = launch()
    model_id = register(server)

    task = start(server, model_id, id="a" * 128, token="h" * 4096)

    assert task["id"] == "a" * 128
    succeeded(server, task["id"])
    assert set(hub.authorizations()) == {"Bearer " + "h" * 4096}
    server.stop()


def test_start_of_a_downloading_or_ready_model_is_refused(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo("org/a", {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
    hub.block("org/a", "model.safetensors")
    hub.add_repo("org/b", {"config.json": CONFIG})
    server = launch()
    busy, ready = register(server, "org/a"), register(server, "org/b")
    start(server, busy)
    succeeded(server, start(server, ready)["id"])
    before = tasks_list(server)

    while_downloading = server.fetch("/api/downloads", "POST", json={"model_id": busy})
    when_ready = server.fetch("/api/downloads", "POST", json={"model_id": ready, "id": "fresh-id"})

    assert while_downloading.status_code == 409, while_downloading.text
    assert "downloading" in error_of(while_downloading)["message"]
    assert when_ready.status_code == 409, when_ready.text
    assert "ready" in error_of(when_ready)["message"]
    after = tasks_list(server)
    assert [(t["id"], t["status"]) for t in after] == [(t["id"], t["status"]) for t in before]
    assert server.fetch("/api/downloads/fresh-id").status_code == 404
    assert model_of(server, busy)["status"] == "downloading"
    assert model_of(server, ready)["status"] == "ready"
    server.stop()


# --- the target -----------------------------------------------------------------------------------------


def test_symlinked_target_fails_and_writes_nothing_outside(
    launch: Launch, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    outside = tmp_path / "outside"
    outside.mkdir()
    server = launch()
    model_id = register(server)
    (server.data_dir / "models" / model_id).symlink_to(outside, target_is_directory=True)

    task = finished(server, start(server, model_id)["id"])
    server.stop()

    assert task["status"] == "failed"
    assert re.search(r"symlink|symbolic link", task["error"]), task["error"]
    assert list(outside.iterdir()) == []
    assert not [r for r in hub.requests if REPO in r.path]  # hf never ran
    assert (server.data_dir / "models" / model_id).is_symlink()


def test_symlinked_target_marks_the_model_failed(launch: Launch, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    (tmp_path / "outside").mkdir()
    server = launch()
    model_id = register(server)
    (server.data_dir / "models" / model_id).symlink_to(tmp_path / "outside")

    finished(server, start(server, model_id)["id"])
    model = model_of(server, model_id)
    server.stop()

    assert model["status"] == "failed"
    assert model["size_bytes"] is None


# --- failures -------------------------------------------------------------------------------------------


def test_unknown_repository_fails_with_the_hf_error_line(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    hub.missing(REPO)
    server = launch()
    model_id = register(server)

    task = finished(server, start(server, model_id)["id"])
    lines = logs_of(server, task["id"])
    model = model_of(server, model_id)
    server.stop()

    expected = f"Error: Model '{REPO}' not found."
    assert task["status"] == "failed" and task["exit_code"] == 1
    assert expected in task["error"], task["error"]
    assert expected in lines, lines  # plain text: no terminal colour codes
    assert not [c for c in task["error"] if ord(c) < 0x20 or ord(c) == 0x7F]
    assert model["status"] == "failed"


def test_cut_connection_fails_and_retry_after_the_fix_succeeds(launch: Launch, hub: FakeHub) -> None:
    data = os.urandom(3 * MiB)
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": data})
    hub.fail_midway(REPO, "model.safetensors", after_bytes=MiB, reset=True)  # a reset: no hf retries
    server = launch()
    model_id = register(server)
    task_id = start(server, model_id)["id"]
    failed = finished(server, task_id)
    assert failed["status"] == "failed", failed
    assert "Connection reset by peer" in failed["error"]
    assert model_of(server, model_id)["status"] == "failed"
    hub.clear_faults()

    r = server.fetch(f"/api/downloads/{task_id}/retry", "POST", json={})

    assert r.status_code == 200, r.text
    assert r.json()["task"]["id"] == task_id
    assert succeeded(server, task_id)["exit_code"] == 0
    model = model_of(server, model_id)
    target = server.data_dir / "models" / model_id
    assert model["status"] == "ready" and model["error"] is None
    assert payload_files(target) == {"config.json": CONFIG, "model.safetensors": data}
    assert len(tasks_list(server)) == 1
    server.stop()


def test_stalled_download_is_reported_and_still_cancels(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": os.urandom(MiB)})
    hub.block(REPO, "model.safetensors")
    server = launch("--download-stall-timeout", "1")
    model_id = register(server)
    task_id = start(server, model_id)["id"]
    reader = EventReader(server)
    hf = the_hf_child(server.data_dir / "models" / model_id)

    stalled = eventually(lambda: (t := task_of(server, task_id))["stalled"] and t, timeout=8, interval=0.1)
    eventually(lambda: any(e["stalled"] for e in reader.tasks(task_id)), timeout=5)
    r = server.fetch(f"/api/downloads/{task_id}/cancel", "POST")
    assert r.status_code == 200, r.text
    canceled = r.json()["task"]
    eventually(lambda: not os.path.exists(f"/proc/{hf}"), timeout=5)
    server.stop()
    reader.join()

    assert stalled["status"] == "running"
    assert canceled["status"] == "canceled" and canceled["stalled"] is False
    assert reader.tasks(task_id)[-1]["status"] == "canceled"


# --- crash safety and shutdown --------------------------------------------------------------------------


def test_sigkilled_server_leaves_no_hf_child_and_restart_cancels(launch: Launch, hub: FakeHub) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG, "model.safetensors": os.urandom(3 * MiB)})
    hub.slow(REPO, "model.safetensors", bytes_per_second=MiB / 4)
    server = launch()
    model_id = register(server)
    task_id = start(server, model_id)["id"]
    target = server.data_dir / "models" / model_id
    the_hf_child(target)

    server.stop(signal.SIGKILL)
    orphan_gone = _eventually_or_false(lambda: not hf_pids(target), timeout=5)
    again = launch()
    task, model = task_of(again, task_id), model_of(again, model_id)
    left = hf_pids(target)
    again.stop()

    assert task["status"] == "canceled" and task["finished_at"] is not None
    assert model["status"] == "canceled"
    assert orphan_gone and left == [], "the hf child outlived its SIGKILLed server"


def test_sigterm_cancels_running_downloads_and_exits_zero(launch: Launch, hub: FakeHub) -> None:
    for repo in ("org/a", "org/b"):
        hub.add_repo(repo, {"config.json": CONFIG, "model.safetensors": os.urandom(3 * MiB)})
        hub.slow(repo, "model.safetensors", bytes_per_second=MiB / 4)
    server = launch("--max-parallel-downloads", "2")
    model_ids = [register(server, "org/a"), register(server, "org/b")]
    task_ids = [start(server, m)["id"] for m in model_ids]
    targets = [server.data_dir / "models" / m for m in model_ids]
    hfs = [the_hf_child(t) for t in targets]

    try:
        # Its bound: each child's SIGTERM grace and reaping, then the open connections' grace.
        code: int | None = server.stop(signal.SIGTERM, timeout=TERM_GRACE_S + REAP_CAP_S + SHUTDOWN_GRACE_S)
    except subprocess.TimeoutExpired:
        code = None
    left = [pid for t in targets for pid in hf_pids(t)]  # none: the server exits after reaping them
    if code is None:
        server.stop(signal.SIGKILL)
    again = launch()
    tasks = [task_of(again, t) for t in task_ids]
    models = [model_of(again, m) for m in model_ids]
    again.stop()

    assert code == 0, server.log()[-3000:]
    # Prompt by cause, not by clock: no child made the server wait out its grace...
    assert "ignored SIGTERM" not in server.log()  # hf exits on SIGTERM: no SIGKILL was needed
    assert "did not close within" not in server.log()  # ...and no connection held the exit up
    assert left == [] and not [pid for pid in hfs if os.path.exists(f"/proc/{pid}")]
    assert [t["status"] for t in tasks] == ["canceled", "canceled"]
    assert [m["status"] for m in models] == ["canceled", "canceled"]


def _eventually_or_false(condition: Callable[[], Any], timeout: float) -> bool:
    try:
        eventually(condition, timeout=timeout)
    except AssertionError:
        return False
    return True


# --- bounded logs ---------------------------------------------------------------------------------------

NOISY_HF = """#!{python}
import sys
out = sys.stdout.buffer
if sys.argv[2] == "org/quiet":  # the warm-up run
    out.write(b"quiet\\n")
    sys.exit(1)
out.write(b"H" * (1024 * 1024) + b"\\n")  # one 1 MiB line
line = b"%07d " + b"y" * 1015 + b"\\n"  # 1 KiB lines, numbered
for i in range(10 * 1024):  # 10 MiB
    out.write(line % i)
out.write(b"Z" * (1024 * 1024) + b"\\n")  # another 1 MiB line, recent enough to be kept (cut)
out.write("the very last line \\u00e9\\n".encode())
out.flush()
sys.exit(1)
"""


def write_fake_hf(tmp_path: Path, source: str) -> str:
    path = tmp_path / "fake-hf"
    path.write_text(source.replace("{python}", sys.executable))
    path.chmod(0o755)
    return str(path)


def test_noisy_hf_output_is_bounded_per_line_and_in_total(
    launch: Launch, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    hub.add_repo("org/quiet", {"config.json": CONFIG})
    server = launch(hf_bin=write_fake_hf(tmp_path, NOISY_HF))
    # A first, quiet download loads what any download needs (huggingface_hub for the file list).
    finished(server, start(server, register(server, "org/quiet"))["id"])
    model_id = register(server)
    rss_before = rss_kib(server.proc.pid)

    task = finished(server, start(server, model_id)["id"])
    rss_after = rss_kib(server.proc.pid)
    lines = logs_of(server, task["id"])
    server.stop()

    sizes = [len(line.encode()) for line in lines]
    assert task["status"] == "failed" and task["exit_code"] == 1
    assert max(sizes) <= 64 * KiB
    assert sum(s + 1 for s in sizes) <= 4 * MiB
    assert lines[-1] == "the very last line \u00e9"
    assert lines[-2] == "Z" * (64 * KiB)  # cut at 64 KiB
    assert lines[-3] == "0010239 " + "y" * 1015  # the newest lines are all there, in order
    numbered = [int(line[:7]) for line in lines if line[:7].isdigit()]
    assert numbered == list(range(numbered[0], 10 * 1024))
    assert not any(line.startswith("H") for line in lines)  # the oldest were dropped
    assert task["error"] == "the very last line \u00e9"
    assert rss_after - rss_before < 8 * 1024, (rss_before, rss_after)


SEPARATOR_HF = """#!{python}
import sys
sys.stdout.buffer.write("page\\x0cbreak and line\\u2028separator\\n".encode() + b"bad \\xff byte\\n")
sys.exit(1)
"""


def test_logs_read_back_after_exit_keep_each_line_whole(launch: Launch, hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": CONFIG})
    server = launch(hf_bin=write_fake_hf(tmp_path, SEPARATOR_HF))
    model_id = register(server)

    task = finished(server, start(server, model_id)["id"])
    lines = logs_of(server, task["id"])
    server.stop()

    assert lines == ["page\x0cbreak and line\u2028separator", "bad \ufffd byte"]


def test_logs_tail_returns_only_the_last_lines_and_the_logs_survive_a_restart(
    launch: Launch, hub: FakeHub
) -> None:
    """One failed download (hf's lines) serves both: its logs' tail, then the same logs after a restart."""
    hub.missing(REPO)
    server = launch()
    model_id = register(server)
    task_id = finished(server, start(server, model_id)["id"])["id"]
    every = logs_of(server, task_id)

    tail = server.fetch(f"/api/downloads/{task_id}/logs?tail=2")
    bad = server.fetch(f"/api/downloads/{task_id}/logs?tail=0")
    server.stop()

    assert len(every) > 2
    assert tail.status_code == 200, tail.text
    assert tail.json()["lines"] == every[-2:]
    assert bad.status_code == 400 and names_field(bad, "tail")

    again = launch()
    after = logs_of(again, task_id)
    again.stop()

    assert after == every


# --- the time estimate (issue 17, finding 10) --------------------------------------------------------


def test_no_time_estimate_until_the_rate_is_measured_over_enough_time_and_bytes() -> None:
    from vllm_use.downloads.manager import ESTIMATE_AFTER_BYTES, ESTIMATE_AFTER_S, estimate_s

    # hf's first second: a few kB of metadata at a few kB/s, 24 MiB to go → was "3 d 15 h left"-like.
    assert estimate_s(24 * MiB, rate=80.0, window_s=1.0, moved=4 * KiB) is None
    assert estimate_s(24 * MiB, rate=8 * MiB, window_s=ESTIMATE_AFTER_S - 0.1, moved=40 * MiB) is None
    assert estimate_s(24 * MiB, rate=100 * KiB, window_s=60.0, moved=ESTIMATE_AFTER_BYTES - 1) is None
    assert estimate_s(None, rate=8 * MiB, window_s=60.0, moved=40 * MiB) is None
    assert estimate_s(24 * MiB, rate=0.0, window_s=60.0, moved=40 * MiB) is None
    assert estimate_s(24 * MiB, rate=8 * MiB, window_s=ESTIMATE_AFTER_S, moved=ESTIMATE_AFTER_BYTES) == 3.0

"""The runtime supervisor when vLLM misbehaves (docs/runtime.md), against `tests/fakes/vllm.py`.

A real `vllm-use serve` child runs the fake through the reaper shim; the knobs
(FAKE_VLLM_*) make it die, hang, ignore SIGTERM, never become healthy or flood
its log. Process groups are checked in /proc, not only the main pid: vLLM's
EngineCore and Worker children are what leaks in real life. Each test stops
the runtime and the server it started; the fixture SIGKILLs any group it saw
as a last resort, so a failing test leaks nothing either.

No test measures time: what happened first is read from what each side wrote
(the fake's record of its phases, its log, the server's log), and every wait is
bounded by the work's own deadline (the start timeout, the reaping cap).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import fake_vllm_bin
from tests.support.real_vllm import settle
from tests.support.server import Server, eventually, free_port, start_server
from vllm_use.runtime.supervisor import REAP_CAP_S, TERM_GRACE_S

ENGINE_FAILURE = "RuntimeError: Engine core initialization failed"
LOADING_START_TIMEOUT_S = 120  # for starts that load until the test acts: the fake loads for 60 s
LINE_MAX = 64 * 1024
TOTAL_MAX = 4 * 1024 * 1024


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) pids of process group `pgid`, from /proc/*/stat.

    Zombies don't count: PID 1 of a container may never reap the orphans a test makes.
    """
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # comm may hold spaces and parentheses
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


@dataclass
class Runtime:
    """A vllm-use server supervising the fake vLLM, with one registered ready model."""

    server: Server
    model_id: str
    model_dir: Path
    records: Path
    pgids: set[int] = field(default_factory=set)

    def status(self) -> dict[str, Any]:
        r = self.server.fetch("/api/runtime")
        assert r.status_code == 200, r.text
        body = r.json()
        if body["pgid"]:
            self.pgids.add(body["pgid"])
        return body

    def logs(self) -> list[str]:
        r = self.server.fetch("/api/runtime/logs")
        assert r.status_code == 200, r.text[:2000]
        return r.json()["lines"]

    def switch(self, start_timeout_s: int = 30, **options: Any) -> httpx.Response:
        """runtime.switch, waiting for its outcome (ready, failed or canceled)."""
        body = {"model_id": self.model_id, "options": {"start_timeout_s": start_timeout_s, **options}}
        return settle(self.server, "/api/runtime/switch", body, start_timeout_s=start_timeout_s)

    def begin(self, start_timeout_s: int = LOADING_START_TIMEOUT_S, **options: Any) -> dict[str, Any]:
        """runtime.switch without waiting: 202, state starting."""
        body = {"model_id": self.model_id, "options": {"start_timeout_s": start_timeout_s, **options}}
        r = self.server.fetch("/api/runtime/switch", "POST", json=body)
        assert r.status_code == 202, r.text
        self.pgids.add(r.json()["pgid"])
        return r.json()

    def switch_in_thread(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        start_timeout_s: int = LOADING_START_TIMEOUT_S,
        **options: Any,
    ) -> concurrent.futures.Future[httpx.Response]:
        """A switch that waits for its outcome, in a thread, while the test does something else."""
        return pool.submit(self.switch, start_timeout_s, **options)

    def phases(self) -> list[dict[str, Any]]:
        """What each fake vLLM wrote about itself (FAKE_VLLM_RECORD), by pid."""
        return [json.loads(p.read_text()) for p in sorted(self.records.iterdir())]

    def stop(self) -> httpx.Response:
        return self.server.fetch("/api/runtime/stop", "POST")

    def wait_loading(self) -> dict[str, Any]:
        """Until the fake's main process exists and is loading (its engine line is in the log)."""

        def loading() -> dict[str, Any] | None:
            status = self.status()
            if status["state"] != "starting" or not status["pid"] or not pid_alive(status["pid"]):
                return None
            return status if any("Initializing a V1 LLM engine" in line for line in self.logs()) else None

        # A start not loading within its start timeout would have failed: no longer to wait.
        return eventually(loading, timeout=LOADING_START_TIMEOUT_S)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Callable[..., Runtime]]:
    """`runtime(**knobs)`: a server whose fake vLLM gets FAKE_VLLM_<knob>=value (from its wrapper)."""
    made: list[Runtime] = []

    def make(**knobs: Any) -> Runtime:
        data = tmp_path / "data"
        model_dir = data / "models" / "tiny"
        model_dir.mkdir(parents=True)
        (model_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        records = tmp_path / "records"
        records.mkdir()
        # max_lifetime: a safety net behind the teardown below.
        knobs = {"max_lifetime": 120, "record": records / "{pid}.json", **knobs}
        fake = fake_vllm_bin(tmp_path / "bin", **knobs)
        server = start_server(data, "--vllm-bin", str(fake), "--runtime-port", str(free_port()))
        rt = Runtime(server, "", model_dir, records)
        made.append(rt)
        r = server.fetch("/api/models/local", "POST", json={"name": "tiny", "path": "tiny"})
        assert r.status_code == 201, r.text
        rt.model_id = r.json()["model"]["id"]
        return rt

    yield make
    for rt in made:
        if rt.server.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                rt.stop()
            rt.server.stop()
        for pgid in rt.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def ready(rt: Runtime, **options: Any) -> dict[str, Any]:
    r = rt.switch(**options)
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["state"] == "ready"
    rt.pgids.add(status["pgid"])
    return status


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text[:500]
    return r.json()["error"]


# ---------------------------------------------------------------------------------------------- deaths


def test_sigkilled_vllm_fails_with_137_and_takes_its_orphans(runtime: Callable[..., Runtime]) -> None:
    rt = runtime(spawn_children=2)
    status = ready(rt)
    pgid, pid = status["pgid"], status["pid"]
    assert pid and pid != pgid
    # the shim, vLLM's main process and its EngineCore and Worker
    assert len(group_members(pgid)) >= 4, group_members(pgid)

    os.kill(pid, signal.SIGKILL)

    # The failure is published once the group is reaped and its output read (REAP_CAP_S each).
    failed = eventually(lambda: (s := rt.status())["state"] == "failed" and s, timeout=2 * REAP_CAP_S)
    assert failed["exit_code"] == 137
    assert any("killed by signal 9" in line for line in failed["last_lines"]), failed["last_lines"]
    assert not group_alive(pgid), group_members(pgid)


def test_sigkilled_vllm_use_takes_the_whole_vllm_group(runtime: Callable[..., Runtime]) -> None:
    rt = runtime(spawn_children=2)
    pgid = ready(rt)["pgid"]
    assert len(group_members(pgid)) >= 4, group_members(pgid)

    rt.server.stop(signal.SIGKILL)

    # The reaper shim gets its parent-death signal and kills its group: nothing waits on a grace.
    eventually(lambda: not group_alive(pgid), timeout=REAP_CAP_S)


def test_sigkilled_vllm_use_while_vllm_loads_leaves_no_process_of_the_group(
    runtime: Callable[..., Runtime],
) -> None:
    rt = runtime(load_seconds=60, spawn_children=2)
    rt.begin()
    pgid = rt.wait_loading()["pgid"]
    assert len(group_members(pgid)) >= 4, group_members(pgid)  # shim, vLLM, EngineCore, Worker

    rt.server.stop(signal.SIGKILL)

    eventually(lambda: not group_alive(pgid), timeout=REAP_CAP_S)
    (record,) = rt.phases()
    assert record["phase"] == "loading"  # it never got further, and it is gone with its children
    assert not any(pid_alive(child["pid"]) for child in record["children"])


# ---------------------------------------------------------------------------------------------- stops


def killed_after_the_grace(server: Server, pgid: int) -> bool:
    """The supervisor's own word that it sent SIGKILL only once the SIGTERM grace had passed."""
    return f"pgid {pgid} ignored SIGTERM for {TERM_GRACE_S:.0f} s; killing it" in server.log()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace(runtime: Callable[..., Runtime]) -> None:
    rt = runtime(ignore_sigterm=1, spawn_children=2)
    pgid = ready(rt)["pgid"]

    r = rt.stop()

    assert r.status_code == 200, r.text
    assert r.json()["state"] == "stopped"
    assert not group_alive(pgid), group_members(pgid)
    # SIGTERM first: the child lived to say it ignored it (a SIGKILL leaves no last words) ...
    assert any("FAKE_VLLM_IGNORE_SIGTERM: ignoring SIGTERM" in line for line in rt.logs())
    # ... and SIGKILL only after the grace ran out, which the supervisor logs before it kills.
    assert killed_after_the_grace(rt.server, pgid)
    (record,) = rt.phases()
    assert record["phase"] == "ready"  # killed where it stood: it never exited on its own
    assert rt.status()["state"] == "stopped"


def test_stop_during_loading_kills_at_once_and_cancels_the_start(
    runtime: Callable[..., Runtime], pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    # It would ignore a SIGTERM, so a stop that sent one and waited would show in its log.
    rt = runtime(load_seconds=60, spawn_children=2, ignore_sigterm=1)
    waiting = rt.switch_in_thread(pool)  # ?wait=: answers when the start settles
    pgid = rt.wait_loading()["pgid"]
    assert len(group_members(pgid)) >= 4, group_members(pgid)

    r = rt.stop()

    assert r.status_code == 200, r.text
    assert r.json()["state"] == "stopped"
    assert not group_alive(pgid), group_members(pgid)
    # SIGKILL at once: no SIGTERM reached it, no grace was waited, it died loading.
    assert not any("ignoring SIGTERM" in line for line in rt.logs())
    assert not killed_after_the_grace(rt.server, pgid)
    (record,) = rt.phases()
    assert record["phase"] == "loading"
    answer = waiting.result()  # the client's own timeout bounds it (tests/support/real_vllm.py settle)
    assert answer.status_code == 409, answer.text
    assert error_of(answer)["code"] == "conflict"
    assert "cancel" in error_of(answer)["message"], answer.text
    assert re.search(r"method=runtime\.switch .*outcome=conflict", rt.server.log())


def test_delete_refuses_a_model_that_is_loading(runtime: Callable[..., Runtime]) -> None:
    rt = runtime(load_seconds=60)
    rt.begin()
    rt.wait_loading()

    for query in ("", "?files=true"):
        r = rt.server.fetch(f"/api/models/{rt.model_id}{query}", "DELETE")
        assert r.status_code == 409, r.text
        assert error_of(r)["code"] == "conflict"
    assert (rt.model_dir / "config.json").is_file()
    assert rt.server.fetch(f"/api/models/{rt.model_id}").status_code == 200
    assert rt.status()["state"] == "starting"

    assert rt.stop().status_code == 200
    assert rt.status()["state"] == "stopped"


# ---------------------------------------------------------------------------------------------- failed starts


@pytest.mark.parametrize("mode", ["closed", "503"])
def test_start_that_never_becomes_healthy_times_out_with_its_last_lines(
    runtime: Callable[..., Runtime], mode: str
) -> None:
    rt = runtime(never_healthy=mode, spawn_children=2)
    expected = "still loading" if mode == "closed" else "Uvicorn running on"

    r = rt.switch(start_timeout_s=2)

    assert r.status_code == 502, r.text
    error = error_of(r)
    assert error["code"] == "runtime_failed"
    assert error["message"] == "not healthy within 2 s"  # the timeout failed it, not an exit
    assert any(expected in line for line in error["last_lines"]), error
    (record,) = rt.phases()
    assert record["phase"] == ("loading" if mode == "closed" else "ready")  # alive until we killed it
    status = rt.status()
    assert status["state"] == "failed"
    assert any(expected in line for line in status["last_lines"]), status
    assert status["pgid"]
    assert not group_alive(status["pgid"]), group_members(status["pgid"])


def test_engine_failure_answers_502_with_exit_code_and_leaks_nothing_on_retry(
    runtime: Callable[..., Runtime],
) -> None:
    rt = runtime(fail_on_start=1, spawn_children=2)
    seen = []
    for _attempt in range(2):
        r = rt.switch(start_timeout_s=30)
        assert r.status_code == 502, r.text  # vLLM failed, not vllm-use: not a 500
        assert error_of(r)["code"] == "runtime_failed"
        assert "exited with status 1" in error_of(r)["message"]
        assert any(ENGINE_FAILURE in line for line in error_of(r)["last_lines"]), r.text
        status = rt.status()
        assert status["state"] == "failed"
        assert status["exit_code"] == 1
        assert any(ENGINE_FAILURE in line for line in status["last_lines"]), status
        assert status["pgid"] not in seen
        seen.append(status["pgid"])
        assert not group_alive(status["pgid"]), group_members(status["pgid"])

        stopped = rt.stop()
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["state"] in ("stopped", "failed")
        assert rt.status()["state"] in ("stopped", "failed")
    assert not any(group_alive(pgid) for pgid in seen)


@pytest.mark.parametrize("fill", ["x", "é"])
def test_huge_log_lines_are_cut_and_the_newest_kept(runtime: Callable[..., Runtime], fill: str) -> None:
    # 80 lines of 1 MiB: 80 cut lines of 64 KiB overflow the 4 MiB buffer, so the oldest must go.
    rt = runtime(line_bytes=1024 * 1024, lines=80, line_fill=fill, fail_on_start=3)

    r = rt.switch(start_timeout_s=30)

    assert r.status_code >= 500, r.text[:2000]
    assert error_of(r)["last_lines"][-1].startswith(ENGINE_FAILURE)
    lines = rt.logs()
    sizes = [len(line.encode()) for line in lines]
    assert max(sizes) <= LINE_MAX
    assert sum(size + 1 for size in sizes) <= TOTAL_MAX
    assert all("\ufffd" not in line for line in lines)
    assert not any(line.startswith("fake line 000000 ") for line in lines)  # the oldest were dropped
    marker = [line for line in lines if line.startswith("fake line 000079 FAKE_VLLM_LAST_LINE ")]
    assert len(marker) == 1 and len(marker[0].encode()) > LINE_MAX - 4
    assert lines[-1].startswith(ENGINE_FAILURE)
    if fill == "é":
        assert any(line.startswith("fake line 000078 éé") for line in lines)
    status = rt.status()
    assert status["state"] == "failed"
    assert status["exit_code"] == 3
    assert status["last_lines"][-1].startswith(ENGINE_FAILURE)
    assert not group_alive(status["pgid"])

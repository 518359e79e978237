"""The router's edges (docs/router.md, "Loading on demand", "Capacity", "Sleep", "Idle"): what an
eviction may never take, the order in which requests waiting for room are served, `--max-waiting`
for those, and the reads that never count as use.

A real `vllm-use serve` over loopback; its deployments run the fake vLLM, each with its own knobs
(`fake_vllm_bin(by_name=…)`): one loads or wakes slowly, so that another request arrives meanwhile,
and the deployments the tests follow record each start (`record`: one file per process). The sleep
cases run on one fake GPU (the fake NVML, tests/fakes/nvml).
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.deployments import (
    START_TIMEOUT_S,
    add_deployment,
    alive,
    chat,
    instance,
    load,
    on_demand_server,
    states,
    streaming,
)
from tests.support.gpus import gpu_server, held
from tests.support.server import ADMIN_TOKEN, Server, eventually
from vllm_use.deployments.instances import SLEEP_CHECK_S, WAKE_TIMEOUT_S

SLOW_LOAD_S = 5  # "slow" is still starting while the test sees it so and sends another request
SLOW_WAKE_S = 3  # the fake's /sleep and /wake_up take this long: "nap" is seen waking
TOKEN_S = 0.1  # a stream of LONG (300 pieces) holds its instance busy for up to 30 s
IDLE_S = 5  # an idle timeout that outlasts the reads of the last test


def recording(records: Path, name: str, **knobs: object) -> dict[str, object]:
    """The fake's knobs for deployment `name`: `knobs`, and a record of each start of it."""
    return {"record": str(records / f"{name}-{{pid}}.json"), **knobs}


def starts(records: Path, name: str) -> list[dict[str, Any]]:
    """What the fake recorded of each start of `name`, one record per process."""
    return [json.loads(path.read_text()) for path in sorted(records.glob(f"{name}-*.json"))]


def starting_pid(server: Server, name: str) -> int:
    """The pid of `name`'s instance once it is seen starting."""
    seen = eventually(
        lambda: (found := instance(server, name))["state"] == "starting" and found["pid"],
        timeout=START_TIMEOUT_S,
    )
    return int(seen)


# --- what an eviction never takes --------------------------------------------------------------------


@pytest.mark.parametrize("started_by", ["a request", "deployments.load"])
def test_eviction_never_takes_an_instance_that_is_starting(tmp_path: Path, started_by: str) -> None:
    """--max-loaded 1: "slow" is starting when a request for "other" arrives. "slow" is not stopped:
    the same process becomes ready and answers; "other" waits for room and is answered once "slow"
    is idle. Started by deployments.load, nobody waits for "slow": only its state protects it."""
    records = tmp_path / "records"
    records.mkdir()
    by_name = {"slow": recording(records, "slow", load_seconds=SLOW_LOAD_S)}
    server = on_demand_server(tmp_path, "--max-loaded", "1", by_name=by_name)
    try:
        add_deployment(server, "slow")
        add_deployment(server, "other")
        secret = server.create_key("inference")[1]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            if started_by == "a request":
                first = pool.submit(chat, server, secret, "slow")
            else:  # ?wait: the outcome of this start, ready or canceled (409)
                first = pool.submit(load, server, "slow")
            pid = starting_pid(server, "slow")
            other = pool.submit(chat, server, secret, "other")
            eventually(lambda: instance(server, "other")["waiting"] == 1, timeout=START_TIMEOUT_S)
            now = instance(server, "slow")
            assert now["state"] == "starting" and now["pid"] == pid, (
                f"'slow' should still be starting (its load takes {SLOW_LOAD_S} s) with pid {pid}: {now}"
            )
            assert states(server)["other"] == "unloaded"
            answer = first.result(timeout=SLOW_LOAD_S + START_TIMEOUT_S + 10)
            assert answer.status_code == 200, f"'slow' was stopped while starting: {answer.text}"
            if started_by == "deployments.load":
                assert answer.json()["pid"] == pid, answer.text
            served = other.result(timeout=START_TIMEOUT_S + 10)
            assert served.status_code == 200, served.text
        (record,) = starts(records, "slow")  # one start: never stopped while starting and started again
        assert record["pid"] == pid
        assert states(server) == {"slow": "unloaded", "other": "ready"}  # idle at last, it made room
        assert not alive(pid)
    finally:
        server.stop()


@pytest.mark.parametrize("woken_by", ["a request", "deployments.wake"])
def test_eviction_never_takes_an_instance_that_is_waking(tmp_path: Path, woken_by: str) -> None:
    """One GPU, --max-loaded 1: "nap" (idle_action sleep) is waking when a request for "other"
    arrives. "nap" wakes undisturbed (the same process, woken before anything puts it aside);
    "other" waits, and once "nap" is idle puts it back to sleep and is answered."""
    records = tmp_path / "records"
    records.mkdir()
    by_name = {"nap": recording(records, "nap", sleep_seconds=SLOW_WAKE_S)}
    server = gpu_server(tmp_path, "--max-loaded", "1", by_name=by_name)
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        add_deployment(server, "other", 0.4)
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        wait = SLOW_WAKE_S + SLEEP_CHECK_S
        r = server.fetch(f"/api/deployments/nap/sleep?wait={wait:g}", "POST", timeout=wait + 10)
        assert r.json()["state"] == "sleeping", r.text  # asleep (202: "sleeping" covers both)
        secret = server.create_key("inference")[1]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            wait = SLOW_WAKE_S + WAKE_TIMEOUT_S
            if woken_by == "a request":
                first = pool.submit(chat, server, secret, "nap")
            else:  # ?wait: the wake's outcome; nobody waits for "nap" in /v1
                path = f"/api/deployments/nap/wake?wait={wait:g}"
                first = pool.submit(server.fetch, path, "POST", timeout=wait + 10)
            eventually(lambda: instance(server, "nap")["state"] == "waking", timeout=START_TIMEOUT_S)
            other = pool.submit(chat, server, secret, "other")
            eventually(lambda: instance(server, "other")["waiting"] == 1, timeout=START_TIMEOUT_S)
            now = instance(server, "nap")
            assert now["state"] == "waking" and now["pid"] == pid, (
                f"'nap' should still be waking (its /wake_up takes {SLOW_WAKE_S} s) with pid {pid}: {now}"
            )
            answer = first.result(timeout=wait + 10)
            assert answer.status_code == 200, answer.text
            served = other.result(timeout=wait + SLEEP_CHECK_S + START_TIMEOUT_S)
            assert served.status_code == 200, served.text
        log = server.log()
        assert "deployment nap: awake" in log and "waking failed" not in log, log
        woke = log.index("deployment nap: awake")
        put_aside = log.find("deployment nap: put to sleep to make room")
        assert put_aside > woke, f"'nap' was put aside while it was waking:\n{log}"
        assert len(starts(records, "nap")) == 1  # never stopped and started cold
        assert states(server) == {"nap": "sleeping", "other": "ready"} and alive(pid)
    finally:
        server.stop()


# --- waiting for room --------------------------------------------------------------------------------


def test_requests_waiting_for_room_are_loaded_in_arrival_order(tmp_path: Path) -> None:
    """--max-loaded 1, "a" busy with a stream: a request for "b", then one for "c", wait for room.
    When "a" is idle, "b" is started (evicting "a"), answered, and evicted in turn for "c". Had "c"
    gone first, "b" would be the one left running."""
    records = tmp_path / "records"
    records.mkdir()
    by_name = {
        "a": {"token_seconds": TOKEN_S},
        "b": recording(records, "b"),
        "c": recording(records, "c"),
    }
    server = on_demand_server(tmp_path, "--max-loaded", "1", by_name=by_name)
    try:
        for name in ("a", "b", "c"):
            add_deployment(server, name)
        assert load(server, "a").json()["state"] == "ready"
        secret = server.create_key("inference")[1]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            with streaming(server, secret, "a") as rest:
                b = pool.submit(chat, server, secret, "b")
                eventually(lambda: instance(server, "b")["waiting"] == 1, timeout=START_TIMEOUT_S)
                c = pool.submit(chat, server, secret, "c")
                eventually(lambda: instance(server, "c")["waiting"] == 1, timeout=START_TIMEOUT_S)
                assert states(server) == {"a": "ready", "b": "unloaded", "c": "unloaded"}
                assert starts(records, "b") == [] and starts(records, "c") == []
                next(rest)  # "a" still streams
            # Its client left: "a" is idle, and the requests get room in turn.
            for answer in (b.result(timeout=START_TIMEOUT_S), c.result(timeout=2 * START_TIMEOUT_S)):
                assert answer.status_code == 200, answer.text
        # Each started once; "b" has exited and "c" runs: "b"'s whole life came before "c"'s.
        (b_start,), (c_start,) = starts(records, "b"), starts(records, "c")
        assert (b_start["phase"], c_start["phase"]) == ("exited", "ready"), "'c' was loaded before 'b'"
        assert states(server) == {"a": "unloaded", "b": "unloaded", "c": "ready"}
    finally:
        server.stop()


def answered_without_waiting(
    server: Server, pool: concurrent.futures.Executor, secret: str, name: str, waiting: int
) -> httpx.Response:
    """A request for `name` that must be answered without waiting: answered, or seen waiting (its
    deployment's `waiting` above `waiting`), whichever comes first, with no guess at a time."""
    sent = pool.submit(chat, server, secret, name)
    eventually(lambda: sent.done() or instance(server, name)["waiting"] > waiting, timeout=START_TIMEOUT_S)
    assert sent.done(), f"a request for {name} waits, beyond --max-waiting"
    return sent.result()


def test_max_waiting_counts_the_requests_waiting_for_room(tmp_path: Path) -> None:
    """--max-waiting 1, --max-loaded 1, "a" busy: a request for "b" waits for room; the next ones,
    for "b" or "c", get 503 model_loading with Retry-After at once, while "a" still streams."""
    by_name = {"a": {"token_seconds": TOKEN_S}}
    server = on_demand_server(tmp_path, "--max-loaded", "1", "--max-waiting", "1", by_name=by_name)
    try:
        for name in ("a", "b", "c"):
            add_deployment(server, name)
        assert load(server, "a").json()["state"] == "ready"
        secret = server.create_key("inference")[1]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            with streaming(server, secret, "a") as rest:
                first = pool.submit(chat, server, secret, "b")
                eventually(lambda: instance(server, "b")["waiting"] == 1, timeout=START_TIMEOUT_S)
                for name, before in (("b", 1), ("c", 0)):
                    r = answered_without_waiting(server, pool, secret, name, before)
                    assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
                    assert int(r.headers["retry-after"]) > 0
                # At once: no room appeared meanwhile, the first still waits, and only it counts.
                assert instance(server, "a")["in_flight"] == 1 and not first.done()
                assert instance(server, "b")["waiting"] == 1 and instance(server, "c")["waiting"] == 0
                next(rest)
            assert first.result(timeout=START_TIMEOUT_S).status_code == 200
        assert chat(server, secret, "c").status_code == 200  # the count went back down
    finally:
        server.stop()


# --- reads are not use -------------------------------------------------------------------------------


def read_everything(server: Server, secret: str) -> None:
    """Every read that docs/router.md says never loads, wakes or counts as use."""
    inference = {"Authorization": f"Bearer {secret}"}
    assert server.fetch("/v1/models", token=None, headers=inference).status_code == 200
    for path in ("/api/deployments", "/api/deployments/nap", "/api/deployments/idle", "/api/runtime"):
        assert server.fetch(path).status_code == 200, path
    assert server.fetch("/healthz", token=None).status_code == 200
    # The events stream: one event per deployment when it connects; read them and leave.
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with server.client.stream("GET", server.base_url + "/api/deployments/events", headers=admin) as r:
        assert r.status_code == 200
        names = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                names.append(json.loads(line[5:])["deployment"]["name"])
                if len(names) == 2:
                    break
    assert names == ["idle", "nap"]


def test_reads_never_wake_a_sleeper_nor_reset_an_idle_deadline(tmp_path: Path) -> None:
    """One GPU, idle_action sleep: "nap" asleep, "idle" ready with its idle timer running. The reads
    leave "nap" asleep (its memory given back) and "idle"'s deadline where it was; "idle" goes to
    sleep at that deadline while the test keeps reading."""
    server = gpu_server(tmp_path)
    try:
        add_deployment(server, "nap", 0.5, idle_action="sleep")
        add_deployment(server, "idle", 0.4, idle_action="sleep", idle_timeout_s=IDLE_S)
        assert load(server, "nap").json()["state"] == "ready"
        pid = instance(server, "nap")["pid"]
        r = server.fetch(
            f"/api/deployments/nap/sleep?wait={SLEEP_CHECK_S:g}", "POST", timeout=SLEEP_CHECK_S + 10
        )
        assert r.json()["state"] == "sleeping", r.text  # asleep (202: "sleeping" covers both)
        asleep = held(server, pid)
        loaded = load(server, "idle").json()
        assert loaded["state"] == "ready" and loaded["idle_deadline"], loaded
        secret = server.create_key("inference")[1]

        read_everything(server, secret)

        nap, idle = instance(server, "nap"), instance(server, "idle")
        assert (nap["state"], nap["pid"], nap["waiting"]) == ("sleeping", pid, 0), nap
        assert idle["idle_deadline"] == loaded["idle_deadline"], (
            f"the reads moved the deadline of 'idle' or put it aside: {idle}"
        )
        assert (idle["state"], idle["in_flight"], idle["last_used"]) == ("ready", 0, None), idle
        # Reading all along, "idle" is put to sleep at its first deadline.
        eventually(lambda: states(server)["idle"] == "sleeping", timeout=IDLE_S + SLEEP_CHECK_S)
        read_everything(server, secret)
        assert states(server) == {"idle": "sleeping", "nap": "sleeping"}
        assert held(server, pid) == asleep and "deployment nap: awake" not in server.log()
    finally:
        server.stop()

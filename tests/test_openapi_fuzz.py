"""`/api/openapi.json` is accurate enough to drive a fuzzer (docs/architecture.md), and /api survives the
fuzzer.

Schemathesis runs as its CLI (`st run`) in a subprocess against a real `vllm-use serve` child:
one command runs every phase (explicit examples, the coverage phase's boundary and negative
values, random fuzzing, and stateful sequences that follow create → enable/disable/delete
links), where the pytest integration needs a separate state machine. Each run is bounded
(`--max-examples`) and deterministic (`--generation-deterministic`: the same cases every run,
no example database), and asserts:

- no 5xx (`not_a_server_error`),
- every response matches its documented schema (`response_schema_conformance`),
- every status is documented for its operation (`status_code_conformance`),
- every Content-Type is the documented one (`content_type_conformance`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from handlers.api import ROUTES
from tests.fakes.hub import FakeHub
from tests.support.server import ADMIN_TOKEN, Server, start_server

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
MAX_EXAMPLES = 25  # per operation and phase; ~5 s a run on 2 cores
# A key that lacks a method's scope is refused before its arguments are read, so for the scoped runs
# (which look for undocumented 403s) more examples of one operation, the coverage phase's boundary
# values and the stateful sequences only repeat the same refusal: a few explicit and random cases.
SCOPED_MAX_EXAMPLES = 6
SCOPED_PHASES = "examples,fuzzing"
RUN_TIMEOUT_S = 120


def schemathesis_cli() -> str:
    here = Path(sys.executable).parent
    for name in ("st", "schemathesis"):
        if (here / name).is_file():
            return str(here / name)
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("the schemathesis CLI (st) is not installed: make .venv installs the test extras")


def run_schemathesis(
    location: str,
    base_url: str,
    token: str,
    workdir: Path,
    max_examples: int = MAX_EXAMPLES,
    phases: str = "examples,coverage,fuzzing,stateful",
) -> subprocess.CompletedProcess[str]:
    """`st run` against `base_url` with `Authorization: Bearer <token>`; returns the finished process."""
    cmd = [
        schemathesis_cli(),
        "run",
        location,
        "--url",
        base_url,
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--max-examples",
        str(max_examples),
        "--phases",
        phases,
        "--generation-deterministic",
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--no-color",
        "--output-truncate",
        "false",
        # These spawn vLLM (there is none here), and a fuzzed `?wait=` holds the answer up to 600 s,
        # past the fuzzer's request timeout; tests/test_runtime*.py cover them, and their 202.
        "--exclude-path-regex",
        "^/api/runtime/(start|restart|switch)$",
    ]
    # The fence's environment (tests/conftest.py): loopback goes direct, anything else to its sentinel.
    env = dict(os.environ)
    return subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server the fuzzer drives. The fuzzer registers repositories and starts downloads: their
    `hf` children ask a fake hub that knows no repository (401, as the Hub answers), never the Hub."""
    root = tmp_path_factory.mktemp("fuzz")
    with FakeHub() as hub:
        srv = start_server(root / "data", env={"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf-home")})
        yield srv
        srv.stop()


def assert_clean(proc: subprocess.CompletedProcess[str], server: Server, log_start: int) -> None:
    """The run passed, and the server logged no traceback while it ran (the log from `log_start`)."""
    output = proc.stdout + proc.stderr
    server_log = server.log()[log_start:]
    assert proc.returncode == 0, (
        f"schemathesis found problems:\n{output}\n--- server log tail ---\n{server_log[-4000:]}"
    )
    assert "FAILURES" not in output and "ERRORS" not in output, output
    assert "Traceback" not in server_log, server_log[-4000:]


def openapi(server: Server) -> dict:
    r = server.fetch("/api/openapi.json")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def test_openapi_document_has_an_operation_for_every_route(shared_server: Server) -> None:
    doc = openapi(shared_server)
    assert doc["openapi"].startswith("3.1."), doc["openapi"]
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    operation_ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids)), operation_ids
    for route in ROUTES:
        operation = doc["paths"].get(route.path, {}).get(route.verb.lower())
        assert operation is not None, f"{route.verb} {route.path} is missing from the OpenAPI document"
        assert operation["operationId"] == route.method.replace(".", "_"), (route, operation["operationId"])
        assert str(route.status) in operation["responses"], (route, sorted(operation["responses"]))
        documented = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
        assert documented == route.path_params, (route, documented)


def test_fuzzing_with_the_admin_token_finds_no_errors(shared_server: Server, tmp_path: Path) -> None:
    log_start = len(shared_server.log())
    proc = run_schemathesis(
        shared_server.base_url + "/api/openapi.json", shared_server.base_url, ADMIN_TOKEN, tmp_path
    )
    assert_clean(proc, shared_server, log_start)


@pytest.mark.parametrize("scope", ["admin.read", "admin.write"])
def test_fuzzing_with_a_scoped_key_finds_no_errors(shared_server: Server, tmp_path: Path, scope: str) -> None:
    # A key lacking a method's scope gets 403s: they must be documented too. The schema is read
    # with the admin token (a write-only key may not read it) and handed to the CLI as a file.
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(openapi(shared_server)))
    _, secret = shared_server.create_key(scope, name=f"fuzz {scope}")
    log_start = len(shared_server.log())
    proc = run_schemathesis(
        str(schema), shared_server.base_url, secret, tmp_path, SCOPED_MAX_EXAMPLES, SCOPED_PHASES
    )
    assert_clean(proc, shared_server, log_start)


def test_deeply_nested_json_body_is_a_400_not_a_500(shared_server: Server) -> None:
    body = b'{"message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = shared_server.fetch("/api/test", "POST", content=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_arguments"

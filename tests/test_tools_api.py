"""The tools API over HTTP (docs/tools.md): off by default, the `tools` scope alone, the listing,
every bound at its edge, streaming, per-key concurrency, time limits, what a command's process
group and environment are, and the audit."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import REPO
from tests.support.mcp_server import start_mcp_server
from tests.support.server import Server, eventually, free_port, start_app, start_server
from vllm_use.runtime import procfs
from vllm_use.tools.base import TRUNCATED

SHELL = "exec_shell_command"
ENABLED = ["get_datetime", "read_file", "write_file", SHELL]  # srv's, in GET /tools order
MARKER = "secret-marker-7f3a91"  # sent in params and printed: must never reach the audit


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tools-root")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Iterator[Server]:
    server = start_server(
        tmp_path_factory.mktemp("tools") / "data",
        "--tools",
        f"{SHELL},write_file,get_datetime,read_file",
        "--tools-root",
        str(root),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(srv: Server) -> str:
    return srv.create_key("tools", name="tools")[1]


def call(server: Any, key: str | None, body: Any, **kw: Any) -> httpx.Response:
    return server.fetch("/tools", "POST", json=body, token=key, **kw)


def shell(server: Any, key: str, command: str, stream: bool = False, timeout: float = 30) -> httpx.Response:
    body: dict[str, Any] = {"tool": SHELL, "params": {"command": command}}
    if stream:
        body["stream"] = True
    return call(server, key, body, timeout=timeout)


def events(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n\n")
    frames = body[:-2].split(b"\n\n")
    assert all(f.startswith(b"data: ") for f in frames), body[:200]
    return [json.loads(f[6:]) for f in frames]


def gone(pgid: int) -> bool:
    return not procfs.group_members(pgid)


def audit_rows(server: Any, key_id: str) -> list[tuple[Any, ...]]:
    """(method, path, status, stream) of the key's audit records, oldest first, from the SQLite file."""
    with sqlite3.connect(f"file:{server.data_dir / 'vllm-use.db'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT method, path, status, stream FROM audit_records WHERE key_id = ? ORDER BY rowid",
            (key_id,),
        ).fetchall()


# --- off by default, and who may call -------------------------------------------------------------


def test_tools_are_off_by_default(tmp_path: Path) -> None:
    app = start_app(tmp_path / "data")
    try:
        secret = app.create_key("tools")[1]
        for token in (secret, None):
            for method, body in (("GET", None), ("POST", {"tool": "get_datetime", "params": {}})):
                r = app.fetch("/tools", method, json=body, token=token)
                assert r.status_code == 404 and "error" in r.json(), r.text
        assert app.fetch("/tools/get_datetime", token=secret).status_code == 404  # never the console
    finally:
        app.stop()


def test_only_a_tools_key_is_a_credential_on_tools(srv: Server, key: str) -> None:
    others = [
        srv.create_key("inference")[1],
        srv.create_key("mcp.admin")[1],
        srv.create_key("admin.read", "admin.write")[1],
        srv.admin_token,
        None,
    ]
    ok = {"tool": "get_datetime", "params": {}}
    assert call(srv, key, ok).status_code == 200
    for token in others:
        for method in ("GET", "POST"):
            r = srv.fetch("/tools", method, json=ok if method == "POST" else None, token=token)
            assert r.status_code == 401 and "error" in r.json(), (token, r.text)
    # mcp.admin manages keys over /mcp, but cannot mint a tools key there
    minted = srv.mcp(
        "tools/call",
        {"name": "api_keys.create", "arguments": {"name": "x", "scopes": ["tools"]}},
        token=others[1],
    ).json()["result"]
    assert minted["isError"] and "managed over /api only" in minted["content"][0]["text"]
    # and a tools key is nothing elsewhere
    assert srv.fetch("/v1/models", token=key).status_code == 401
    assert srv.fetch("/api/keys", token=key).status_code == 401
    assert srv.mcp("tools/list", token=key).status_code == 401


def test_listing_names_exactly_the_enabled_tools(srv: Server, key: str) -> None:
    listed = srv.fetch("/tools", token=key).json()
    assert [t["tool"] for t in listed] == ENABLED
    by_name = {t["tool"]: t for t in listed}
    for name, entry in by_name.items():
        assert set(entry) == {
            "tool",
            "display_name",
            "type",
            "permissions",
            "definition",
            "available",
            "stream",
        }
        assert entry["type"] == "builtin" and entry["available"] is True and entry["display_name"]
        assert entry["definition"]["type"] == "function" and entry["definition"]["function"]["name"] == name
    assert (
        by_name["get_datetime"]["permissions"] == {"write": False}
        and by_name["get_datetime"]["stream"] is False
    )
    assert by_name[SHELL]["permissions"] == {"write": True} and by_name[SHELL]["stream"] is True
    assert by_name["write_file"]["permissions"] == {"write": True}
    assert by_name["read_file"]["permissions"] == {"write": False}


def test_get_datetime_answers_local_and_utc_time(srv: Server, key: str) -> None:
    text = call(srv, key, {"tool": "get_datetime", "params": {}}).json()["plain_text_response"]
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.fullmatch(rf"local: {iso}\nUTC: {iso}", text), text
    assert text.endswith("+00:00")


def test_unknown_tool_and_stream_of_a_tool_that_cannot_are_404(srv: Server, key: str) -> None:
    assert call(srv, key, {"tool": "edit_file", "params": {}}).status_code == 404  # not enabled
    r = call(srv, key, {"tool": "get_datetime", "params": {}, "stream": True})
    assert r.status_code == 404 and "cannot stream" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"params": {}}, "tool"),
        ({"tool": "get_datetime"}, "params"),
        ({"tool": "get_datetime", "params": []}, "params"),
        ({"tool": "get_datetime", "params": {}, "stream": "yes"}, "stream"),
        ({"tool": "get_datetime", "params": {}, "extra": 1}, "extra"),
        ([], "body"),
    ],
)
def test_a_malformed_call_is_400_naming_the_field(srv: Server, key: str, body: Any, field: str) -> None:
    r = call(srv, key, body)
    assert r.status_code == 400 and field in r.json()["error"], r.text


# --- bounds ------------------------------------------------------------------------------------------


def test_params_of_64_kib_pass_and_one_byte_more_is_400(srv: Server, key: str) -> None:
    def params(size: int) -> dict[str, str]:
        command = "printf ok #" + "a" * (size - len('{"command":"printf ok #"}'))
        p = {"command": command}
        assert len(json.dumps(p, separators=(",", ":")).encode()) == size
        return p

    r = call(srv, key, {"tool": SHELL, "params": params(64 * 1024)})
    assert r.json() == {"plain_text_response": "ok\n[exit status 0]"}
    r = call(srv, key, {"tool": SHELL, "params": params(64 * 1024 + 1)})
    assert r.status_code == 400 and "params" in r.json()["error"]


def test_the_body_cap_is_128_kib(srv: Server, key: str) -> None:
    def body(size: int) -> bytes:
        head = b'{"tool":"get_datetime","params":{"x":"'
        return head + b"a" * (size - len(head) - 3) + b'"}}'

    headers = {"Content-Type": "application/json"}
    r = srv.fetch("/tools", "POST", content=body(128 * 1024), token=key, headers=headers)
    assert r.status_code == 400 and "params" in r.json()["error"]  # read whole: only params too big
    r = srv.fetch("/tools", "POST", content=body(128 * 1024 + 1), token=key, headers=headers)
    assert r.status_code == 413


def test_streamed_output_is_cut_past_256_kib(srv: Server, key: str) -> None:
    limit = 256 * 1024
    for size, expected in ((limit, "a" * limit), (limit + 1, "a" * limit + TRUNCATED)):
        r = shell(srv, key, f"head -c {size} /dev/zero | tr '\\0' a", stream=True)
        got = events(r.content)
        assert got[-1] == {"done": True}
        assert "".join(e["chunk"] for e in got[:-1]) == expected


def test_a_plain_answer_is_cut_past_256_kib(srv: Server, key: str) -> None:
    footer = "\n[exit status 0]"
    fits = 256 * 1024 - len(footer)
    text = shell(srv, key, f"head -c {fits} /dev/zero | tr '\\0' a").json()["plain_text_response"]
    assert text == "a" * fits + footer
    text = shell(srv, key, f"head -c {fits + 1} /dev/zero | tr '\\0' a").json()["plain_text_response"]
    assert text == "a" * (fits + 1) + footer[:-1] + TRUNCATED


def test_a_key_runs_4_calls_at_once_and_the_5th_is_429(srv: Server, key: str, root: Path) -> None:
    other = srv.create_key("tools", name="other")[1]
    gates = [root / f"gate-{i}" for i in range(4)]
    for gate in gates:
        os.mkfifo(gate)
    try:
        with ThreadPoolExecutor(4) as pool:
            held = [pool.submit(shell, srv, key, f": > started-{i}; cat gate-{i}") for i in range(4)]
            eventually(lambda: all((root / f"started-{i}").exists() for i in range(4)), timeout=30)
            r = call(srv, key, {"tool": "get_datetime", "params": {}})
            assert r.status_code == 429 and r.headers["Retry-After"] == "1" and "error" in r.json()
            assert call(srv, other, {"tool": "get_datetime", "params": {}}).status_code == 200
            for i, gate in enumerate(gates):
                with open(gate, "w") as g:  # the reader is there (started): opens at once
                    g.write(f"released {i}\n")
            answers = [f.result(timeout=30).json() for f in held]
        assert answers == [{"plain_text_response": f"released {i}\n\n[exit status 0]"} for i in range(4)]
        assert call(srv, key, {"tool": "get_datetime", "params": {}}).status_code == 200
    finally:
        for path in root.glob("gate-*"):
            path.unlink()


# --- file tools ------------------------------------------------------------------------------------


def test_file_tools_write_and_read_inside_the_root_only(
    srv: Server, key: str, root: Path, tmp_path: Path
) -> None:
    r = call(srv, key, {"tool": "write_file", "params": {"path": "notes/a.txt", "content": "héllo\n"}})
    assert r.status_code == 200 and "wrote" in r.json()["plain_text_response"]
    assert (root / "notes" / "a.txt").read_text() == "héllo\n"
    r = call(srv, key, {"tool": "read_file", "params": {"path": "notes/a.txt"}})
    assert r.json() == {"plain_text_response": "héllo\n"}
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    (root / "out-link").symlink_to(outside)
    for path in ("../outside.txt", str(outside), "out-link"):
        r = call(srv, key, {"tool": "read_file", "params": {"path": path}})
        assert r.status_code == 200 and "error" in r.json() and "not yours" not in r.text, (path, r.text)
        assert str(root) not in r.json()["error"]
    r = call(srv, key, {"tool": "write_file", "params": {"path": "../escaped.txt", "content": "x"}})
    assert "error" in r.json() and not (root.parent / "escaped.txt").exists()


# --- exec_shell_command ----------------------------------------------------------------------------


def test_a_stream_is_data_events_then_done(srv: Server, key: str) -> None:
    r = shell(srv, key, "printf 'one\\n'; exit 3", stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert r.content == b'data: {"chunk": "one\\n"}\n\ndata: {"done": true}\n\n'
    assert shell(srv, key, "echo two; exit 3").json() == {"plain_text_response": "two\n\n[exit status 3]"}


def test_a_command_gets_only_the_allowed_environment(srv: Server, key: str, root: Path) -> None:
    text = shell(srv, key, "env; pwd").json()["plain_text_response"]
    lines = text.splitlines()
    env = dict(line.split("=", 1) for line in lines[:-3])
    # PWD is the shell's own (it sets it at start), not inherited.
    assert set(env) == {"PATH", "HOME", "LANG", "TERM", "PWD"}, env
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["HOME"] == str(root.resolve())
    assert env["LANG"] == "C.UTF-8" and env["TERM"] == "dumb"
    assert lines[-3] == str(root.resolve()) and lines[-1] == "[exit status 0]"


def test_a_client_that_leaves_mid_stream_kills_the_process_group(srv: Server, root: Path) -> None:
    kid, key = srv.create_key("tools", name="leaves")
    body = {
        "tool": SHELL,
        "params": {"command": "echo $$ > leave.pgid; sleep 1000 & echo ready; wait"},
        "stream": True,
    }
    with httpx.Client(timeout=30) as client:
        headers = {"Authorization": f"Bearer {key}"}
        with client.stream("POST", srv.base_url + "/tools", json=body, headers=headers) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()  # kept: a dropped iterator closes the response
            assert b"ready" in next(chunks)
            pgid = int((root / "leave.pgid").read_text())
            assert not gone(pgid)
    eventually(lambda: gone(pgid), timeout=10)
    eventually(lambda: audit_rows(srv, kid) == [("POST", f"/tools/{SHELL}", 499, 1)], timeout=10)


def test_a_client_that_leaves_a_plain_call_kills_the_process_group(srv: Server, root: Path) -> None:
    kid, key = srv.create_key("tools", name="leaves plainly")
    payload = json.dumps({"tool": SHELL, "params": {"command": "echo $$ > plain.pgid; sleep 1000"}}).encode()
    host, port = srv.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"POST /tools HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        pgid = int(eventually(lambda: (root / "plain.pgid").exists() and (root / "plain.pgid").read_text()))
        assert not gone(pgid)
    eventually(lambda: gone(pgid), timeout=10)
    eventually(lambda: audit_rows(srv, kid) == [("POST", f"/tools/{SHELL}", 499, 0)], timeout=10)


def test_the_time_limit_kills_the_group_and_answers_an_error(tmp_path: Path) -> None:
    tools_root = tmp_path / "root"
    tools_root.mkdir()
    app = start_app(
        tmp_path / "data", "--tools", SHELL, "--tools-root", str(tools_root), "--tools-timeout", "2"
    )
    try:
        kid, secret = app.create_key("tools")
        r = shell(app, secret, "echo $$ > pgid; sleep 1000 & wait", timeout=30)
        assert r.status_code == 200 and "time limit (2 s)" in r.json()["error"]
        assert gone(int((tools_root / "pgid").read_text()))  # reaped before the answer
        r = shell(app, secret, "sleep 1000", stream=True, timeout=30)
        assert events(r.content) == [
            {"done": True, "error": "the tool did not finish within its time limit (2 s)"}
        ]
        timed_out = [("POST", f"/tools/{SHELL}", 504, 0), ("POST", f"/tools/{SHELL}", 504, 1)]
        eventually(lambda: audit_rows(app, kid) == timed_out, timeout=10)
    finally:
        app.stop()


# --- the console --------------------------------------------------------------------------------------


def test_the_keys_page_makes_a_tools_key_that_works_on_tools(srv: Server, browser: Any) -> None:
    from playwright.sync_api import expect

    from tests.support.browser import signed_in_on

    with signed_in_on(browser, srv.base_url, srv.admin_token or "", "/keys", "API keys") as watched:
        page = watched.page
        box = page.get_by_role("checkbox", name="tools", exact=True)
        expect(box).to_have_accessible_description(re.compile("with exec_shell_command it runs any command"))
        page.get_by_label("Name", exact=True).fill("chat tools")
        box.check()
        page.get_by_role("button", name="Create key").click()
        dialog = page.get_by_role("dialog", name="Your new key")
        secret = dialog.get_by_label("Secret").input_value()
        dialog.get_by_role("button", name="Done").click()
        expect(page.locator("tr", has_text="chat tools")).to_contain_text("tools")
    assert [t["tool"] for t in srv.fetch("/tools", token=secret).json()] == ENABLED


# --- MCP servers' tools ------------------------------------------------------------------------------


def test_mcp_tools_are_listed_and_called_through_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "mcp-e2e-token-0c41d7"
    monkeypatch.setenv("VLLM_USE_TEST_MCP_TOKEN", token)  # the in-process app expands ${…} from here
    with start_mcp_server(title="Notes", required_auth=f"Bearer {token}") as notes:
        config = tmp_path / "mcp.json"
        headers = {"Authorization": "Bearer ${VLLM_USE_TEST_MCP_TOKEN}"}
        down = {"url": f"http://127.0.0.1:{free_port()}/mcp"}
        config.write_text(
            json.dumps({"mcpServers": {"notes": {"url": notes.url, "headers": headers}, "gone": down}})
        )
        config.chmod(0o600)
        app = start_app(tmp_path / "data", "--tools-mcp-config", str(config))
        try:
            secret = app.create_key("tools")[1]
            listed = {t["tool"]: t for t in app.fetch("/tools", token=secret, timeout=60).json()}
            assert listed["notes.echo"]["type"] == "mcp" and listed["notes.echo"]["permissions"] == {
                "write": False
            }
            assert listed["notes.write_note"]["permissions"] == {"write": True}
            assert listed["notes.echo"]["definition"]["function"]["name"] == "notes.echo"
            assert listed["gone.*"]["available"] is False and listed["gone.*"]["error"]
            assert token not in json.dumps(listed)
            r = call(app, secret, {"tool": "notes.add", "params": {"a": 2, "b": 3}}, timeout=60)
            assert r.json() == {"plain_text_response": "5"}
            r = call(app, secret, {"tool": "notes.fail", "params": {"reason": "no"}}, timeout=60)
            assert r.status_code == 200 and "failed on purpose: no" in r.json()["error"]
            assert call(app, secret, {"tool": "gone.*", "params": {}}).status_code == 404
            r = call(app, secret, {"tool": "notes.echo", "params": {"text": "x"}, "stream": True})
            assert r.status_code == 404  # MCP tools do not stream
        finally:
            app.stop()


# --- the audit -------------------------------------------------------------------------------------


def test_calls_are_audited_by_outcome_without_arguments_or_output(srv: Server, key: str) -> None:
    kid, secret = srv.create_key("tools", name="audited")
    assert shell(srv, secret, f"echo {MARKER}").json()["plain_text_response"].startswith(MARKER)
    assert shell(srv, secret, f"echo {MARKER}", stream=True).status_code == 200
    assert call(srv, secret, {"tool": "get_datetime", "params": {"x": MARKER}}).json()["error"]
    assert call(srv, secret, {"tool": "get_datetime", "params": {}, "stream": True}).status_code == 404
    assert call(srv, secret, {"tool": "nope", "params": {}}).status_code == 404  # no tool: no row

    expected = [
        ("POST", f"/tools/{SHELL}", 200, 0),
        ("POST", f"/tools/{SHELL}", 200, 1),
        ("POST", "/tools/get_datetime", 422, 0),
        ("POST", "/tools/get_datetime", 404, 1),
    ]
    eventually(lambda: audit_rows(srv, kid) == expected, timeout=10)
    for path in srv.data_dir.glob("vllm-use.db*"):
        assert MARKER.encode() not in path.read_bytes()


# --- configuration ---------------------------------------------------------------------------------


def refused(tmp_path: Path, *flags: str) -> str:
    """`vllm-use serve` with bad flags: exit status 2, never listening; its stderr."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_use",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "d"),
            *flags,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return result.stderr


def test_bad_tools_flags_stop_the_start_naming_the_option(tmp_path: Path) -> None:
    assert "--tools: unknown tool 'rm_rf'" in refused(tmp_path, "--tools", "get_datetime,rm_rf")
    assert "--tools-root" in refused(tmp_path, "--tools", SHELL)
    assert "--tools-mcp-config" in refused(tmp_path, "--tools-mcp-config", str(tmp_path / "missing.json"))


@pytest.mark.parametrize("where", ["symlink", "data", "inside-data", "around-data", "file", "missing"])
def test_tools_root_must_be_a_real_directory_apart_from_ours(tmp_path: Path, where: str) -> None:
    from vllm_use import config as config_mod
    from vllm_use.errors import ConfigError

    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "afile").write_text("x")
    root = {
        "symlink": tmp_path / "link",
        "data": data,
        "inside-data": data / "models",
        "around-data": tmp_path,
        "file": tmp_path / "afile",
        "missing": tmp_path / "nothing",
    }[where]
    argv = ["serve", "--data-dir", str(data), "--tools", SHELL, "--tools-root", str(root)]
    with pytest.raises(ConfigError) as refused_:
        config_mod.load(config_mod.build_parser().parse_args(argv), {})
    assert "--tools-root" in str(refused_.value)
    argv[-1] = str(real)
    assert config_mod.load(config_mod.build_parser().parse_args(argv), {}).tools_root == real.resolve()


@pytest.mark.parametrize(("value", "ok"), [("1", True), ("3600", True), ("0", False), ("3601", False)])
def test_tools_timeout_is_1_to_3600_seconds(value: str, ok: bool) -> None:
    from vllm_use import config as config_mod
    from vllm_use.errors import ConfigError

    args = config_mod.build_parser().parse_args(["serve", "--tools-timeout", value])
    if ok:
        assert config_mod.load(args, {}).tools_timeout == int(value)
    else:
        with pytest.raises(ConfigError, match="--tools-timeout"):
            config_mod.load(args, {})

"""`GET /api/signin-hint` (handlers/signin.py; docs/auth.md, "Where the admin token is"): public, it
names the admin token's file to a client on this machine and nothing secret to anyone."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from handlers.signin import GENERIC, signin_hint, tells_where
from tests.support.server import start_server
from vllm_use import config as config_mod


def test_a_loopback_client_learns_the_generated_token_files_path_and_how_to_read_it(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", admin_token=None)  # as `make run`: no VLLM_USE_ADMIN_TOKEN
    try:
        r = server.fetch("/api/signin-hint", token=None)
        token_file = tmp_path / "data" / "admin-token"
        token = token_file.read_text().strip()
        assert server.fetch("/api/system", token=token).status_code == 200  # that file's token signs in
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert r.headers["Cache-Control"] == "no-store"
    hint = r.json()
    assert hint["local"] is True and hint["source"] == "file"
    assert hint["path"] == str(token_file)
    read = subprocess.run(shlex.split(hint["read_with"]), capture_output=True, text=True, check=True)
    assert read.stdout.strip() == token  # the command works as written
    assert token not in r.text  # where it is, never what it is


def test_a_token_given_in_the_environment_is_named_as_such_and_never_shown(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")  # VLLM_USE_ADMIN_TOKEN set
    try:
        r = server.fetch("/api/signin-hint", token=None)
    finally:
        server.stop()
    hint = r.json()
    assert hint["source"] == "setting" and hint["path"] is None
    assert "VLLM_USE_ADMIN_TOKEN" in hint["message"]
    assert server.admin_token and server.admin_token not in r.text
    assert not (tmp_path / "data" / "admin-token").exists()


def test_other_verbs_queries_and_bodies_are_refused(shared_server) -> None:
    r = shared_server.fetch("/api/signin-hint", "POST", token=None, json={})
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = shared_server.fetch("/api/signin-hint?path=/etc/passwd", token=None)
    assert r.status_code == 400 and r.json()["error"]["errors"][0]["loc"] == ["path"]
    r = shared_server.fetch(
        "/api/signin-hint", token=None, content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 400 and r.json()["error"]["errors"][0]["loc"] == ["body"]


def test_a_forwarded_request_gets_the_generic_answer_even_from_loopback(shared_server) -> None:
    r = shared_server.fetch("/api/signin-hint", token=None, headers={"X-Forwarded-For": "203.0.113.9"})
    assert r.json() == {"local": False, "source": None, "path": None, "read_with": None, "message": GENERIC}
    assert str(shared_server.data_dir) not in r.text


@pytest.mark.parametrize(
    ("peer", "headers", "local"),
    [
        ("127.0.0.1", {}, True),
        ("127.3.4.5", {}, True),
        ("::1", {}, True),
        ("::ffff:127.0.0.1", {}, True),
        ("192.168.1.20", {}, False),
        ("10.0.0.1", {}, False),
        ("2001:db8::1", {}, False),
        ("::ffff:192.168.1.20", {}, False),
        ("", {}, False),  # a Unix socket: not known to be local
        (None, {}, False),
        ("127.0.0.1", {"Forwarded": "for=198.51.100.7"}, False),
        ("127.0.0.1", {"X-Real-IP": "198.51.100.7"}, False),
    ],
)
def test_only_a_loopback_peer_whose_request_was_not_forwarded_is_local(
    peer: str | None, headers: dict[str, str], local: bool
) -> None:
    assert tells_where(peer, headers) is local


def test_a_client_elsewhere_learns_nothing_of_the_configuration(tmp_path: Path) -> None:
    args = config_mod.build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "secret-place")])
    for environ in ({}, {"VLLM_USE_ADMIN_TOKEN": "env-admin-token-0123456789"}):
        config = config_mod.load(args, environ=environ)
        assert signin_hint(config, local=False) == {
            "local": False,
            "source": None,
            "path": None,
            "read_with": None,
            "message": GENERIC,
        }
        assert signin_hint(config, local=True)["local"] is True


def test_a_token_file_option_names_that_file(tmp_path: Path) -> None:
    token_file = tmp_path / "my token"
    token_file.write_text("file-admin-token-0123456789")
    token_file.chmod(0o600)
    args = config_mod.build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path / "data"), "--admin-token-file", str(token_file)]
    )
    hint = signin_hint(config_mod.load(args, environ={}), local=True)
    assert hint["source"] == "token_file" and hint["path"] == str(token_file)
    assert hint["read_with"] == f"cat '{token_file}'"  # quoted for the shell
    assert "file-admin-token" not in str(hint)

"""The fence of tests/conftest.py holds: nothing a test or its children send leaves loopback, and
what they try is recorded, so that the test fails. Each test here takes back what it provoked."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest

from tests import conftest
from tests.conftest import FENCED_ENV, is_local, sentinel
from tests.support.server import eventually

OUTSIDE = "203.0.113.7"  # TEST-NET-3 (RFC 5737): never a real host, and refused before any packet


def take_back(before: int, record: list[str]) -> list[str]:
    """What `record` got since `before`, removed so that this test does not fail for it."""
    provoked = record[before:]
    del record[before:]
    return provoked


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("0.0.0.0", True),  # noqa: S104 - what a listener binds to
        (None, True),
        (OUTSIDE, False),
        ("10.0.0.1", False),
        ("192.168.1.20", False),
        ("huggingface.co", False),
        ("localhost.example.com", False),
    ],
)
def test_only_loopback_counts_as_local(host: str | None, local: bool) -> None:
    assert is_local(host) is local


def test_this_process_can_neither_resolve_nor_connect_beyond_loopback() -> None:
    before = len(conftest.refused)
    with pytest.raises(OSError, match="no test may reach beyond loopback"):
        socket.getaddrinfo("huggingface.co", 443)
    with pytest.raises(OSError, match="no test may reach beyond loopback"):
        socket.create_connection((OUTSIDE, 80), timeout=1)
    with socket.socket() as s:
        assert s.connect_ex((OUTSIDE, 80)) != 0
    with pytest.raises(httpx.ConnectError):  # as libraries see it: a failed connection
        httpx.get(f"http://{OUTSIDE}/", trust_env=False, timeout=1)
    assert len(take_back(before, conftest.refused)) == 4


def test_loopback_still_works_in_this_process() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
    assert socket.getaddrinfo("localhost", 80)


def test_a_child_reaches_only_the_sentinel_which_records_what_it_asked() -> None:
    before = len(sentinel.asked)
    child = f"import urllib.request\ntry:\n    urllib.request.urlopen('http://{OUTSIDE}/x', timeout=10)\nexcept Exception as exc:\n    print(exc)"
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False
    )
    assert "403" in done.stdout, done.stdout + done.stderr  # the sentinel's answer, through the proxy
    asked = eventually(lambda: sentinel.asked[before:])
    assert asked == [f"a child asked 'GET http://{OUTSIDE}/x HTTP/1.1' for {OUTSIDE}"]
    take_back(before, sentinel.asked)


def test_children_inherit_the_fence() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    env = json.loads(done.stdout)
    assert {name: env.get(name) for name in FENCED_ENV} == FENCED_ENV
    assert env["HF_ENDPOINT"] == sentinel.url and env["HTTPS_PROXY"] == sentinel.url

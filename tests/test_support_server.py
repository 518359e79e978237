"""The test harness's own promise (tests/support/server.py): a server whose port was taken between
`free_port()` and its bind is started again on another port, instead of failing the test."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import server as support


def test_a_port_taken_before_the_bind_is_replaced_by_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: a probe of it is refused at once
        busy = taken.getsockname()[1]
        ports = iter([busy])
        real_free_port = support.free_port
        monkeypatch.setattr(support, "free_port", lambda: next(ports, None) or real_free_port())
        started = support.start_server(tmp_path / "data")
        try:
            assert started.base_url != f"http://127.0.0.1:{busy}"
            assert started.fetch("/healthz").status_code == 200
            assert f"cannot listen on 127.0.0.1:{busy}" in (tmp_path / f"server-{busy}.log").read_text()
        finally:
            started.stop()

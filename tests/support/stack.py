"""A whole vllm-use for the web console: a real server with the fake `vllm` and the real `hf` on a fake hub.

Used by the browser tests (tests/test_console*.py) and by `tools/dev_console.py`, which keeps one
running for working on `static/` by hand. The hub publishes:

- `acme/tiny-chat` (main): config.json, tokenizer.json and a 24 MiB model.safetensors served at
  about 8 MiB/s, so a download shows live progress for a few seconds;
- `acme/instant` (main): a few small files, downloaded at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.fakes import FAKE_VLLM, fake_vllm_bin
from tests.fakes.hub import FakeHub
from tests.support.server import ADMIN_TOKEN, Server, free_port, start_server

HF = str(Path(sys.executable).with_name("hf"))
MiB = 1024 * 1024
SLOW_REPO = "acme/tiny-chat"
FAST_REPO = "acme/instant"


@dataclass
class Stack:
    server: Server
    hub: FakeHub
    runtime_port: int

    @property
    def url(self) -> str:
        return self.server.base_url


def publish(hub: FakeHub) -> None:
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
    hub.add_repo(
        SLOW_REPO,
        {
            "config.json": config,
            "tokenizer.json": b'{"version": "1.0"}',
            "model.safetensors": b"\0" * (24 * MiB),
        },
    )
    hub.slow(SLOW_REPO, "model.safetensors", bytes_per_second=8 * MiB)
    hub.add_repo(FAST_REPO, {"config.json": config, "model.safetensors": b"\1" * 4096})


@contextmanager
def console_stack(
    root: Path,
    *flags: str,
    vllm_knobs: dict[str, object] | None = None,
    vllm_by_name: dict[str, dict[str, object]] | None = None,
    admin_token: str | None = ADMIN_TOKEN,
) -> Iterator[Stack]:
    """Start the hub and the server under `root`; stop both (and the runtime) afterwards.
    `vllm_knobs` are the fake vLLM's FAKE_VLLM_* knobs, `vllm_by_name` more for one served model name
    (tests/fakes/__init__.py `fake_vllm_bin`). `admin_token=None` starts it as `make run` does, with no
    VLLM_USE_ADMIN_TOKEN: the server writes its own token to `<data dir>/admin-token`."""
    if vllm_knobs or vllm_by_name:
        vllm = fake_vllm_bin(root / "bin", by_name=vllm_by_name, **(vllm_knobs or {}))
    else:
        vllm = FAKE_VLLM
    with FakeHub() as hub:
        publish(hub)
        runtime_port = free_port()
        server = start_server(
            root / "data",
            "--vllm-bin",
            str(vllm),
            "--hf-bin",
            HF,
            "--runtime-port",
            str(runtime_port),
            *flags,
            env={"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hfhome")},
            admin_token=admin_token,
        )
        if admin_token is None:  # the server's own, read as the operator would (tests use it to clean up)
            server.admin_token = (root / "data" / "admin-token").read_text().strip()
        try:
            yield Stack(server, hub, runtime_port)
        finally:
            try:
                server.fetch("/api/runtime/stop", "POST")
            finally:
                server.stop()

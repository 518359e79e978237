"""Run a whole vllm-use for working on the web console by hand: `.venv/bin/python tools/dev_console.py`.

It starts the real server with the fake `vllm` (tests/fakes/vllm.py) and the real `hf` CLI against
a fake hub that publishes `acme/tiny-chat` (slow, 24 MiB) and `acme/instant` (see
tests/support/stack.py), prints the console's URL and the admin token, and stops everything on
Ctrl-C. Edit files under static/ and reload the page: they are served as they are.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.stack import console_stack  # noqa: E402


def _interrupt(signum: int, frame: object) -> None:
    """`kill` (SIGTERM) stops it as Ctrl-C does, so the server, the hub and the temp dir go too."""
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: on Ctrl-C)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-use-console-") as tmp, console_stack(Path(tmp)) as stack:
        print(f"console:     {stack.url}/", flush=True)
        print(f"admin token: {stack.server.admin_token}", flush=True)
        print(f"hub:         {stack.hub.url} (acme/tiny-chat, acme/instant)", flush=True)
        deadline = time.monotonic() + opts.seconds if opts.seconds else None
        try:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

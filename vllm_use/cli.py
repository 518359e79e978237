"""`vllm-use serve`: parse options, validate everything, then listen."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

from vllm_use import config as config_mod
from vllm_use.errors import ConfigError

log = logging.getLogger("vllm_use")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """`--loop`: uvloop's C event loop (less CPU per request and per streamed chunk,
    docs/performance.md), or None for asyncio's own. Without uvloop installed, asyncio's, said once."""
    if name != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed: running on asyncio's event loop (--loop asyncio)")
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    args = config_mod.build_parser().parse_args(argv)
    try:
        config = config_mod.load(args)
    except ConfigError as exc:
        print(f"vllm-use: invalid configuration: {exc}", file=sys.stderr)
        return 2
    config_mod.configure_logging(config.log_level, config.log_format)
    for warning in config_mod.start_warnings(config):
        log.warning("%s", warning)
    from vllm_use import app as app_mod

    try:
        context = app_mod.build_context(config)
    except ConfigError as exc:
        print(f"vllm-use: refusing to start: {exc}", file=sys.stderr)
        return 2
    # The event loop shares the GIL with the DB thread and the executor's threads. Python's
    # default 5 ms switch interval lets one of them hold the loop off for up to 5 ms whenever it
    # runs Python code; 1 ms keeps the loop's tail latency (/healthz under load) low (docs/performance.md).
    sys.setswitchinterval(0.001)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
            return runner.run(app_mod.run(context))
    except OSError as exc:
        print(f"vllm-use: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        app_mod.shutdown(context)
        return 1

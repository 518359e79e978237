"""Wiring: build the context from a Config, the Tornado Application, and run until a signal.

Start-up order (everything validated before listening): the connection cap
fitted to the open-file limit → directories made safe → admin token → SQLite
opened and migrated → registry → listen (handlers/server.py). Shutdown on
SIGTERM/SIGINT: stop accepting, let in-flight requests finish briefly, flush
coalesced key usage, close SQLite, exit 0 (non-zero if a final state could not
be persisted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import secrets
import signal
from typing import Any

import tornado.web
from tornado.ioloop import PeriodicCallback

from handlers import api, events, gateway, mcp, metrics, probes, signin, static, tools
from handlers.base import NotFoundJson, log_request
from handlers.server import GuardedHTTPServer, connection_limit
from vllm_use import fsafety
from vllm_use.abilities import build_registry, deployments
from vllm_use.abilities.gpu import gpu_count, list_gpus
from vllm_use.config import Config
from vllm_use.context import AppContext
from vllm_use.deployments.instances import Instances
from vllm_use.downloads.manager import DownloadManager
from vllm_use.errors import ConfigError, CorruptRecord
from vllm_use.executor import Executor
from vllm_use.gateway.audit import AuditWriter
from vllm_use.gateway.live import LiveRequests
from vllm_use.gateway.streams import StreamRegistry
from vllm_use.gateway.upstream import UpstreamPool
from vllm_use.keys.authenticator import FLUSH_S, Authenticator
from vllm_use.keys.limits import KeyLimits
from vllm_use.observability.metrics import Metrics
from vllm_use.recovery import recover
from vllm_use.runtime.lifecycle import Lifecycle
from vllm_use.runtime.supervisor import Supervisor
from vllm_use.storage import Database
from vllm_use.tools.toolbox import Toolbox
from vllm_use.usage import store as usage_store
from vllm_use.usage.ledger import UsageLedger

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 3.0
# A backstop above every handler's own cap (16 MiB on /v1), which refuses first (413); beyond it
# Tornado itself answers 400 and closes.
MAX_BODY_SIZE = 17 * 1024 * 1024
IDLE_CONNECTION_S = 60  # also the time a client has to send a request's headers


def admin_token(config: Config) -> str:
    """The configured token, else `<data-dir>/admin-token` (created 0600 exclusively on first start)."""
    if config.admin_token:
        log.info("admin token: taken from --admin-token / VLLM_USE_ADMIN_TOKEN")
        return config.admin_token
    path = config.bootstrap_token_path
    if not path.exists() and not path.is_symlink():
        fsafety.create_secret_file(path, "vua_" + secrets.token_urlsafe(32), option="--data-dir")
        log.info("admin token: created %s (mode 0600); read it from there", path)
    else:
        log.info("admin token: %s", path)
    return fsafety.read_secret_file(path, option="--data-dir")


def build_context(config: Config) -> AppContext:
    """Synchronous start-up work; raises ConfigError before anything listens.

    The context's config has `max_connections` resolved (`connection_limit`): what was asked
    for, or what the open-file limit allows.
    """
    config = dataclasses.replace(config, max_connections=connection_limit(config.max_connections))
    fsafety.secure_dir(config.data_dir, option="--data-dir")
    fsafety.secure_dir(config.models_dir, option="--models-dir")
    if config.hf_cache_dir:
        fsafety.secure_dir(config.hf_cache_dir, option="--hf-cache-dir")
    token = admin_token(config)
    db = Database(config.db_path)
    db.open()
    try:
        recover(db, config.models_dir)
        downloads = DownloadManager(config, db, stall_after_s=config.download_stall_timeout)
        downloads.prepare()
    except ConfigError:
        db.close()
        raise
    try:
        toolbox = Toolbox.build(config)  # a bad --tools-mcp-config stops the start (docs/tools.md)
    except ConfigError:
        db.close()
        raise
    auth = Authenticator(db, token)
    lifecycle = Lifecycle()
    gpus = gpu_count()
    runtime = Supervisor(config)
    instances = Instances(
        config,
        lifecycle,
        max_loaded=config.max_loaded or max(gpus, 1),
        gpu_count=gpus,
        read_gpus=list_gpus,
        runtime=runtime,
    )
    try:
        instances.set_names(*db.run_sync(deployments.read_catalog, db, config.models_dir))
    except CorruptRecord as exc:  # reported by deployments.list too; the rest of the server runs
        log.warning("deployments are not routed until this is fixed: %s", exc.message)
    usage = UsageLedger()
    app = AppContext(
        config=config,
        db=db,
        auth=auth,
        registry=build_registry(),
        downloads=downloads,
        runtime=runtime,
        audit=AuditWriter(db, config.max_audit_records),
        upstream_pool=UpstreamPool(),
        streams=StreamRegistry(),
        live=LiveRequests(),
        instances=instances,
        metrics=Metrics(),
        limits=KeyLimits(usage, instances),
        usage=usage,
        lifecycle=lifecycle,
        tools=toolbox,
    )
    app.downloads.subscribe(app.metrics.download_event)
    app.lifecycle.add_running_check(app.runtime.is_running)
    app.lifecycle.add_running_check(app.instances.is_running)
    app.instances.loader = lambda name, one_more: deployments.begin_load(app, name, one_more)
    # Today's tokens per key start from the rollups (docs/observability.md, "Token accounting").
    app.usage.seed(app.usage.day, db.query_sync(usage_store.tokens_on, app.usage.day))
    return app


def make_app(app: AppContext) -> tornado.web.Application:
    executor = Executor(app.registry, app)
    common: dict[str, Any] = {"app": app, "executor": executor}
    handlers: list[Any] = []
    handlers += gateway.default_handlers(common)  # first: the hot path matches at the first rules
    handlers += static.health_handlers()  # next: a probe under load is matched at once, not after ~50 rules
    handlers += events.default_handlers(common)  # before /api/downloads/{id}, /api/deployments/{name}
    handlers += api.default_handlers(common)
    handlers += signin.default_handlers(common)  # public: the sign-in page's hint
    handlers += probes.default_handlers(common)  # public: /livez, /readyz
    handlers += mcp.default_handlers(common)
    handlers += tools.default_handlers(common)  # answers 404 itself when the tools are off
    handlers += metrics.default_handlers(common)  # GET /metrics (docs/observability.md)
    # /api, /mcp, /tools and /v1 never fall back to the console.
    handlers += [(r"/(?:api|v1)(?:/.*)?", NotFoundJson, common), (r"/(?:mcp|tools)/.+", NotFoundJson, common)]
    handlers += static.default_handlers()
    # The access line with the request's fields for --log-format json; the text format keeps
    # Tornado's own line, which costs the hot path nothing more.
    logged = {"log_function": log_request} if app.config.log_format == "json" else {}
    return tornado.web.Application(handlers, xheaders=False, compress_response=False, **logged)


def make_server(app: AppContext) -> GuardedHTTPServer:
    """The HTTP server with every connection limit (docs/security.md); call `listen` or
    `add_sockets` on it from the IOLoop."""
    config = app.config
    return GuardedHTTPServer(
        make_app(app),
        max_connections=config.max_connections or connection_limit(None),
        max_body_size=MAX_BODY_SIZE,
        idle_connection_timeout=IDLE_CONNECTION_S,
        body_timeout=config.body_timeout,
    )


async def run(app: AppContext) -> int:
    """Serve until SIGTERM/SIGINT, then shut down cleanly. Returns the exit status."""
    config = app.config
    server = make_server(app)
    server.listen(config.port, address=config.host)
    # Everything built so far lives as long as the process. Moving it out of the cyclic collector's
    # reach makes a full collection scan only what requests allocate: without this, a
    # generation-2 collection stalls the loop for 40-100 ms now and then under load.
    gc.collect()
    gc.freeze()
    # A young-generation collection every 10,000 net allocations instead of 700: what a request
    # allocates mostly dies by reference counting, and collecting 14 times as often only scanned the
    # same live requests again (-46 µs per small request, -47 µs per stream; docs/performance.md).
    gc.set_threshold(10_000, 10, 10)
    loading = asyncio.ensure_future(deployments.load_at_start(app))
    log.info(
        "vllm-use listening on http://%s:%d (at most %d connections)",
        config.host,
        config.port,
        server.max_connections,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    flusher = PeriodicCallback(app.auth.flush_last_used, FLUSH_S * 1000)
    flusher.start()
    app.audit.start()
    app.streams.start_gc()
    await stop.wait()
    log.info("shutting down")
    loading.cancel()  # no deployment starts loading from here
    app.stopping.set()  # event streams end
    app.streams.close()  # attached generations stop
    flusher.stop()
    server.stop()
    persisted = await app.downloads.shutdown()
    try:
        await app.runtime.shutdown()
        await app.instances.shutdown()
    except Exception:
        log.exception("could not stop the runtime cleanly")
        persisted = False
    try:
        await asyncio.wait_for(server.close_all_connections(), SHUTDOWN_GRACE_S)
    except TimeoutError:
        log.warning("some connections did not close within %.0f s", SHUTDOWN_GRACE_S)
    app.upstream_pool.close()  # idle upstream keep-alive connections
    if app.tools is not None:
        await app.tools.close()  # the MCP servers' sessions
    status = shutdown(app)
    return status if persisted else 1


def shutdown(app: AppContext) -> int:
    status = 0 if app.audit.flush_sync() else 1
    try:
        app.auth.flush_last_used_sync()
    except Exception:
        log.exception("could not persist key usage times")
        status = 1
    app.auth.close()
    app.db.close()
    log.info("stopped")
    return status

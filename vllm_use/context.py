"""The application context handed to abilities and handlers (no module globals)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_use.config import Config
from vllm_use.lifecycle import Lifecycle
from vllm_use.scopes import Identity, Surface

if TYPE_CHECKING:
    from vllm_use.auth import Authenticator
    from vllm_use.downloads.manager import DownloadManager
    from vllm_use.gateway.audit import AuditWriter
    from vllm_use.gateway.streams import StreamRegistry
    from vllm_use.gateway.upstream import PooledClient
    from vllm_use.registry import Registry
    from vllm_use.runtime.supervisor import Supervisor
    from vllm_use.storage import Database


@dataclass
class AppContext:
    """Everything long-lived: configuration, storage, auth, the registry."""

    config: Config
    db: Database
    auth: Authenticator
    registry: Registry
    downloads: DownloadManager
    runtime: Supervisor
    audit: AuditWriter
    gateway_client: PooledClient
    streams: StreamRegistry
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)

    def upstream_origin(self) -> str:
        """The gateway's upstream: --upstream if given, else the runtime's current port (S4.3)."""
        if self.config.upstream_explicit:
            return self.config.upstream
        child = self.runtime.child
        return f"http://127.0.0.1:{child.port if child else self.config.runtime_port}"


@dataclass(frozen=True)
class Call:
    """One executor call: the app, who is calling, and over which surface."""

    app: AppContext
    identity: Identity
    surface: Surface

"""The application context handed to abilities and handlers (no module globals)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_use.config import Config
from vllm_use.errors import ModelNotFound, ModelNotLoaded, UpstreamUnavailable
from vllm_use.runtime.lifecycle import Lifecycle
from vllm_use.runtime.supervisor import RuntimeState
from vllm_use.scopes import Identity, Surface
from vllm_use.usage.ledger import UsageLedger

if TYPE_CHECKING:
    from vllm_use.deployments.instances import Instances
    from vllm_use.downloads.manager import DownloadManager
    from vllm_use.gateway.audit import AuditWriter
    from vllm_use.gateway.live import LiveRequests
    from vllm_use.gateway.streams import StreamRegistry
    from vllm_use.gateway.upstream import UpstreamPool
    from vllm_use.keys.authenticator import Authenticator
    from vllm_use.keys.limits import KeyLimits
    from vllm_use.observability.metrics import Metrics
    from vllm_use.registry import Registry
    from vllm_use.runtime.supervisor import Supervisor
    from vllm_use.storage import Database
    from vllm_use.tools.toolbox import Toolbox


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
    upstream_pool: UpstreamPool
    streams: StreamRegistry
    live: LiveRequests  # open /v1 requests by key id, closed when the key is revoked
    instances: Instances  # the deployments' vLLM children (docs/router.md)
    metrics: Metrics  # GET /metrics and dashboard.get's traffic (docs/observability.md)
    limits: KeyLimits  # the keys' model lists and limits at /v1 (docs/observability.md)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    tools: Toolbox | None = None  # /tools: None when off (docs/tools.md)
    usage: UsageLedger = field(default_factory=UsageLedger)  # today's tokens per key
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)

    def upstream_origin(self) -> str:
        """Where /v1 forwards, for runtime.status: --upstream if given, else the runtime's port."""
        if self.config.upstream_explicit:
            return self.config.upstream
        child = self.runtime.child
        return f"http://127.0.0.1:{child.port if child else self.config.runtime_port}"

    def upstream_target(self, model: str | None = None) -> tuple[str, str | None]:
        """The origin the gateway relays to now and the Bearer key to inject there.

        A `model` that names a deployment (or one of its aliases) goes to that deployment's
        instance when it is ready, else nowhere: Conflict (409), nothing is sent (docs/router.md).
        Any other model: with an explicit --upstream, that origin and --upstream-api-key, as
        configured; otherwise only the runtime's supervised child in state `ready`, with its own key
        (docs/runtime.md): a port whose child is starting, failed or gone may already belong to
        another process, so nothing is sent there. Once deployments exist, a name that is none of
        theirs is ModelNotFound (404) unless the runtime runs a path (runtime.start), whose names
        only vLLM knows. Raises before any connection is attempted: `UpstreamUnavailable` (502)
        when nothing runs.
        """
        deployment = self.instances.deployment_of(model)
        if deployment is not None:
            found = self.instances.target(deployment)
            if found is None:
                raise ModelNotLoaded(
                    f"the model {model} is not loaded: load the deployment {deployment} with "
                    "deployments.load (POST /api/deployments/{name}/load)"
                )
            return found
        if self.config.upstream_explicit:
            return self.config.upstream, self.config.upstream_api_key
        child = self.runtime.child
        serves_a_path = self.instances.runtime_name is None  # runtime.start: names we don't know
        if child is not None and self.runtime.state is RuntimeState.READY and serves_a_path:
            return f"http://127.0.0.1:{child.port}", child.api_key
        if model is not None and self.instances.names:  # router mode: the names are ours to know
            raise ModelNotFound.unknown(model)
        if child is None or self.runtime.state is not RuntimeState.READY:
            raise UpstreamUnavailable(
                f"no model is running: start one with runtime.switch (the runtime is {self.runtime.state})"
            )
        return f"http://127.0.0.1:{child.port}", child.api_key


@dataclass(frozen=True)
class Call:
    """One executor call: the app, who is calling, and over which surface."""

    app: AppContext
    identity: Identity
    surface: Surface

"""Scopes, surfaces and identities: who may call what, decided in one place (docs/security.md).

A credential is first checked against the *surface* it arrives on (admin HTTP
`/api`, MCP `/mcp`, gateway `/v1`, tools `/tools`, metrics `/metrics`): one with no scope for that surface is not a
credential there at all (401). Then the method's scope for that surface decides
(403 on /api, "unknown tool" on /mcp). No scope crosses surfaces, and
`admin.write` does not imply `admin.read`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Surface(enum.StrEnum):
    API = "api"
    MCP = "mcp"
    GATEWAY = "gateway"
    TOOLS = "tools"
    METRICS = "metrics"


class Scope(enum.StrEnum):
    ADMIN_READ = "admin.read"
    ADMIN_WRITE = "admin.write"
    MCP_READ = "mcp.read"
    MCP_MODELS = "mcp.models"
    MCP_RUNTIME = "mcp.runtime"
    MCP_ADMIN = "mcp.admin"
    INFERENCE = "inference"
    TOOLS = "tools"  # POST /tools: run the enabled tools (docs/tools.md); implied by no other scope
    METRICS = "metrics"  # GET /metrics: read counters and vLLM's metrics (docs/observability.md)


SURFACE_SCOPES: dict[Surface, frozenset[Scope]] = {
    Surface.API: frozenset({Scope.ADMIN_READ, Scope.ADMIN_WRITE}),
    Surface.MCP: frozenset({Scope.MCP_READ, Scope.MCP_MODELS, Scope.MCP_RUNTIME, Scope.MCP_ADMIN}),
    Surface.GATEWAY: frozenset({Scope.INFERENCE}),
    Surface.TOOLS: frozenset({Scope.TOOLS}),
    Surface.METRICS: frozenset({Scope.METRICS}),
}

ALL_SCOPES: frozenset[str] = frozenset(s.value for s in Scope)


@dataclass(frozen=True)
class MethodScope:
    """The scope a method needs on each surface; `None` means not offered there."""

    api: Scope | None
    mcp: Scope | None

    def for_surface(self, surface: Surface) -> Scope | None:
        return self.api if surface is Surface.API else self.mcp if surface is Surface.MCP else None


READ = MethodScope(api=Scope.ADMIN_READ, mcp=Scope.MCP_READ)
KEYS_READ = MethodScope(api=Scope.ADMIN_READ, mcp=Scope.MCP_ADMIN)
ADMIN_WRITE = MethodScope(api=Scope.ADMIN_WRITE, mcp=Scope.MCP_ADMIN)
MODELS_WRITE = MethodScope(api=Scope.ADMIN_WRITE, mcp=Scope.MCP_MODELS)
RUNTIME_WRITE = MethodScope(api=Scope.ADMIN_WRITE, mcp=Scope.MCP_RUNTIME)


@dataclass(frozen=True)
class KeyPolicy:
    """What a key may use, beyond its scopes (docs/observability.md, "Key limits"): the models it
    may name (deployment names or aliases; None: any) and its limits (None: no limit)."""

    models: frozenset[str] | None = None
    rpm: int | None = None  # requests per minute, a moving window
    max_concurrent: int | None = None  # requests at once
    tokens_per_day: int | None = None  # prompt + completion tokens per UTC day


@dataclass(frozen=True)
class Identity:
    """An authenticated caller. `key_id` is None for the bootstrap admin token.

    `expires_at` (unix ms) is checked on every request, cached or not (docs/auth.md); `policy` is
    None for a key without a model list or limits, so such a key costs the gateway one attribute
    check."""

    kind: str  # "admin_token" | "api_key"
    key_id: str | None
    scopes: frozenset[Scope]
    expires_at: int | None = None
    policy: KeyPolicy | None = None

    @property
    def label(self) -> str:
        return self.key_id or "admin-token"

    def valid_on(self, surface: Surface) -> bool:
        """Whether this is a credential on `surface` at all (else 401 there)."""
        if self.kind == "admin_token":
            return surface is Surface.API
        return bool(self.scopes & SURFACE_SCOPES[surface])

    def may_call(self, scope: MethodScope, surface: Surface, *, public: bool = False) -> bool:
        """Fail-closed: unknown surface, no scope for it, or missing scope → False."""
        if not self.valid_on(surface):
            return False
        if public:
            return True
        needed = scope.for_surface(surface)
        if needed is None:
            return False
        if self.kind == "admin_token":
            return surface is Surface.API
        if surface is Surface.MCP and Scope.MCP_ADMIN in self.scopes:
            return True
        return needed in self.scopes


ADMIN_TOKEN_IDENTITY = Identity(kind="admin_token", key_id=None, scopes=frozenset())

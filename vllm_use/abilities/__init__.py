"""Ability modules, registered explicitly and in order (no import-time magic).

Each module holds its methods as module-level functions `async def name(call, args)` (importable,
testable, found by go-to-definition) and a `register(registry)` that adds them, each with its
name, description, input and output models and scope; `register_all` calls the modules in the
order listings show them.
"""

from __future__ import annotations

from vllm_use.abilities import (
    api_keys,
    deployments,
    downloads,
    gpu,
    models,
    requests,
    runtime,
    settings,
    streams,
    system,
    usage,
)
from vllm_use.registry import Registry


def register_all(registry: Registry) -> Registry:
    system.register(registry)
    gpu.register(registry)
    models.register(registry)
    downloads.register(registry)
    runtime.register(registry)
    deployments.register(registry)
    api_keys.register(registry)
    settings.register(registry)
    requests.register(registry)
    streams.register(registry)
    usage.register(registry)
    return registry


def build_registry() -> Registry:
    return register_all(Registry())

"""Ability modules, registered explicitly and in order (no import-time magic).

Each module has `register(registry)`; `register_all` calls them in the order
listings show them. Later issues add models, downloads and runtime here.
"""

from __future__ import annotations

from vllm_use.abilities import (
    api_keys,
    downloads,
    gpu,
    models,
    requests,
    runtime,
    settings,
    streams,
    system,
)
from vllm_use.registry import Registry


def register_all(registry: Registry) -> Registry:
    system.register(registry)
    gpu.register(registry)
    models.register(registry)
    downloads.register(registry)
    runtime.register(registry)
    api_keys.register(registry)
    settings.register(registry)
    requests.register(registry)
    streams.register(registry)
    return registry


def build_registry() -> Registry:
    return register_all(Registry())

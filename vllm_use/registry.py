"""The method registry: each ability method declared once (docs/architecture.md, "Adding a method").

A `SupportedMethod` carries its name (the MCP tool name), description, one
pydantic input model (its JSON Schema is what /api, OpenAPI and MCP publish),
an optional output model, the scope it needs per surface, and `execute`.
Adapters never call `execute` themselves: they go through `Executor.call`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from vllm_use.scopes import MethodScope

if TYPE_CHECKING:
    from vllm_use.context import Call

_NAME = re.compile(r"[a-z][a-z_]*(\.[a-z][a-z_]*)*")


class Args(BaseModel):
    """Base of every input model: unknown fields refused, no type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NoArgs(Args):
    """A method without arguments."""


class Result(BaseModel):
    """Base of every output model (documentation and OpenAPI/MCP output schemas)."""

    model_config = ConfigDict(extra="forbid")


Execute = Callable[["Call", Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class SupportedMethod:
    name: str
    description: str
    input: type[Args]
    output: type[BaseModel]
    scope: MethodScope
    execute: Execute
    public: bool = False

    def input_schema(self) -> dict[str, Any]:
        return self.input.model_json_schema()

    def output_schema(self) -> dict[str, Any]:
        return self.output.model_json_schema(mode="serialization")


class Registry:
    """Name → method. Registration order is kept (it is the order of listings)."""

    def __init__(self) -> None:
        self._methods: dict[str, SupportedMethod] = {}

    def add(self, method: SupportedMethod) -> None:
        if not _NAME.fullmatch(method.name):
            raise ValueError(f"bad method name {method.name!r}")
        if method.name in self._methods:
            raise ValueError(f"method {method.name!r} registered twice")
        if method.public and method.name != "test":
            raise ValueError("only `test` is public")
        self._methods[method.name] = method

    def method(
        self,
        name: str,
        description: str,
        input: type[Args],
        output: type[BaseModel],
        scope: MethodScope,
        *,
        public: bool = False,
    ) -> Callable[[Execute], Execute]:
        """`registry.method(name, …)(fn)`: how an ability module's `register` adds its module-level
        functions (`add` with the parts spelled out)."""

        def wrap(fn: Execute) -> Execute:
            self.add(SupportedMethod(name, description, input, output, scope, fn, public))
            return fn

        return wrap

    def get(self, name: str) -> SupportedMethod | None:
        return self._methods.get(name)

    def __iter__(self) -> Iterator[SupportedMethod]:
        return iter(self._methods.values())

    def __len__(self) -> int:
        return len(self._methods)

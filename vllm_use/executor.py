"""The executor: the one path every call takes (docs/architecture.md).

lookup → scope check (fail closed) → argument validation → execute → one log
line. REST and MCP adapters translate their transport into `Executor.call` and
back; they never check scopes or touch the database themselves.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from pydantic import BaseModel, ValidationError

from vllm_use.context import AppContext, Call
from vllm_use.errors import InvalidArguments, NotFound, PermissionDenied, VllmUseError
from vllm_use.registry import Registry, SupportedMethod
from vllm_use.scopes import Identity, Surface

log = logging.getLogger(__name__)


def validation_error(exc: ValidationError, model: type[BaseModel] | None = None) -> InvalidArguments:
    """Field paths and messages only: input values (maybe secrets) are never echoed.

    A regex mismatch is explained with the field's description (pydantic would quote the
    pattern, which tells a person in a browser nothing).
    """
    errors = [{"loc": list(e["loc"]), "msg": _readable(e, model), "type": e["type"]} for e in exc.errors()]
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "(body)"
    return InvalidArguments(f"invalid arguments: {where}: {first['msg']}", errors=errors)


def _readable(error: Any, model: type[BaseModel] | None) -> str:
    if error["type"] == "string_pattern_mismatch" and model is not None and error["loc"]:
        description = _description_at(_schema(model), list(error["loc"]))
        if description:
            return f"not of the expected form: {description}"
    return error["msg"]


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()  # built once per arguments model, not per bad request


def _description_at(schema: dict[str, Any], loc: list[Any]) -> str | None:
    """The description of the schema node at `loc` (field names and list indexes), following
    `$ref`s into `$defs` and the branches of an optional (`X | None`) on the way."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> list[dict[str, Any]]:
        if "$ref" in node:
            return resolve(defs.get(node["$ref"].rsplit("/", 1)[-1], {}))
        return [node, *(n for alt in node.get("anyOf", []) for n in resolve(alt))]

    nodes = [schema]
    for part in loc:
        step: list[dict[str, Any]] = []
        for node in (n for candidate in nodes for n in resolve(candidate)):
            if isinstance(part, int) and "items" in node:
                step.append(node["items"])
            elif isinstance(part, str) and part in node.get("properties", {}):
                step.append(node["properties"][part])
        if not step:
            return None
        nodes = step
    for node in nodes:
        for candidate in resolve(node):
            if candidate.get("description"):
                return candidate["description"]
    return None


class Executor:
    def __init__(self, registry: Registry, app: AppContext) -> None:
        self.registry = registry
        self.app = app

    def allowed(self, method: SupportedMethod, identity: Identity | None, surface: Surface) -> bool:
        return identity is not None and identity.may_call(method.scope, surface, public=method.public)

    def visible(self, identity: Identity | None, surface: Surface) -> list[SupportedMethod]:
        return [m for m in self.registry if self.allowed(m, identity, surface)]

    async def call(
        self, name: str, args: dict[str, Any] | None, identity: Identity | None, surface: Surface
    ) -> dict[str, Any]:
        """Run method `name` for `identity` arriving on `surface`. Runs on the IOLoop."""
        started = time.perf_counter()
        who = identity.label if identity else "-"
        outcome = "ok"
        try:
            method = self.registry.get(name)
            if method is None:
                raise NotFound(f"unknown method {name!r}")
            if not self.allowed(method, identity, surface):
                raise PermissionDenied(f"this credential may not call {name}")
            try:
                parsed = method.input.model_validate({} if args is None else args)
            except ValidationError as exc:
                raise validation_error(exc, method.input) from None
            assert identity is not None
            return await method.execute(Call(self.app, identity, surface), parsed)
        except VllmUseError as exc:
            outcome = exc.code
            raise
        except Exception:
            outcome = "internal_error"
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            level = logging.INFO if outcome == "ok" else logging.WARNING
            log.log(
                level,
                "method=%s key_id=%s surface=%s outcome=%s ms=%.1f",
                name,
                who,
                surface,
                outcome,
                elapsed,
                # the same, as fields of --log-format json (vllm_use/jsonlog.py)
                extra={
                    "method": name,
                    "key_id": who,
                    "surface": str(surface),
                    "outcome": outcome,
                    "ms": round(elapsed, 1),
                },
            )

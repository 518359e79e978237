"""The admin HTTP surface `/api`: the route table (docs/api_methods.md), one generic handler, methods,
OpenAPI.

Routes are data: each `Route` maps a verb and a path to a registry method and
says where its arguments come from (path, declared query parameters, a JSON
body). `RouteHandler` turns the request into `executor.call(...)` and the
result into JSON; it never checks scopes or touches the database itself.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

import tornado.web

from handlers.base import JsonHandler
from vllm_use.errors import InvalidArguments, VllmUseError
from vllm_use.scopes import MethodScope, Scope, Surface


@dataclass(frozen=True)
class Route:
    verb: str
    path: str  # "/api/keys/{id}"
    method: str  # registry name
    status: int = 200
    body: str | None = None  # None (no body), "object" (the arguments) or "field:<name>" (a JSON value)
    query: tuple[str, ...] = ()
    # (result state, HTTP status) pairs: a success whose `state` is listed answers that status
    # instead of `status`, e.g. 202 while the work it began goes on.
    status_by_state: tuple[tuple[str, int], ...] = ()

    def status_for(self, result: dict[str, Any]) -> int:
        """The HTTP status of a successful call that returned `result`."""
        return dict(self.status_by_state).get(result.get("state"), self.status)

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)

    @property
    def pattern(self) -> str:
        return re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path) + "/?"


# Start, switch and restart: the arguments in the body, the bounded `?wait=` seconds in the query,
# and 202 while vLLM is still loading (docs/runtime.md).
BEGINS_A_START: dict[str, Any] = {
    "body": "object",
    "query": ("wait",),
    "status_by_state": (("starting", 202),),
}

ROUTES: tuple[Route, ...] = (
    Route("POST", "/api/test", "test", body="object"),
    Route("GET", "/api/system", "system.get"),
    Route("GET", "/api/dashboard", "dashboard.get"),
    Route("GET", "/api/mcp", "mcp.status"),
    Route("GET", "/api/gpus", "gpu.list"),
    Route("GET", "/api/models", "models.list"),
    Route("GET", "/api/models/{id}", "models.get"),
    Route("POST", "/api/models", "models.add", status=201, body="object"),
    Route("POST", "/api/models/local", "models.register_local", status=201, body="object"),
    Route("POST", "/api/models/huggingface", "models.register_huggingface", status=201, body="object"),
    Route("POST", "/api/models/scan", "models.scan"),
    Route("DELETE", "/api/models/{id}", "models.delete", query=("files",)),
    Route("GET", "/api/downloads", "downloads.list"),
    Route("POST", "/api/downloads", "downloads.start", status=201, body="object"),
    Route("GET", "/api/downloads/{id}", "downloads.status"),
    Route("GET", "/api/downloads/{id}/logs", "downloads.logs", query=("tail",)),
    Route("POST", "/api/downloads/{id}/cancel", "downloads.cancel"),
    Route("POST", "/api/downloads/{id}/retry", "downloads.retry", body="object"),
    Route("GET", "/api/runtime", "runtime.status"),
    Route("GET", "/api/runtime/logs", "runtime.logs", query=("tail",)),
    Route("POST", "/api/runtime/start", "runtime.start", **BEGINS_A_START),
    Route("POST", "/api/runtime/restart", "runtime.restart", **BEGINS_A_START),
    Route("POST", "/api/runtime/switch", "runtime.switch", **BEGINS_A_START),
    Route("POST", "/api/runtime/stop", "runtime.stop"),
    Route("GET", "/api/deployments", "deployments.list"),
    Route("POST", "/api/deployments", "deployments.create", status=201, body="object"),
    Route("GET", "/api/deployments/{name}", "deployments.get"),
    Route("PATCH", "/api/deployments/{name}", "deployments.update", body="object"),
    Route("DELETE", "/api/deployments/{name}", "deployments.delete"),
    Route(
        "POST",
        "/api/deployments/{name}/load",
        "deployments.load",
        query=("wait",),
        status_by_state=(("starting", 202),),
    ),
    Route("POST", "/api/deployments/{name}/unload", "deployments.unload"),
    Route("GET", "/api/deployments/{name}/logs", "deployments.logs", query=("tail",)),
    Route(
        "POST",
        "/api/deployments/{name}/sleep",
        "deployments.sleep",
        query=("wait",),
        status_by_state=(("sleeping", 202),),
    ),
    Route(
        "POST",
        "/api/deployments/{name}/wake",
        "deployments.wake",
        query=("wait",),
        status_by_state=(("waking", 202), ("starting", 202)),
    ),
    Route("GET", "/api/keys", "api_keys.list"),
    Route("POST", "/api/keys", "api_keys.create", status=201, body="object"),
    Route("PATCH", "/api/keys/{id}", "api_keys.update", body="object"),
    Route("POST", "/api/keys/{id}/enable", "api_keys.enable"),
    Route("POST", "/api/keys/{id}/disable", "api_keys.disable"),
    Route("DELETE", "/api/keys/{id}", "api_keys.delete"),
    Route("GET", "/api/settings", "settings.list"),
    Route("PUT", "/api/settings", "settings.update", body="field:settings"),
    Route("DELETE", "/api/settings/{key}", "settings.delete"),
    Route(
        "GET",
        "/api/requests/recent",
        "requests.recent",
        query=("limit", "key_id", "model", "status", "since", "until"),
    ),
    Route("GET", "/api/streams", "streams.list", query=("key_id",)),
    Route("GET", "/api/usage", "usage.summary", query=("since", "until", "key_id", "deployment")),
    Route("POST", "/api/streams/cancel", "streams.cancel", body="object"),
)

# Not registry methods: listings of the registry itself, for admin.read.
META_SCOPE = MethodScope(api=Scope.ADMIN_READ, mcp=None)


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_EMPTY_OBJECT = re.compile(rb"[ \t\r\n]*\{[ \t\r\n]*\}[ \t\r\n]*")


def _coerce_query(annotation: Any, name: str, raw: str) -> Any:
    """Query strings → the field's JSON type (the input models are strict)."""
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation
    if isinstance(base, types.UnionType) or typing.get_origin(base) is typing.Union:
        non_none = [a for a in typing.get_args(base) if a is not type(None)]
        base = non_none[0] if len(non_none) == 1 else base
    if base is bool:
        if raw not in ("true", "false"):
            raise InvalidArguments(
                f"invalid arguments: {name}: expected true or false", errors=[{"loc": [name]}]
            )
        return raw == "true"
    if base is int:
        if not re.fullmatch(r"-?[0-9]{1,18}", raw):
            raise InvalidArguments(
                f"invalid arguments: {name}: expected an integer", errors=[{"loc": [name]}]
            )
        return int(raw)
    return raw


@tornado.web.stream_request_body
class RouteHandler(JsonHandler):
    """Serves every verb of one path of the route table."""

    def initialize(self, routes: dict[str, Route], **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.routes = routes

    async def _dispatch(self, **path_args: str) -> None:
        route = self.routes.get(self.request.method or "")
        if route is None:
            raise tornado.web.HTTPError(405)
        try:
            args = self._arguments(route, path_args)
            result = await self.executor.call(route.method, args, self.identity, Surface.API)
        except VllmUseError as exc:
            self.fail(exc)
            return
        self.write_json(result, route.status_for(result))

    def _arguments(self, route: Route, path_args: dict[str, str]) -> dict[str, Any]:
        method = self.executor.registry.get(route.method)
        assert method is not None, route.method
        args: dict[str, Any] = {}
        body = self.body
        if route.body and body.strip():
            try:
                value = json.loads(body, parse_constant=_not_json)
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                raise InvalidArguments(
                    "invalid arguments: the body is not valid JSON", errors=[{"loc": ["body"]}]
                ) from None
            if route.body == "object":
                if not isinstance(value, dict):
                    raise InvalidArguments(
                        "invalid arguments: the body must be a JSON object", errors=[{"loc": ["body"]}]
                    )
                for name in route.query:  # one place for each argument, as OpenAPI documents it
                    if name in value:
                        raise InvalidArguments(
                            f"invalid arguments: {name} goes in the query (?{name}=…), not the body",
                            errors=[{"loc": [name]}],
                        )
                args.update(value)
            else:
                args[route.body.removeprefix("field:")] = value
        elif body.strip() and not _EMPTY_OBJECT.fullmatch(body):
            # A method without arguments takes no body or `{}` (what many clients send), nothing else.
            raise InvalidArguments(
                "invalid arguments: this route takes no body (or {})", errors=[{"loc": ["body"]}]
            )
        for name, values in self.request.query_arguments.items():
            if name not in route.query:
                raise InvalidArguments(
                    f"invalid arguments: unknown query parameter {name!r}", errors=[{"loc": [name]}]
                )
            if len(values) != 1:
                raise InvalidArguments(
                    f"invalid arguments: {name} given more than once", errors=[{"loc": [name]}]
                )
            field = method.input.model_fields[name]
            args[name] = _coerce_query(field.annotation, name, values[0].decode("utf-8", "replace"))
        for name, value in path_args.items():
            if name in args:
                raise InvalidArguments(
                    f"invalid arguments: {name} is given in the path", errors=[{"loc": [name]}]
                )
            args[name] = value
        return args

    get = post = put = patch = delete = _dispatch

    def allowed_verbs(self) -> list[str]:
        return list(self.routes)


@tornado.web.stream_request_body
class MetaHandler(JsonHandler):
    """`GET /api/methods` and `GET /api/openapi.json`."""

    required = META_SCOPE

    def initialize(self, document: str, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.document = document

    def get(self) -> None:
        if self.document == "openapi":
            from handlers.openapi import openapi_document

            self.write_json(openapi_document(self.executor.registry, ROUTES))
        else:
            self.write_json({"methods": describe_methods(self.executor.registry)})


def describe_methods(registry: Any) -> list[dict[str, Any]]:
    routes = {r.method: f"{r.verb} {r.path}" for r in ROUTES}
    return [
        {
            "name": m.name,
            "description": m.description,
            "public": m.public,
            "scope": {"api": m.scope.api, "mcp": m.scope.mcp},
            "route": routes.get(m.name),
            "input_schema": m.input_schema(),
            "output_schema": m.output_schema(),
        }
        for m in registry
    ]


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    by_path: dict[str, dict[str, Route]] = {}
    for route in ROUTES:
        by_path.setdefault(route.pattern, {})[route.verb] = route
    handlers: list[tuple[str, type, dict[str, Any]]] = [
        (r"/api/methods/?", MetaHandler, {"document": "methods", **common}),
        (r"/api/openapi\.json", MetaHandler, {"document": "openapi", **common}),
    ]
    # Literal paths first: /api/models/local must not be taken for /api/models/{id}.
    ordered = sorted(by_path.items(), key=lambda item: "(?P<" in item[0])
    handlers += [(pattern, RouteHandler, {"routes": verbs, **common}) for pattern, verbs in ordered]
    return handlers

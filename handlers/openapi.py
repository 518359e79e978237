"""`GET /api/openapi.json`: OpenAPI 3.1 generated from the registry and the route table.

Input and output models are emitted once under `components/schemas` (pydantic
writes them with `$ref`s there); each operation takes its path and query
parameters and its body from the method's input model, so the document cannot
drift from what the handler validates.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from pydantic.json_schema import models_json_schema

from vllm_use import __version__
from vllm_use.registry import Registry

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
ERROR_STATUSES = {
    "400": "Invalid arguments (the field path is in error.errors[].loc)",
    "401": "Missing or invalid credentials",
    "403": "The credential lacks the scope this method needs",
    "404": "Unknown resource",
    "409": "Lifecycle conflict",
    "413": "Body too large",
    "422": "vLLM refused to start with what it was given: start_refused (its options or the model's "
    "files; vLLM's reason in the message, last_lines attached)",
    "500": "Internal error",
    "502": "A child failed: runtime_failed (vLLM exited, was not healthy in time or lost its port; "
    "last_lines attached), upstream_unavailable",
}
REF = "#/components/schemas/{model}"


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
    }


def openapi_document(registry: Registry, routes: tuple[Any, ...]) -> dict[str, Any]:
    return copy.deepcopy(_build(registry, routes))


@cache
def _build(registry: Registry, routes: tuple[Any, ...]) -> dict[str, Any]:
    methods = {m.name: m for m in registry}
    models = [(m.input, "validation") for m in methods.values()]
    models += [(m.output, "serialization") for m in methods.values()]
    refs, defs = models_json_schema(models, ref_template=REF)
    schemas = dict(defs.get("$defs", {}))
    schemas["Error"] = ERROR_SCHEMA
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        method = methods[route.method]
        input_schema = schemas[refs[(method.input, "validation")]["$ref"].rsplit("/", 1)[1]]
        properties = input_schema.get("properties", {})
        required = set(input_schema.get("required", []))
        params = [
            {"name": name, "in": "path", "required": True, "schema": properties[name]}
            for name in route.path_params
        ]
        params += [
            {"name": name, "in": "query", "required": name in required, "schema": properties[name]}
            for name in route.query
        ]
        output = {"application/json": {"schema": refs[(method.output, "serialization")]}}
        successes = {str(route.status): {"description": "Success", "content": output}}
        for state, code in route.status_by_state:  # the same document, answered while work goes on
            successes[str(code)] = {
                "description": f"Accepted: the work goes on (state {state}); the body is the same document",
                "content": output,
            }
        operation: dict[str, Any] = {
            "operationId": route.method.replace(".", "_"),
            "summary": method.name,
            "description": method.description,
            "parameters": params,
            "responses": {
                **successes,
                **{code: _error_response(text) for code, text in ERROR_STATUSES.items()},
            },
        }
        if route.body:
            taken = set(route.path_params) | set(route.query)
            if route.body == "object":
                body_schema = {
                    "type": "object",
                    "properties": {k: v for k, v in properties.items() if k not in taken},
                    "required": sorted(required - taken),
                    "additionalProperties": False,
                }
                body_required = bool(required - taken)
            else:
                body_schema = properties[route.body.removeprefix("field:")]
                body_required = True
            operation["requestBody"] = {
                "required": body_required,
                "content": {"application/json": {"schema": body_schema}},
            }
        paths.setdefault(route.path, {})[route.verb.lower()] = operation
    meta_response = {
        "description": "Success",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    for path, summary in (("/api/methods", "The method registry"), ("/api/openapi.json", "This document")):
        paths[path] = {
            "get": {
                "operationId": "meta_" + path.rsplit("/", 1)[1].replace(".", "_"),
                "summary": summary,
                "responses": {
                    "200": meta_response,
                    **{code: _error_response(ERROR_STATUSES[code]) for code in ("401", "403", "500")},
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "vllm-use admin API", "version": __version__},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }

"""What a tool is (docs/tools.md): every built-in and every MCP server's tool is a `Tool`, so the
toolbox and `/tools` treat them alike.

A tool answers in one of the two shapes the chat page puts into a `tool` message: plain text (a
`str`, sent as `{"plain_text_response": …}`) or a JSON object (a `dict`). A tool that refuses or
fails raises `ToolError`; `/tools` answers `{"error": message}`. A streaming tool is an async
iterator of text chunks; `ToolError` raised from it ends the stream with `{"done": true, "error": …}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

PARAMS_MAX_BYTES = 64 * 1024  # a call's `params`, as compact UTF-8 JSON
OUTPUT_MAX_BYTES = 256 * 1024  # a result's text (or a stream's chunks, together); then TRUNCATED
TRUNCATED = "\n[output truncated: more than 256 KiB]"
CALLS_PER_KEY = 4  # concurrent calls of one key; the next one is 429
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")

Result = str | dict[str, Any]


class ToolError(Exception):
    """A tool refused its arguments or failed: the message is for the user (and the model), and
    names no secret and no path outside the tools root."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Tool:
    """One tool as `GET /tools` lists it, and how to run it.

    `definition` is the OpenAI function definition (`{"type": "function", "function": {name,
    description, parameters}}`) whose name is `name`. `write` is the only permission: the chat asks
    before every call of a tool with it. `call` runs it once; `stream`, when not None, runs it
    yielding text chunks (a tool without it cannot be called with `stream: true`). `timeout_s`
    bounds one call; the toolbox cancels it past that. `available` is False for an MCP server that
    did not answer (listed, not callable)."""

    name: str
    display_name: str
    type: str  # "builtin" | "mcp"
    write: bool
    definition: dict[str, Any]
    call: Callable[[dict[str, Any]], Awaitable[Result]]
    stream: Callable[[dict[str, Any]], AsyncIterator[str]] | None = None
    timeout_s: float = 30.0
    available: bool = True
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # more fields for GET /tools (e.g. an MCP server's error)

    def listing(self) -> dict[str, Any]:
        """This tool as one entry of `GET /tools`."""
        return {
            "tool": self.name,
            "display_name": self.display_name,
            "type": self.type,
            "permissions": {"write": self.write},
            "definition": self.definition,
            "available": self.available,
            "stream": self.stream is not None,
            **self.extra,
        }


def function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function definition with a strict JSON Schema for its parameters."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }

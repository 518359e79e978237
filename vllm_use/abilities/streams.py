"""`streams.list` and `streams.cancel`: an admin's view of every key's resumable stream sessions.

A key sees only its own sessions, by ids it already knows (`/v1/stream*`). An admin sees them
all (owner key id, conversation id, model, state, bytes, times) with the limits they count
against, and can stop any live one: the generation is aborted upstream and its readers end, as
with the owner's `DELETE /v1/stream`. On MCP both need `mcp.admin`; on /api `admin.read` and
`admin.write`. Conversation ids are client-chosen labels, never prompts or outputs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from vllm_use import fields
from vllm_use.context import Call
from vllm_use.errors import NotFound
from vllm_use.gateway import streams
from vllm_use.registry import Args, Registry, Result
from vllm_use.scopes import ADMIN_WRITE, KEYS_READ

KeyId = Annotated[fields.KeyId, Field(description="an API key id: 24 letters and digits")]
# The conversation id rule of X-Conversation-Id (streams.parse_conversation_id), as a pattern.
ConversationId = Annotated[
    str,
    StringConstraints(pattern=r"^[!-9;-~]{1,128}$"),
    Field(description="1 to 128 visible ASCII characters without ':'"),
]


class ListArgs(Args):
    key_id: KeyId | None = None


class CancelArgs(Args):
    key_id: KeyId
    conversation_id: ConversationId


class SessionOut(BaseModel):
    key_id: str
    conversation_id: str
    model: str | None
    state: Literal["live", "done", "cancelled"]
    interrupted: bool = Field(description="the upstream was cut under it (its instance stopped or died)")
    total_bytes: int
    held_bytes: int
    dropped_bytes: int
    started_at: str
    completed_at: str | None


class Limits(BaseModel):
    live_per_key: int
    kept_per_key: int
    buffer_bytes: int
    byte_budget: int
    sessions: int
    kept_s: int


class SessionList(Result):
    sessions: list[SessionOut]
    held_bytes: int = Field(description="all sessions' buffers together, every key")
    limits: Limits


class Cancelled(Result):
    session: SessionOut


def _limits() -> dict[str, int]:
    return {
        "live_per_key": streams.MAX_LIVE_PER_KEY,
        "kept_per_key": streams.MAX_KEPT_PER_KEY,
        "buffer_bytes": streams.BUFFER_BYTES,
        "byte_budget": streams.BYTE_BUDGET,
        "sessions": streams.MAX_SESSIONS,
        "kept_s": streams.TTL_S,
    }


async def list_sessions(call: Call, args: ListArgs) -> dict[str, Any]:
    found = call.app.streams.sessions(args.key_id)
    return {
        "sessions": [s.describe_for_admin() for s in found],
        "held_bytes": call.app.streams.held_bytes,
        "limits": _limits(),
    }


async def cancel(call: Call, args: CancelArgs) -> dict[str, Any]:
    session = call.app.streams.get(args.conversation_id, args.key_id)
    if session is None:
        raise NotFound(f"key {args.key_id} has no stream session {args.conversation_id!r}")
    session.cancel()
    return {"session": session.describe_for_admin()}


def register(registry: Registry) -> None:
    registry.method(
        "streams.list",
        "Every resumable stream session of every key (or of `key_id`), oldest first: owner key id, "
        "conversation id, model, state, bytes and times, with the limits they count against.",
        ListArgs,
        SessionList,
        KEYS_READ,
    )(list_sessions)
    registry.method(
        "streams.cancel",
        "Stop a key's live stream session: its upstream generation is aborted and its readers end. "
        "A finished session is left as it is. Answers the session.",
        CancelArgs,
        Cancelled,
        ADMIN_WRITE,
    )(cancel)

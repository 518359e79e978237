"""`api_keys.*` (docs/auth.md, "API keys"): create (secret shown once), list, update, enable, disable,
delete. A key may carry an expiry, a model list and limits (docs/observability.md, "Key limits").

Ids are validated by the input model before any query. Every mutation calls
`auth.forget(id)` before its write, so the very next request sees it. Disable and
delete then cut off what the key already has running (`_cut_off`): its live
stream sessions are cancelled (their upstream generations aborted) and its open
`/v1` connections closed, streaming answers and `/v1/stream` replays included.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator

from vllm_use.clock import now_ms, parse_aware
from vllm_use.context import Call
from vllm_use.deployments.records import DeploymentName
from vllm_use.errors import CorruptRecord, InvalidArguments, NotFound
from vllm_use.fields import KEY_ID_RE, NO_CONTROL, KeyId
from vllm_use.keys import material, store
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.scopes import ADMIN_WRITE, KEYS_READ, Scope, Surface

log = logging.getLogger(__name__)

ScopeName = Literal[
    "admin.read",
    "admin.write",
    "mcp.read",
    "mcp.models",
    "mcp.runtime",
    "mcp.admin",
    "inference",
    "tools",
    "metrics",
]
KeyName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=material.NAME_MAX_BYTES, pattern=NO_CONTROL),
    Field(description="1 to 128 UTF-8 bytes, no control characters"),
]


ExpiresAt = Annotated[
    str,
    StringConstraints(max_length=64),
    Field(
        description="when the key stops working: ISO 8601 with a time zone, in the future "
        "(e.g. 2027-01-31T00:00:00Z)",
        json_schema_extra={"format": "date-time"},
    ),
]
Models = Annotated[
    list[DeploymentName],
    Field(
        min_length=1,
        max_length=material.MODELS_MAX,
        description="the only models the key may name (deployment names or aliases, either way round); "
        "any other is answered 404 as if it did not exist",
        json_schema_extra={"uniqueItems": True},
    ),
]
Rpm = Annotated[
    int, Field(ge=1, le=material.RPM_MAX, description="requests per minute (a moving 60 s window)")
]
MaxConcurrent = Annotated[
    int, Field(ge=1, le=material.CONCURRENT_MAX, description="requests running at once")
]
TokensPerDay = Annotated[
    int,
    Field(ge=1, le=material.TOKENS_PER_DAY_MAX, description="prompt + completion tokens per UTC day"),
]
POLICY_FIELDS = ("expires_at", "models", "rpm", "max_concurrent", "tokens_per_day")


class PolicyArgs(Args):
    """The key policy; null (or left out, at create) is no limit."""

    expires_at: ExpiresAt | None = None
    models: Models | None = None
    rpm: Rpm | None = None
    max_concurrent: MaxConcurrent | None = None
    tokens_per_day: TokensPerDay | None = None

    @field_validator("expires_at")
    @classmethod
    def _aware_time(cls, value: str | None) -> str | None:
        if value is not None:
            parse_aware(value)
        return value

    @field_validator("models")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("names must be distinct")
        return value

    def policy_columns(self, fields: set[str] | tuple[str, ...]) -> dict[str, Any]:
        """The api_keys columns of the policy fields named in `fields`. An expiry must lie in
        the future (400 otherwise): a key born expired is a mistake, not a policy."""
        columns: dict[str, Any] = {}
        for name in POLICY_FIELDS:
            if name not in fields:
                continue
            value = getattr(self, name)
            if name == "expires_at" and value is not None:
                value = int(parse_aware(value).timestamp() * 1000)
                if not now_ms() < value <= material.EXPIRES_MAX_MS:
                    why = "must be in the future, before year 10000"
                    raise InvalidArguments(
                        f"invalid arguments: expires_at: {why}", errors=[{"loc": ["expires_at"], "msg": why}]
                    )
            elif name == "models" and value is not None:
                value = json.dumps(value)
            columns[name] = value
        return columns


class CreateArgs(PolicyArgs):
    name: KeyName
    scopes: list[ScopeName] = Field(
        min_length=1,
        max_length=len(Scope),
        description="distinct scopes",
        json_schema_extra={"uniqueItems": True},
    )


class UpdateArgs(PolicyArgs):
    """The key's id, then only what changes: a field left out is unchanged, null clears a limit."""

    id: KeyId
    name: KeyName | None = None


class IdArgs(Args):
    id: KeyId


class KeyInfo(Result):
    id: str
    name: str
    prefix: str
    scopes: list[ScopeName]
    enabled: bool
    created_at: str
    last_used_at: str | None
    expires_at: str | None
    expired: bool = Field(description="expires_at has passed: the key is refused like a disabled one")
    models: list[str] | None
    rpm: int | None
    max_concurrent: int | None
    tokens_per_day: int | None


class ListedKey(Result):
    """A key as listed; a corrupt row is shown as not usable with the problem, never as a key."""

    id: str
    name: str | None
    prefix: str | None
    scopes: list[ScopeName]
    enabled: bool
    created_at: str | None
    last_used_at: str | None
    expires_at: str | None
    expired: bool
    models: list[str] | None
    rpm: int | None
    max_concurrent: int | None
    tokens_per_day: int | None
    usable: bool
    problem: str | None


class Created(Result):
    key: KeyInfo
    secret: str = Field(pattern=r"^vu_[A-Za-z0-9]{48}$")


class KeyResult(Result):
    key: KeyInfo


class KeyList(Result):
    keys: list[ListedKey]


class Deleted(Result):
    deleted: str


def _listed(row: dict[str, Any], call: Call) -> dict[str, Any]:
    try:
        record = material.parse_row(row)
    except CorruptRecord as exc:
        raw_id = row.get("id")
        return {
            "id": raw_id if isinstance(raw_id, str) and KEY_ID_RE.fullmatch(raw_id) else "<malformed>",
            "name": None,
            "prefix": None,
            "scopes": [],
            "enabled": False,
            "created_at": None,
            "last_used_at": None,
            **dict.fromkeys(POLICY_FIELDS),
            "expired": False,
            "usable": False,
            "problem": exc.message,
        }
    public = record.public(call.app.auth.pending_last_used(record.id))
    return {**public, "usable": record.enabled and not public["expired"], "problem": None}


def _cut_off(call: Call, key_id: str, *, deleted: bool) -> None:
    """After the write: close the key's open /v1 connections, then cancel its live generations.

    Closing first means a streaming client sees its connection cut, not a clean end of a
    stream its generation never finished. A deleted key's finished sessions go too; a disabled
    key's stay for replay until gc, should it be enabled again. Requests that authenticated
    before `forget` are all registered by now (`GatewaySurface.authenticate` registers without
    awaiting), and later ones fail (`Authenticator.authenticate` re-checks the epoch).
    """
    closed = call.app.live.revoke(key_id)
    cancelled = call.app.streams.revoke(key_id, drop=deleted)
    if closed or cancelled:
        log.info(
            "key %s %s: closed %d connection(s), cancelled %d generation(s)",
            key_id,
            "deleted" if deleted else "disabled",
            closed,
            cancelled,
        )


# `tools` too: with exec_shell_command enabled it runs commands, which mcp.admin must not mint.
API_ONLY_SCOPES = frozenset({"admin.read", "admin.write", "tools"})
_OVER_API_ONLY = "keys with admin.* or tools scopes are managed over /api only (docs/security.md)"


def _refuse_admin_scopes_over_mcp(call: Call, scopes: list[str] | tuple[str, ...], loc: str) -> None:
    """No scope crosses surfaces, and minting is no exception: an MCP caller (even `mcp.admin`)
    may not create an admin.* or tools key, nor enable, disable or delete one. Otherwise `mcp.admin`
    would amount to the whole of /api, or to the tools (a shell, docs/tools.md)."""
    if call.surface is Surface.MCP and API_ONLY_SCOPES.intersection(scopes):
        raise InvalidArguments(f"invalid arguments: {loc}: {_OVER_API_ONLY}", errors=[{"loc": [loc]}])


async def _check_target(call: Call, key_id: str) -> None:
    """Over MCP, the key to change must exist and hold no admin.* scope (a corrupt row: refused)."""
    if call.surface is not Surface.MCP:
        return
    row = await call.app.db.query(store.one_row, key_id)
    if row is None:
        raise NotFound(f"no api key with id {key_id}")
    try:
        scopes = [s.value for s in material.parse_row(row).scopes]
    except CorruptRecord:
        raise InvalidArguments(
            f"invalid arguments: id: key {key_id} is corrupt; {_OVER_API_ONLY}", errors=[{"loc": ["id"]}]
        ) from None
    _refuse_admin_scopes_over_mcp(call, scopes, "id")


async def _mutate_enabled(call: Call, key_id: str, enabled: bool) -> dict[str, Any]:
    await _check_target(call, key_id)
    call.app.auth.forget(key_id)
    row = await call.app.db.query(store.set_enabled, key_id, enabled)
    if not enabled:
        _cut_off(call, key_id, deleted=row is None)  # a row gone meanwhile: nothing may outlive it
    if row is None:
        raise NotFound(f"no api key with id {key_id}")
    record = material.parse_row(row)
    return {"key": record.public(call.app.auth.pending_last_used(key_id))}


async def create(call: Call, args: CreateArgs) -> dict[str, Any]:
    material.validate_name(args.name)
    if len(set(args.scopes)) != len(args.scopes):
        raise InvalidArguments(
            "scopes must be distinct", errors=[{"loc": ["scopes"], "msg": "duplicate scope"}]
        )
    _refuse_admin_scopes_over_mcp(call, args.scopes, "scopes")
    policy = args.policy_columns(POLICY_FIELDS)
    secret, key_id, salt = (
        material.new_secret(),
        material.new_key_id(),
        secrets.token_bytes(material.SALT_LEN),
    )
    digest = await call.app.auth.derive(secret, salt)
    record = {
        "id": key_id,
        "name": args.name,
        "prefix": secret[: material.PREFIX_LEN],
        "salt": salt.hex(),
        "hash": digest.hex(),
        "enabled": 1,
        "scopes": json.dumps(list(args.scopes)),
        "created_at": now_ms(),
        "last_used_at": None,
        **policy,
    }
    await call.app.db.query(store.insert, record)
    return {"key": material.parse_row(record).public(), "secret": secret}


async def list_keys(call: Call, args: NoArgs) -> dict[str, Any]:
    rows = await call.app.db.query(store.all_rows)
    return {"keys": [_listed(row, call) for row in rows]}


async def update(call: Call, args: UpdateArgs) -> dict[str, Any]:
    """Name and policy; the scopes stay (a new scope set is a new key). The limiter state is kept
    by key id, so the requests of the last minute still count under the edited limits."""
    given = args.model_fields_set
    columns = args.policy_columns(given)
    if "name" in given:
        if args.name is None:
            raise InvalidArguments(
                "invalid arguments: name: cannot be null", errors=[{"loc": ["name"], "msg": "not null"}]
            )
        columns["name"] = material.validate_name(args.name)
    await _check_target(call, args.id)
    call.app.auth.forget(args.id)
    row = await call.app.db.query(store.update, args.id, columns)
    if row is None:
        raise NotFound(f"no api key with id {args.id}")
    record = material.parse_row(row)
    return {"key": record.public(call.app.auth.pending_last_used(args.id))}


async def enable(call: Call, args: IdArgs) -> dict[str, Any]:
    return await _mutate_enabled(call, args.id, True)


async def disable(call: Call, args: IdArgs) -> dict[str, Any]:
    return await _mutate_enabled(call, args.id, False)


async def delete(call: Call, args: IdArgs) -> dict[str, Any]:
    await _check_target(call, args.id)
    call.app.auth.forget(args.id)
    found = await call.app.db.query(store.delete, args.id)
    _cut_off(call, args.id, deleted=True)  # also for a row gone meanwhile: nothing may outlive it
    call.app.limits.forget_key(args.id)
    if not found:
        raise NotFound(f"no api key with id {args.id}")
    return {"deleted": args.id}


def register(registry: Registry) -> None:
    registry.method(
        "api_keys.create",
        "Create an API key with scopes, optionally an expiry, a model list and limits. The secret is "
        "returned once, here, and never again.",
        CreateArgs,
        Created,
        ADMIN_WRITE,
    )(create)
    registry.method("api_keys.list", "List API keys (never their secrets).", NoArgs, KeyList, KEYS_READ)(
        list_keys
    )
    registry.method(
        "api_keys.update",
        "Change an API key's name, expiry, model list or limits (not its scopes). A field left out "
        "is unchanged; null clears it. Takes effect from the key's next request.",
        UpdateArgs,
        KeyResult,
        ADMIN_WRITE,
    )(update)
    registry.method("api_keys.enable", "Enable an API key.", IdArgs, KeyResult, ADMIN_WRITE)(enable)
    registry.method(
        "api_keys.disable",
        "Disable an API key; the next request with it is refused, and its open /v1 connections "
        "and live stream generations are stopped now.",
        IdArgs,
        KeyResult,
        ADMIN_WRITE,
    )(disable)
    registry.method(
        "api_keys.delete",
        "Delete an API key for good; its open /v1 connections and live stream generations are "
        "stopped now and its stream sessions dropped.",
        IdArgs,
        Deleted,
        ADMIN_WRITE,
    )(delete)

"""`settings.*` (docs/security.md, "Secrets"): non-sensitive key/value settings, all-or-nothing updates.

A key that looks like a secret (see `vllm_use.sensitive`) is refused: credentials
come only from flags and env. Bounds: key 1–128 characters, value ≤ 8192
characters, ≤ 256 settings per update, no control characters.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from vllm_use import settings
from vllm_use.context import Call
from vllm_use.errors import InvalidArguments, NotFound
from vllm_use.fields import NO_CONTROL
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.scopes import ADMIN_WRITE, READ
from vllm_use.sensitive import is_sensitive_key
from vllm_use.settings import KEY_MAX, VALUE_MAX

BATCH_MAX = 256
SettingKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=KEY_MAX, pattern=NO_CONTROL),
    Field(description="1 to 128 characters, no control characters"),
]
SettingValue = Annotated[
    str,
    StringConstraints(max_length=VALUE_MAX, pattern=NO_CONTROL),
    Field(description="up to 8192 characters, no control characters (no line breaks or tabs)"),
]


def _not_a_path_segment(key: str) -> str:
    # `DELETE /api/settings/{key}` could never reach "." or "..": clients resolve them as paths.
    if key in (".", ".."):
        raise ValueError("'.' and '..' cannot be setting keys (they could not be deleted over /api)")
    return key


NewSettingKey = Annotated[SettingKey, AfterValidator(_not_a_path_segment)]


class SettingItem(Args):
    key: NewSettingKey
    value: SettingValue


class UpdateArgs(Args):
    settings: list[SettingItem] = Field(min_length=1, max_length=BATCH_MAX)


class KeyArgs(Args):
    key: SettingKey


class SettingOut(Result):
    key: str
    value: str
    updated_at: str


class SettingList(Result):
    settings: list[SettingOut]


class Deleted(Result):
    deleted: str


async def list_settings(call: Call, args: NoArgs) -> dict[str, Any]:
    return {"settings": await call.app.db.query(settings.read_all)}


async def update(call: Call, args: UpdateArgs) -> dict[str, Any]:
    errors, seen = [], set()
    for i, item in enumerate(args.settings):
        if is_sensitive_key(item.key):
            errors.append(
                {
                    "loc": ["settings", i, "key"],
                    "msg": "looks like a secret; pass credentials as flags/env",
                }
            )
        elif item.key in seen:
            errors.append({"loc": ["settings", i, "key"], "msg": "key given twice"})
        seen.add(item.key)
    if errors:
        raise InvalidArguments(
            f"invalid arguments: settings.{errors[0]['loc'][1]}.key: {errors[0]['msg']}", errors=errors
        )
    return {"settings": await call.app.db.query(settings.upsert, [(s.key, s.value) for s in args.settings])}


async def delete(call: Call, args: KeyArgs) -> dict[str, Any]:
    if not await call.app.db.query(settings.delete, args.key):
        raise NotFound(f"no setting {args.key!r}")
    return {"deleted": args.key}


def register(registry: Registry) -> None:
    registry.method("settings.list", "List settings (never secrets).", NoArgs, SettingList, READ)(
        list_settings
    )
    registry.method(
        "settings.update",
        "Set several settings at once, all or nothing. Keys that look like secrets are refused.",
        UpdateArgs,
        SettingList,
        ADMIN_WRITE,
    )(update)
    registry.method("settings.delete", "Delete one setting.", KeyArgs, Deleted, ADMIN_WRITE)(delete)

"""A deployment as it is saved, and its validation (docs/router.md, "Deployments").

The input models (`DeploymentFields`) and the row parser (`parse_row`) check the same rules: a
row read back from SQLite goes through the same pydantic model as a caller's arguments, so a row
edited by hand is a `CorruptRecord`, never half a deployment.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from vllm_use.clock import iso
from vllm_use.errors import CorruptRecord
from vllm_use.fields import MODEL_ID_RE, ModelId
from vllm_use.registry import Args
from vllm_use.runtime.options import NAME_PATTERN, Name, RuntimeOptions

ALIASES_MAX = 16
IDLE_TIMEOUT_MAX_S = 7 * 24 * 3600
STOP_TIMEOUT_MAX_S = 600
STOP_TIMEOUT_DEFAULT_S = 10
# Options a deployment decides itself: its name is the served model name, its model comes from the
# registry, its port from the ports vllm-use hands out.
OWN_OPTIONS = ("model", "served_model_name", "port")
# Names a new deployment may not take: `GET /api/deployments/events` is the events stream, so a
# deployment of that name could not be read, changed or deleted at /api/deployments/{name}.
RESERVED_NAMES = frozenset({"events"})


class IdleAction(StrEnum):
    """What happens to a deployment's instance when its idle timeout passes: `sleep` (vLLM's sleep
    mode, where it works; elsewhere it falls back to `stop`) or `stop`."""

    SLEEP = "sleep"
    STOP = "stop"


DeploymentName = Annotated[
    str,
    Field(
        pattern=NAME_PATTERN,
        description="the name clients send as `model`: a letter or digit, then up to 255 of "
        "letters, digits and . _ : / @ + -",
    ),
]


class DeploymentSettings(Args):
    """Everything of a deployment but its name: what `deployments.update` may change."""

    model_id: ModelId = Field(description="a registered model whose files are ready")
    options: RuntimeOptions = Field(
        default_factory=RuntimeOptions,
        description="runtime options, as for runtime.start, but without model, served_model_name and "
        "port (the deployment sets those)",
    )
    aliases: list[Name] = Field(
        default_factory=list, max_length=ALIASES_MAX, description="more names clients may send as `model`"
    )
    pinned: bool = Field(default=False, description="never evicted to make room for another deployment")
    load_on_start: bool = Field(default=False, description="loaded when vllm-use starts")
    idle_timeout_s: int = Field(
        default=0, ge=0, le=IDLE_TIMEOUT_MAX_S, description="seconds idle before idle_action; 0: never"
    )
    idle_action: Annotated[IdleAction, Field(strict=False)] = Field(  # a value of IdleAction, as text
        default=IdleAction.STOP, description="sleep (where vLLM's sleep mode works; else stop) or stop"
    )
    stop_timeout_s: int = Field(
        default=STOP_TIMEOUT_DEFAULT_S,
        ge=1,
        le=STOP_TIMEOUT_MAX_S,
        description="seconds between SIGTERM and SIGKILL on stop",
    )

    @field_validator("options")
    @classmethod
    def _no_own_options(cls, options: RuntimeOptions) -> RuntimeOptions:
        given = [name for name in OWN_OPTIONS if getattr(options, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: set by the deployment, not in its options")
        return options

    @field_validator("aliases")
    @classmethod
    def _distinct(cls, aliases: list[str]) -> list[str]:
        if len(set(aliases)) != len(aliases):
            raise ValueError("an alias is listed twice")
        return aliases


class Deployment(DeploymentSettings):
    name: DeploymentName

    @model_validator(mode="after")
    def _name_is_not_an_alias(self) -> Deployment:
        if self.name in self.aliases:
            raise ValueError("an alias repeats the deployment's name")
        return self


def to_row(deployment: Deployment, created_at: int, updated_at: int) -> dict[str, Any]:
    return {
        "name": deployment.name,
        "model_id": deployment.model_id,
        "options": json.dumps(deployment.options.model_dump(exclude_defaults=True), separators=(",", ":")),
        "aliases": json.dumps(deployment.aliases),
        "pinned": int(deployment.pinned),
        "load_on_start": int(deployment.load_on_start),
        "idle_timeout_s": deployment.idle_timeout_s,
        "idle_action": deployment.idle_action.value,
        "stop_timeout_s": deployment.stop_timeout_s,
        "created_at": created_at,
        "updated_at": updated_at,
    }


def parse_row(row: dict[str, Any]) -> dict[str, Any]:
    """A `deployments` row read from SQLite, validated by the same model as a caller's arguments;
    the deployment as `deployments.get` shows it. Raises CorruptRecord naming the row."""
    raw_name = row.get("name")
    label = raw_name if isinstance(raw_name, str) and len(raw_name) <= 256 else "<malformed name>"

    def bad(why: str) -> CorruptRecord:
        return CorruptRecord(f"deployment record {label} is corrupt: {why}", record=label)

    flags = {name: row.get(name) for name in ("pinned", "load_on_start")}
    if any(value not in (0, 1) or type(value) is not int for value in flags.values()):
        raise bad("pinned and load_on_start must be 0 or 1")
    created, updated = row.get("created_at"), row.get("updated_at")
    if type(created) is not int or type(updated) is not int or created <= 0 or updated < created:
        raise bad("created_at/updated_at are not times")
    if not isinstance(row.get("model_id"), str) or not MODEL_ID_RE.fullmatch(row["model_id"]):
        raise bad("model_id is not 32 lowercase hex characters")
    try:
        options, aliases = json.loads(row["options"]), json.loads(row["aliases"])
        deployment = Deployment.model_validate(
            {
                "name": raw_name,
                "model_id": row["model_id"],
                "options": options,
                "aliases": aliases,
                "pinned": bool(flags["pinned"]),
                "load_on_start": bool(flags["load_on_start"]),
                "idle_timeout_s": row.get("idle_timeout_s"),
                "idle_action": row.get("idle_action"),
                "stop_timeout_s": row.get("stop_timeout_s"),
            }
        )
    except (TypeError, ValueError, RecursionError) as exc:  # json's and pydantic's errors are ValueErrors
        field = (
            exc.errors()[0]["loc"][0] if isinstance(exc, ValidationError) and exc.errors()[0]["loc"] else None
        )
        raise bad(f"{field} is invalid" if field else "options or aliases are not valid JSON") from None
    return {
        **deployment.model_dump(mode="json", exclude={"options"}),
        "options": deployment.options.model_dump(mode="json", exclude_defaults=True),
        "created_at": iso(created),
        "updated_at": iso(updated),
    }

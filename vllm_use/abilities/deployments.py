"""`deployments.*` (docs/router.md): named, saved ways to serve a registered model.

A deployment's name is the `model` clients will send; its aliases are more such names. Names and
aliases are unique across every deployment and the operator's `--model-aliases`. Its model must be
registered and ready. Its options are runtime options, checked as `runtime.start` checks them
(`trust_remote_code` needs `--allow-remote-code`), without `model`, `served_model_name` and `port`,
which the deployment sets. Changes hold the lifecycle lock, as `models.delete` does, so a model
cannot be deleted while a deployment that serves it is being saved (and a model that a deployment
serves cannot be deleted at all: docs/models-and-downloads.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from vllm_use.abilities.models import load_model
from vllm_use.abilities.runtime import LogLines, LogsArgs, Wait, ready_model_path
from vllm_use.context import AppContext, Call
from vllm_use.deployments import store
from vllm_use.deployments.instances import InstanceState
from vllm_use.deployments.records import (
    ALIASES_MAX,
    IDLE_TIMEOUT_MAX_S,
    OWN_OPTIONS,
    RESERVED_NAMES,
    STOP_TIMEOUT_MAX_S,
    Deployment,
    DeploymentName,
    IdleAction,
)
from vllm_use.errors import Conflict, InvalidArguments, NotFound, VllmUseError
from vllm_use.executor import validation_error
from vllm_use.fields import ModelId
from vllm_use.models import files
from vllm_use.models import store as model_store
from vllm_use.models.records import ModelStatus
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.runtime.options import Name, RuntimeOptions, check_together
from vllm_use.runtime.supervisor import Child
from vllm_use.scopes import READ, RUNTIME_WRITE, Identity, Surface
from vllm_use.storage import Database

log = logging.getLogger(__name__)
# Who loads a deployment at start or for a /v1 request: the operator's configuration, not a caller.
OPERATOR = Identity("admin_token", None, frozenset())


class NameArgs(Args):
    name: DeploymentName


class UpdateArgs(Args):
    """The name, then only the fields to change (absent: unchanged)."""

    name: DeploymentName
    model_id: ModelId | None = None
    options: RuntimeOptions | None = Field(default=None, description="replaces the options as a whole")
    aliases: list[Name] | None = Field(default=None, max_length=ALIASES_MAX, description="replaces the list")
    pinned: bool | None = None
    load_on_start: bool | None = None
    idle_timeout_s: int | None = Field(default=None, ge=0, le=IDLE_TIMEOUT_MAX_S)
    idle_action: IdleAction | None = Field(default=None, strict=False)
    stop_timeout_s: int | None = Field(default=None, ge=1, le=STOP_TIMEOUT_MAX_S)


class InstanceOut(Result):
    state: InstanceState
    port: int | None
    pid: int | None = Field(description="vLLM's main process")
    pgid: int | None = Field(description="its process group: the reaper and everything vLLM started")
    error: str | None
    last_lines: list[str] = Field(description="when failed: vLLM's last lines")
    restart_required: bool = Field(
        description="the deployment was changed since its instance started: unload and load it to apply"
    )
    in_flight: int = Field(description="/v1 requests it is answering now")
    waiting: int = Field(description="/v1 requests waiting for it to load or wake")
    last_used: str | None = Field(description="when its last request ended")
    idle_deadline: str | None = Field(description="when idle_action runs, if it stays idle")
    asleep: bool = Field(description="state sleeping and done: its GPU memory given back (wake it now)")
    sleep_supported: bool = Field(
        description="vLLM's sleep mode works here (NVIDIA GPUs through NVML); else idle_action sleep stops"
    )


class DeploymentOut(Result):
    name: str
    model_id: str
    options: dict[str, Any] = Field(description="the options set, as given")
    aliases: list[str]
    pinned: bool
    load_on_start: bool
    idle_timeout_s: int
    idle_action: IdleAction
    stop_timeout_s: int
    created_at: str
    updated_at: str
    instance: InstanceOut = Field(description="its vLLM child now")


class DeploymentList(Result):
    deployments: list[DeploymentOut]


class Deleted(Result):
    deleted: str


class LoadArgs(NameArgs):
    wait: Wait = 0


class Loaded(InstanceOut):
    name: str


class DeploymentLogsArgs(LogsArgs, NameArgs):
    """The name, and `tail` bounded as runtime.logs bounds it."""


def _with_instance(call: Call, deployment: dict[str, Any]) -> dict[str, Any]:
    return {**deployment, "instance": call.app.instances.status(deployment["name"])}


def read_catalog(db: Database, root: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """On the DB thread: the deployments, and the card of each one's model (a small file read)."""
    deployments = store.all_deployments(db)
    dirs = {row["id"]: row["dir"] for row in model_store.model_rows(db)}
    cards = {
        d["name"]: files.model_card(root / dirs[d["model_id"]]) if dirs.get(d["model_id"]) else {}
        for d in deployments
    }
    return deployments, cards


async def _refresh_names(call: Call) -> None:
    """After a change of the table: the gateway's lookup of names and aliases follows it."""
    db = call.app.db
    call.app.instances.set_names(*await db.run(read_catalog, db, call.app.config.models_dir))


async def list_deployments(call: Call, args: NoArgs) -> dict[str, Any]:
    return {"deployments": [_with_instance(call, d) for d in await call.app.db.query(store.all_deployments)]}


async def _saved(call: Call, name: str) -> dict[str, Any]:
    found = await call.app.db.query(store.deployment, name)
    if found is None:
        raise NotFound(f"no deployment named {name}")
    return found


async def get(call: Call, args: NameArgs) -> dict[str, Any]:
    return _with_instance(call, await _saved(call, args.name))


async def create(call: Call, args: Deployment) -> dict[str, Any]:
    if args.name in RESERVED_NAMES:
        raise InvalidArguments(
            f"invalid arguments: name: {args.name} is reserved (GET /api/deployments/{args.name} is "
            "the events stream); choose another name",
            errors=[{"loc": ["name"], "msg": f"{args.name} is reserved for the events stream"}],
        )
    async with call.app.lifecycle.lock:
        await _check(call, args)
        try:
            saved = await call.app.db.query(store.insert, args)
        except Exception as exc:  # a row of that name appeared after the check: only from outside
            if "UNIQUE" in str(exc):
                raise Conflict(f"a deployment named {args.name} exists") from None
            raise
        await _refresh_names(call)
    return _with_instance(call, saved)


async def update(call: Call, args: UpdateArgs) -> dict[str, Any]:
    async with call.app.lifecycle.lock:
        current = await _saved(call, args.name)
        data = {key: current[key] for key in Deployment.model_fields}
        data |= args.model_dump(mode="json", exclude_none=True, exclude={"name"})
        try:  # validated as a whole: an alias may not repeat the name
            changed = Deployment.model_validate_json(json.dumps(data))
        except ValidationError as exc:
            raise validation_error(exc, Deployment) from None
        await _check(call, changed)
        saved = await call.app.db.query(store.replace, changed)
        if saved is None:
            raise NotFound(f"no deployment named {args.name}")
        await _refresh_names(call)
    return _with_instance(call, saved)


async def delete(call: Call, args: NameArgs) -> dict[str, Any]:
    """Unloads it first (its instance is stopped), then deletes it."""
    async with call.app.lifecycle.lock:
        saved = await _saved(call, args.name)
        await call.app.instances.stop(args.name, grace_s=saved["stop_timeout_s"])
        if not await call.app.db.query(store.delete, args.name):
            raise NotFound(f"no deployment named {args.name}")
        call.app.instances.forget(args.name)
        await _refresh_names(call)
    return {"deleted": args.name}


async def save_for_runtime(
    call: Call, name: str, model_id: str, options: RuntimeOptions | None
) -> dict[str, Any]:
    """runtime.switch: the deployment `name` serving `model_id`, created, or with its options
    replaced when `options` are given (without model, served_model_name and port, which the
    deployment sets). A deployment of that name serving another model is a conflict. The caller
    holds the lifecycle lock."""
    current = await call.app.db.query(store.deployment, name)
    if current is not None and current["model_id"] != model_id:
        raise Conflict(
            f"the name {name} is taken by deployment {name}, which serves model {current['model_id']}; "
            "give another options.served_model_name"
        )
    data = (
        {key: current[key] for key in Deployment.model_fields}
        if current
        else {"name": name, "model_id": model_id}
    )
    if options is not None or current is None:
        kept = (options or RuntimeOptions()).model_dump(
            mode="json", exclude_none=True, exclude=set(OWN_OPTIONS)
        )
        data["options"] = kept
    try:
        deployment = Deployment.model_validate_json(json.dumps(data))
    except ValidationError as exc:
        raise validation_error(exc, Deployment) from None
    await _check(call, deployment)
    if current is None:
        saved = await call.app.db.query(store.insert, deployment)
    else:
        saved = await call.app.db.query(store.replace, deployment)
    await _refresh_names(call)
    return saved


async def begin_load(app: AppContext, name: str, one_more: bool = False) -> Child:
    """Start `name`'s instance and return at once (state starting): deployments.load, a /v1 request
    for it (`Instances.loader`), and load_on_start. Conflict while one is live; NoRoom without room
    (`one_more`: evict one more idle instance first, after a start that failed for GPU memory)."""
    call = Call(app, OPERATOR, Surface.API)
    async with app.lifecycle.lock:
        saved = await _saved(call, name)
        supervisor = app.instances.supervisor(name)
        if supervisor is not None and supervisor.state.live:
            raise Conflict(
                f"deployment {name} is {supervisor.state}; unload it first", state=supervisor.state.value
            )
        _, path = await ready_model_path(call, saved["model_id"])  # just before the spawn
        # A row saved before a rule existed: refused before room is made (no instance evicted for it).
        check_together(RuntimeOptions.model_validate_json(json.dumps(saved["options"])))
        await app.instances.make_room(name, one_more=one_more)
        return app.instances.spawn(saved, path)


async def load(call: Call, args: LoadArgs) -> dict[str, Any]:
    """Start the deployment's instance; 202 with state starting, or the outcome within `wait`."""
    child = await begin_load(call.app, args.name)
    supervisor = call.app.instances.supervisor(args.name)
    assert supervisor is not None
    await supervisor.wait_settled(child, args.wait)
    return {"name": args.name, **call.app.instances.status(args.name)}


async def unload(call: Call, args: NameArgs) -> dict[str, Any]:
    """Stop the deployment's instance: SIGTERM, SIGKILL after its stop_timeout_s (at once while loading)."""
    async with call.app.lifecycle.lock:
        saved = await _saved(call, args.name)
        status = await call.app.instances.stop(args.name, grace_s=saved["stop_timeout_s"])
    return {"name": args.name, **status}


async def sleep(call: Call, args: LoadArgs) -> dict[str, Any]:
    """Put the deployment's instance to sleep (vLLM's sleep mode): 202 with state sleeping, or the
    outcome within `wait`: sleeping (asleep, memory given back) or unloaded (it did not sleep so)."""
    await _saved(call, args.name)
    task = call.app.instances.begin_sleep(args.name)
    if args.wait:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), args.wait)
    return {"name": args.name, **call.app.instances.status(args.name)}


async def wake(call: Call, args: LoadArgs) -> dict[str, Any]:
    """Wake the deployment's sleeping instance: 202 with state waking, or the outcome within `wait`
    (ready; a failed wake stops it and starts it cold once: starting)."""
    await _saved(call, args.name)
    woken = await call.app.instances.begin_wake(args.name)
    if args.wait:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(woken), args.wait)
    return {"name": args.name, **call.app.instances.status(args.name)}


async def logs(call: Call, args: DeploymentLogsArgs) -> dict[str, Any]:
    """vLLM's output of the deployment's instance, newest last: its current start's, or its last
    one's once it stopped; none for a deployment never loaded since vllm-use started."""
    await _saved(call, args.name)
    supervisor = call.app.instances.supervisor(args.name)
    return {"lines": supervisor.logs.lines(args.tail) if supervisor is not None else []}


async def _check(call: Call, deployment: Deployment) -> None:
    """What the input model cannot know: the options that go only together are together, the model
    is ready, the names are free, the options are allowed by the operator. Caller holds the
    lifecycle lock."""
    check_together(deployment.options)
    record = await load_model(call, deployment.model_id)
    if record.status is not ModelStatus.READY:
        raise Conflict(f"model {record.id} is {record.status}; only ready models can be deployed")
    if deployment.options.trust_remote_code and not call.app.config.allow_remote_code:
        raise InvalidArguments(
            "invalid arguments: options.trust_remote_code: vLLM would run Python code shipped with the "
            "model; the operator must start vllm-use with --allow-remote-code to allow it",
            errors=[{"loc": ["options", "trust_remote_code"], "msg": "needs --allow-remote-code"}],
        )
    taken: dict[str, str] = {alias: "an alias of --model-aliases" for alias in call.app.config.model_aliases}
    for other in await call.app.db.query(store.all_deployments):
        if other["name"] != deployment.name:
            taken |= {name: f"deployment {other['name']}" for name in (other["name"], *other["aliases"])}
    for name in (deployment.name, *deployment.aliases):
        if name in taken:
            raise Conflict(f"the name {name} is taken by {taken[name]}")


def register(registry: Registry) -> None:
    registry.method(
        "deployments.list", "Saved deployments: named ways to serve a model.", NoArgs, DeploymentList, READ
    )(list_deployments)
    registry.method("deployments.get", "One deployment by name.", NameArgs, DeploymentOut, READ)(get)
    registry.method(
        "deployments.create",
        "Save a deployment: a name clients send as `model`, a ready model, runtime options, aliases, "
        "and what to do when idle. Names and aliases are unique across deployments and --model-aliases.",
        Deployment,
        DeploymentOut,
        RUNTIME_WRITE,
    )(create)
    registry.method(
        "deployments.update",
        "Change a deployment's fields (those given; options and aliases are replaced as a whole). A "
        "loaded instance keeps running as it was started (restart_required) until it is loaded again.",
        UpdateArgs,
        DeploymentOut,
        RUNTIME_WRITE,
    )(update)
    registry.method(
        "deployments.delete",
        "Delete a deployment (its instance is stopped first).",
        NameArgs,
        Deleted,
        RUNTIME_WRITE,
    )(delete)
    registry.method(
        "deployments.load",
        "Start a deployment's vLLM instance on a port of --runtime-ports. Answers at once with state "
        "starting (HTTP 202); with wait (seconds) once the start settles: ready, failed (start_refused "
        "when vLLM refused its options or model files, else runtime_failed; with vLLM's reason and last "
        "lines) or canceled by deployments.unload (conflict).",
        LoadArgs,
        Loaded,
        RUNTIME_WRITE,
    )(load)
    registry.method(
        "deployments.unload",
        "Stop a deployment's vLLM instance (a start still loading is canceled).",
        NameArgs,
        Loaded,
        RUNTIME_WRITE,
    )(unload)
    registry.method(
        "deployments.logs",
        "vLLM's output of a deployment's instance (bounded, newest last; its last start's once it "
        "stopped; empty when it was never loaded).",
        DeploymentLogsArgs,
        LogLines,
        READ,
    )(logs)
    registry.method(
        "deployments.sleep",
        "Put a deployment's ready, idle instance to sleep (vLLM's sleep mode: its GPU memory is given "
        "back, its weights kept in host memory; needs NVIDIA GPUs and idle_action sleep). Answers at "
        "once with state sleeping (HTTP 202); with wait, once it settles: sleeping, or unloaded when it "
        "did not give its memory back (it is stopped then).",
        LoadArgs,
        Loaded,
        RUNTIME_WRITE,
    )(sleep)
    registry.method(
        "deployments.wake",
        "Wake a sleeping instance (room is made first, as for a load). Answers at once with state waking "
        "(HTTP 202); with wait, once it settles: ready, or starting when the wake failed and it was "
        "started again from scratch.",
        LoadArgs,
        Loaded,
        RUNTIME_WRITE,
    )(wake)


async def load_at_start(app: AppContext) -> None:
    """vllm-use just started: load the deployments with load_on_start, in name order. A failure is
    logged and shown on the deployment; the others still load."""
    call = Call(app, OPERATOR, Surface.API)
    for saved in await app.db.query(store.all_deployments):
        if saved["load_on_start"]:
            try:
                await load(call, LoadArgs(name=saved["name"]))
            except VllmUseError as exc:
                log.warning("deployment %s was not loaded at start: %s", saved["name"], exc.message)

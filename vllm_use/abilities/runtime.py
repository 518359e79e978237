"""`runtime.*` (docs/runtime.md): status, start, stop, restart, switch, logs.

Mutations hold the lifecycle lock (shared with `models.delete`) while they
change what runs: validate, stop what runs, spawn. Start, switch and restart
then answer at once with the state `starting` (HTTP 202); the supervisor's own
task takes the start to `ready` or `failed` whether or not anyone waits. A
caller that wants to block passes `wait` (seconds, at most `WAIT_MAX_S`) and
gets the outcome within it: ready, failed (502 with the last lines), canceled by
a stop (409), or still starting when the time ran out. Waiting happens outside
the lock, so `runtime.stop` can cancel a start that is still loading.

One start at a time: while a start is in progress (or a stop), start, switch
and restart answer 409 at once instead of queueing behind it; `runtime.stop`
cancels it. Two calls at the same moment take the lock in turn: the first
starts, the second finds it starting and gets the 409.

Options that vLLM accepts only together (`enable_auto_tool_choice` needs
`tool_call_parser`…) are refused (400, naming the field) before anything is
stopped or started (`check_together`, via `build_argv`). A start that vLLM
refuses anyway answers 422 `start_refused` with its reason (docs/runtime.md,
"Failed starts").

Two options need the operator's consent, given when vllm-use starts, and are
refused (400, naming the flag) before anything is stopped or started without
it: `trust_remote_code` (`--allow-remote-code`: vLLM would run Python code
shipped with the model) and a `runtime.start` model that is not a directory
inside the models root, a Hub id included (`--allow-any-model-path`: vLLM would
read or fetch whatever the caller names). docs/runtime.md.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from vllm_use.abilities.models import load_model
from vllm_use.context import Call
from vllm_use.errors import Conflict, InvalidArguments
from vllm_use.fields import ModelId
from vllm_use.models import files, records
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.runtime.options import NAME_PATTERN, RuntimeOptions, build_argv
from vllm_use.runtime.supervisor import Child, RuntimeState, Supervisor
from vllm_use.scopes import READ, RUNTIME_WRITE

# The longest one request is held open (docs/runtime.md): enough for a script to block on a small
# model's start. A longer start (start_timeout_s goes up to 7200) is followed after the 202 with
# runtime.status or GET /api/runtime/events; an open request per waiter is not free either.
WAIT_MAX_S = 600
Wait = Annotated[
    int,
    Field(
        ge=0,
        le=WAIT_MAX_S,
        description="seconds to wait for the start to settle (ready, failed or canceled); 0, the "
        "default, answers at once with state starting. MCP clients often give up after 60 s: "
        "keep it well below that and poll runtime.status.",
    ),
]


class StartArgs(Args):
    options: RuntimeOptions
    wait: Wait = 0


class RestartArgs(Args):
    options: RuntimeOptions | None = None
    wait: Wait = 0


class SwitchArgs(Args):
    model_id: ModelId
    options: RuntimeOptions | None = None
    wait: Wait = 0


class LogsArgs(Args):
    tail: int | None = Field(default=None, ge=1, le=100_000)


class InstanceBrief(Result):
    name: str
    state: str
    port: int | None
    pid: int | None


class Status(Result):
    state: RuntimeState
    pid: int | None
    pgid: int | None
    port: int | None
    model: str | None
    active_model_id: str | None
    options: dict[str, Any] | None
    started_at: str | None
    uptime_s: float | None
    starting_for_s: float | None = Field(description="while starting: seconds since the spawn")
    start_timeout_s: int | None = Field(description="the start fails if not healthy after this many seconds")
    last_line: str | None = Field(description="while starting: vLLM's newest log line")
    exit_code: int | None
    error: str | None
    last_lines: list[str]
    upstream: str = Field(description="where /v1 forwards: --upstream, else the runtime's port")
    deployment: str | None = Field(
        description="the deployment the runtime serves (runtime.switch saves one), else null"
    )
    instances: list[InstanceBrief] = Field(description="every deployment's instance, by name")


class LogLines(Result):
    lines: list[str]


def _with_upstream(call: Call, status: dict[str, Any]) -> dict[str, Any]:
    """runtime.* answer with the runtime's status, where /v1 forwards, and every instance."""
    instances = call.app.instances
    every = [
        {"name": name, **{key: instances.status(name)[key] for key in ("state", "port", "pid")}}
        for name in instances.saved_names()
    ]
    return {
        **status,
        "upstream": call.app.upstream_origin(),
        "deployment": instances.runtime_name,
        "instances": every,
    }


def _bad(field: str, message: str) -> InvalidArguments:
    return InvalidArguments(
        f"invalid arguments: {field}: {message}", errors=[{"loc": [field], "msg": message}]
    )


def _check_argv(call: Call, model: str, options: RuntimeOptions) -> None:
    """Everything that would make the spawn fail, checked before anything is stopped."""
    if options.trust_remote_code and not call.app.config.allow_remote_code:
        raise _bad(
            "options.trust_remote_code",
            "vLLM would run Python code shipped with the model; the operator must start vllm-use "
            "with --allow-remote-code to allow it",
        )
    build_argv(call.app.config.vllm_bin, model, options, options.port or call.app.config.runtime_port)


async def _direct_target(call: Call, model: str) -> tuple[str, Path | None]:
    """runtime.start's model as vLLM gets it, and its real path (None for a Hub id).

    Without --allow-any-model-path it must be an absolute path whose real path is a directory
    inside the models root; it is then passed resolved, so a symlink can't lead vLLM elsewhere.
    """
    config = call.app.config
    if config.allow_any_model_path:
        real = Path(os.path.realpath(model)) if os.path.isabs(model) else None
        return model, real
    consent = "the operator must start vllm-use with --allow-any-model-path to serve it"
    if not os.path.isabs(model):
        raise _bad("options.model", f"a Hub id or relative path is outside the models root; {consent}")

    def resolve() -> Path | None:
        real = Path(os.path.realpath(model))
        root = Path(os.path.realpath(config.models_dir))
        return real if root in real.parents and real.is_dir() else None

    real = await asyncio.get_running_loop().run_in_executor(None, resolve)
    if real is None:
        raise _bad("options.model", f"{model} is not a directory inside the models root; {consent}")
    return str(real), real


async def ready_model_path(call: Call, model_id: str) -> tuple[records.ModelRecord, Path]:
    """The record of a ready model and its real directory under the models root, checked just before
    a spawn (runtime.switch, deployments.load); Conflict when it is not ready or not there."""
    record = await load_model(call, model_id)
    if record.status is not records.ModelStatus.READY or not record.dir:
        raise Conflict(f"model {record.id} is {record.status}; only ready models can run")
    root = call.app.config.models_dir

    def check() -> Path:  # just before spawn: still a real directory directly under the root
        path = files.real_model_dir(root, record.dir)
        if Path(os.path.realpath(path)).parent != Path(os.path.realpath(root)):
            raise _bad("model_id", f"{path} resolves outside the models root")
        return path

    try:
        path = await asyncio.get_running_loop().run_in_executor(None, check)
    except (OSError, InvalidArguments) as exc:
        raise Conflict(
            f"model {record.id}'s directory is no longer a real directory under the models root"
        ) from (exc if isinstance(exc, InvalidArguments) else None)
    return record, path


def _one_start_at_a_time(runtime: Supervisor) -> None:
    """Caller holds the lifecycle lock: a start in progress is not replaced behind its caller's back."""
    if runtime.state is RuntimeState.STARTING:
        model = runtime.child.model if runtime.child else "a model"
        raise Conflict(
            f"a start of {model} is in progress; wait for it (runtime.status, GET /api/runtime/events) "
            "or cancel it with runtime.stop",
            state=runtime.state.value,
        )
    if runtime.state is RuntimeState.STOPPING:
        raise Conflict("the runtime is stopping; try again once it has stopped", state=runtime.state.value)


ANSWER = (
    "Answers at once with state starting (HTTP 202); with wait (seconds; ?wait= over /api) it "
    "answers once the start settles: ready, failed (start_refused when vLLM refused its options "
    "or model files, else runtime_failed; with vLLM's reason and last lines), canceled by "
    "runtime.stop (conflict), or still starting when the wait runs out. A start in progress is a "
    "conflict: stop it first."
)


async def status(call: Call, args: NoArgs) -> dict[str, Any]:
    return _with_upstream(call, call.app.runtime.status())


async def logs(call: Call, args: LogsArgs) -> dict[str, Any]:
    return {"lines": call.app.runtime.logs.lines(args.tail)}


async def start(call: Call, args: StartArgs) -> dict[str, Any]:
    options = args.options
    if options.model is None:
        raise _bad("options.model", "runtime.start needs a model (or use runtime.switch with a model_id)")
    _check_argv(call, options.model, options)
    runtime = call.app.runtime
    async with call.app.lifecycle.lock:
        _one_start_at_a_time(runtime)
        if runtime.state.live:
            raise Conflict(
                f"the runtime is {runtime.state}; use runtime.restart, runtime.switch or stop it",
                state=runtime.state.value,
            )
        model, real = await _direct_target(call, options.model)  # just before the spawn
        call.app.instances.adopt(None)  # a path, not a deployment
        child = runtime.spawn(model, options, active_model_id=None, model_path=real)
    return _with_upstream(call, await runtime.wait_settled(child, args.wait))


async def switch(call: Call, args: SwitchArgs) -> dict[str, Any]:
    """Save (or update) the model's deployment and run it alone (docs/router.md, "runtime.* and
    deployments")."""
    options = args.options
    if options is not None and options.model is not None:
        raise _bad("options.model", "runtime.switch takes the model from the registry; leave it out")
    async with call.app.lifecycle.lock:
        child = await _switch_locked(call, args.model_id, options)
    return _with_upstream(call, await call.app.runtime.wait_settled(child, args.wait))


async def _switch_locked(call: Call, model_id: str, options: RuntimeOptions | None) -> Child:
    """runtime.switch and the restart of a deployment, under the lifecycle lock: the deployment
    named as the runtime serves it (options.served_model_name, else the model's name) is saved, every
    vLLM stops, and the runtime starts it on --runtime-port (options.port)."""
    from vllm_use.abilities.deployments import save_for_runtime  # it imports this module

    runtime, instances = call.app.runtime, call.app.instances
    record, path = await ready_model_path(call, model_id)
    name = (options.served_model_name if options else None) or record.name
    if not re.fullmatch(NAME_PATTERN, name):
        raise _bad("options.served_model_name", f"the model's name {name!r} is no model name; give one")
    spawned = (options or RuntimeOptions()).model_copy(update={"served_model_name": name})
    _check_argv(call, str(path), spawned)
    _one_start_at_a_time(runtime)
    saved = await save_for_runtime(call, name, record.id, options)
    await runtime.stop()
    await instances.stop_all()  # it runs alone
    instances.adopt(name)
    record, path = await ready_model_path(call, model_id)  # re-checked just before spawn
    return instances.spawn(saved, path, port=options.port if options else None)


async def restart(call: Call, args: RestartArgs) -> dict[str, Any]:
    runtime = call.app.runtime
    async with call.app.lifecycle.lock:
        current = runtime.child
        if current is None or (runtime.state is RuntimeState.STOPPED and current.model is None):
            raise Conflict("nothing to restart: start or switch first")
        if call.app.instances.runtime_name is not None and current.active_model_id:
            # A deployment: restarted as runtime.switch would (new options are saved on it).
            if args.options is not None and args.options.model is not None:
                raise _bad("options.model", "a registry model's path can't be changed; use runtime.switch")
            child = await _switch_locked(call, current.active_model_id, args.options)
            return _with_upstream(call, await runtime.wait_settled(child, args.wait))
        options = args.options or current.options
        if args.options is not None and current.active_model_id and options.model is not None:
            raise _bad("options.model", "a registry model's path can't be changed; use runtime.switch")
        model = current.model if current.active_model_id or options.model is None else options.model
        _check_argv(call, model, options)
        _one_start_at_a_time(runtime)
        active, model_path = current.active_model_id, current.model_path
        if active:
            _, model_path = await ready_model_path(call, active)
        elif options.model is not None:
            model, model_path = await _direct_target(call, options.model)
        await runtime.stop()
        child = runtime.spawn(model, options, active_model_id=active, model_path=model_path)
    return _with_upstream(call, await runtime.wait_settled(child, args.wait))


async def stop(call: Call, args: NoArgs) -> dict[str, Any]:
    """Every vLLM stops: the runtime's and every deployment's instance."""
    async with call.app.lifecycle.lock:
        status = await call.app.runtime.stop()
        await call.app.instances.stop_all()
        return _with_upstream(call, status)


def register(registry: Registry) -> None:
    registry.method(
        "runtime.status",
        "The vLLM runtime: state, pid, port, options, active model, uptime; while starting how long "
        "it has been loading, its start timeout and its last log line; exit code and last lines on "
        "failure.",
        NoArgs,
        Status,
        READ,
    )(status)
    registry.method("runtime.logs", "vLLM's output (bounded, newest last).", LogsArgs, LogLines, READ)(logs)
    registry.method(
        "runtime.start",
        "Start vllm serve directly on options.model, a directory inside the models root (a Hub id or "
        "another path needs the operator's --allow-any-model-path). " + ANSWER,
        StartArgs,
        Status,
        RUNTIME_WRITE,
    )(start)
    registry.method(
        "runtime.switch",
        "Run a ready registered model alone: its deployment (named options.served_model_name, else "
        "the model's name) is saved or updated, every vLLM stops, and it starts on --runtime-port. " + ANSWER,
        SwitchArgs,
        Status,
        RUNTIME_WRITE,
    )(switch)
    registry.method(
        "runtime.restart",
        "Restart the running (or failed) model, optionally with new options, validated before "
        "anything is stopped. " + ANSWER,
        RestartArgs,
        Status,
        RUNTIME_WRITE,
    )(restart)
    registry.method(
        "runtime.stop",
        "Stop every vLLM (the runtime's and every deployment's instance): SIGTERM to each process "
        "group, SIGKILL after a grace period; a start still loading is killed at once (its waiters "
        "get a conflict).",
        NoArgs,
        Status,
        RUNTIME_WRITE,
    )(stop)

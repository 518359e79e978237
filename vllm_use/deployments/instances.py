"""The running vLLM children of deployments, one `Supervisor` each (docs/router.md, "Instances").

An instance is the deployment's `vllm serve`, with the deployment's name as the served model name
(so vLLM answers to it), on a port of `--runtime-ports`, with its own API key, scratch directory
and reaper: everything docs/runtime.md says of the runtime's one child holds for each instance.
Its states are the supervisor's, shown as `unloaded` where no child is live or failed, and
`sleeping` / `waking` over a ready child in vLLM's sleep mode (docs/router.md, "Sleep").

Capacity (docs/router.md, "Capacity"): at most `max_loaded` instances hold GPUs at once; on each
GPU their shares (`gpu_memory_utilization`) sum to at most `--gpu-memory-budget`, and NVML must
show the new one's share free. A load without room first evicts the least recently used idle
instance (put to sleep where it can sleep, else stopped); with none, `NoRoom`, and a `/v1` request
waits for room in arrival order (`ensure_ready`).

`names` maps every deployment name and alias to its deployment, for the gateway: one dict lookup
per request. The abilities keep it current (`set_names`) after each change of the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

from vllm_use.clock import iso
from vllm_use.config import Config
from vllm_use.deployments.records import STOP_TIMEOUT_DEFAULT_S
from vllm_use.errors import Conflict, ModelLoading, NoRoom, RuntimeFailed, VllmUseError
from vllm_use.runtime.failure import OUT_OF_MEMORY
from vllm_use.runtime.lifecycle import Lifecycle
from vllm_use.runtime.options import RuntimeOptions
from vllm_use.runtime.supervisor import Child, RuntimeState, Supervisor

log = logging.getLogger(__name__)


class InstanceState(StrEnum):
    """What a deployment's instance is doing (`deployments.get` → `instance.state`): its supervisor's
    states (docs/runtime.md), `unloaded` where it has no child, and vLLM's sleep over a ready child.

        unloaded, failed ──load──▶ starting ──/health 200 on a port of its own──▶ ready
        starting ──exit, start timeout──▶ failed
        ready ──sleep──▶ sleeping ──wake──▶ waking ──/is_sleeping false──▶ ready
        ready, sleeping, waking ──unload, idle stop, eviction, --max-sleep, failed sleep──▶ stopping
        stopping ──group gone──▶ unloaded

    `sleeping` covers going to sleep and asleep (`asleep` in the status tells them apart); a request
    is routed only to `ready`.
    """

    UNLOADED = "unloaded"
    STARTING = "starting"
    READY = "ready"
    SLEEPING = "sleeping"
    WAKING = "waking"
    STOPPING = "stopping"
    FAILED = "failed"


UNLOADED, SLEEPING, WAKING = InstanceState.UNLOADED, InstanceState.SLEEPING, InstanceState.WAKING
# An instance's state as `GET /v1/models` names it (llama-server's router words).
_LISTED = {
    InstanceState.READY: "loaded",
    InstanceState.STARTING: "loading",
    InstanceState.FAILED: "failed",
    InstanceState.SLEEPING: "sleeping",
    InstanceState.WAKING: "loading",
}
DEFAULT_GPU_SHARE = 0.9  # vLLM's --gpu-memory-utilization when the options leave it unset
SLEEP_CHECK_DEFAULT_S = 30.0  # after /sleep: /is_sleeping true and the memory below SLEPT_SHARE within this
# Test hook (docs/router.md, "Sleep"): a test that waits the check out (a sleep that keeps its memory)
# starts vllm-use with a shorter one; read once, at start. Only a number in (0, 30] is taken.
SLEEP_CHECK_ENV = "VLLM_USE_TEST_SLEEP_CHECK_S"


def sleep_check_s(environ: dict[str, str] | None = None) -> float:
    """The sleep check's interval: SLEEP_CHECK_DEFAULT_S, or a shorter one from SLEEP_CHECK_ENV."""
    raw = (os.environ if environ is None else environ).get(SLEEP_CHECK_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return SLEEP_CHECK_DEFAULT_S
    return value if 0 < value <= SLEEP_CHECK_DEFAULT_S else SLEEP_CHECK_DEFAULT_S


SLEEP_CHECK_S = sleep_check_s()
SLEPT_SHARE = 0.10  # of the group's memory awake
WAKE_TIMEOUT_S = 120.0  # after /wake_up: /is_sleeping false within this
CHECK_EVERY_S = 0.25  # how often those are looked at
# A request waiting for room looks again at least this often: NVML's free memory changes without an
# event of ours (a stopped process's memory is released a little after it exits).
ROOM_RECHECK_S = 1.0


@dataclass
class _Use:
    """How an instance is used: requests in flight, the end of the last one, the idle timer, the
    requests waiting for it, and its sleep."""

    in_flight: int = 0
    last_used: float | None = None  # time.time() at the end of the last request
    ready_at: float = 0.0  # time.time() when it last became ready (LRU order before any use)
    idle_deadline: float | None = None  # time.time() when the idle action runs
    timer: asyncio.TimerHandle | None = None
    wanted: int = 0  # /v1 requests waiting for it to be ready: it is not evicted meanwhile
    gpus: tuple[int, ...] = ()  # what the running child holds: its GPUs…
    share: float = 0.0  # …and its share of each one's memory
    sleep_mode: bool = False  # started with vLLM's sleep mode
    phase: str | None = None  # SLEEPING or WAKING while that goes on (and SLEEPING once asleep)
    asleep: bool = False  # asleep, its memory given back (checked)
    woken: asyncio.Future[bool] | None = None  # a wake's outcome, for those who wait for it
    sleep_timer: asyncio.TimerHandle | None = None  # --max-sleep
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


def share_of(options: dict[str, Any]) -> tuple[tuple[int, ...], float]:
    """The GPUs an instance with these options uses and its share of each one's memory: `gpu_ids`
    (else the first `tensor_parallel_size` GPUs, as vLLM takes them) and `gpu_memory_utilization`
    (else vLLM's default)."""
    gpus = options.get("gpu_ids") or range(options.get("tensor_parallel_size") or 1)
    return tuple(gpus), options.get("gpu_memory_utilization") or DEFAULT_GPU_SHARE


class Instances:
    def __init__(
        self,
        config: Config,
        lifecycle: Lifecycle,
        max_loaded: int = 1,
        gpu_count: int = 0,
        read_gpus: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        runtime: Supervisor | None = None,
    ) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.max_loaded = max_loaded  # instances holding GPUs at once (--max-loaded, resolved at start)
        self.gpu_count = gpu_count  # what NVML showed at start: 0 on a machine without NVIDIA GPUs
        # vLLM's sleep mode frees GPU memory; it needs CUDA, which needs NVIDIA's driver (NVML).
        self.sleep_supported = gpu_count > 0
        self.read_gpus = read_gpus  # gpu.list's answer, read in an executor
        self._supervisors: dict[str, Supervisor] = {}
        self._use: dict[str, _Use] = {}
        self._saved: dict[str, dict[str, Any]] = {}  # the deployments as saved, by name
        self._cards: dict[str, dict[str, Any]] = {}  # their models' cards, by deployment name
        self._spawned_as: dict[str, str] = {}  # the `updated_at` of the deployment each instance runs
        self.names: dict[str, str] = {}  # a deployment's name or alias → its name
        # What the gateway rewrites `model` from and to: --model-aliases and the deployments' aliases.
        self.aliases: dict[str, str] = dict(config.model_aliases)
        # Starts a deployment's instance (checks, then `spawn`, under the lifecycle lock): set by the
        # composition root to abilities.deployments.begin_load, which knows the models.
        # `one_more`: evict one more instance first (the last start failed for GPU memory).
        self.loader: Callable[[str, bool], Awaitable[Child]] | None = None
        self.waiting = 0  # /v1 requests waiting for an instance to become ready
        # (event, deployment) → how many times: "load" (a start), "eviction", "sleep", "wake";
        # GET /metrics reads it (docs/observability.md).
        self.tally: Counter[tuple[str, str]] = Counter()
        self._listeners: set[Callable[[str], None]] = set()
        self._turn = asyncio.Lock()  # requests that must start or wake an instance, in arrival order
        self._room = asyncio.Event()  # set when room may have appeared
        # The runtime's own supervisor (runtime.*): after runtime.switch it is the instance of the
        # deployment named `runtime_name` (docs/router.md, "runtime.* and deployments"), on
        # --runtime-port, so the Runtime page, its log and its events follow that deployment.
        self.runtime = runtime
        self.runtime_name: str | None = None
        if runtime is not None:
            runtime.subscribe(self._on_runtime_state)

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(name)` when what `deployments.get` shows of `name` may have changed (its
        record, its instance's state, use or idle deadline); a deleted deployment's name is passed
        once more after it is gone. Returns the unsubscribe function. Listeners must not block."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _changed(self, name: str) -> None:
        self._room.set()
        for listener in list(self._listeners):
            listener(name)

    def set_names(
        self, deployments: list[dict[str, Any]], cards: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """The deployments as saved now (after each change of the table), and what each one's
        model's config.json says (`models.files.model_card`, for `GET /v1/models`)."""
        self._cards = cards or {}
        self.names = {
            name: deployment["name"]
            for deployment in deployments
            for name in (deployment["name"], *deployment["aliases"])
        }
        own = {alias: d["name"] for d in deployments for alias in d["aliases"]}
        self.aliases = {**self.config.model_aliases, **own}
        before, self._saved = self._saved, {d["name"]: d for d in deployments}
        for name in sorted(before.keys() | self._saved.keys()):
            if before.get(name) != self._saved.get(name):
                self._changed(name)

    # --- views ---------------------------------------------------------------------------------

    def deployment_of(self, model: str | None) -> str | None:
        """The deployment a client's `model` names: a deployment's name or alias, or an alias of
        --model-aliases whose target is one. One or two dict lookups (the gateway's hot path)."""
        if model is None:
            return None
        found = self.names.get(model)
        if found is None and (target := self.config.model_aliases.get(model)) is not None:
            found = self.names.get(target)
        return found

    def supervisor(self, name: str) -> Supervisor | None:
        return self._supervisors.get(name)

    def status(self, name: str) -> dict[str, Any]:
        """What `deployments.get` shows of the instance: its state, and where it runs."""
        supervisor = self._supervisors.get(name)
        use = self._use.get(name) or _Use()
        usage = {
            "in_flight": use.in_flight,
            "waiting": use.wanted,
            "last_used": iso(int(use.last_used * 1000)) if use.last_used else None,
            "idle_deadline": iso(int(use.idle_deadline * 1000)) if use.idle_deadline else None,
            "sleep_supported": self.sleep_supported,
            "asleep": use.asleep and use.phase is None,  # `sleeping`, and its memory given back
        }
        if supervisor is None or supervisor.state is RuntimeState.STOPPED:
            empty = {"port": None, "pid": None, "pgid": None, "error": None, "last_lines": []}
            return {"state": UNLOADED, **empty, "restart_required": False, **usage}
        status = supervisor.status()
        shown = ("state", "port", "pid", "pgid", "error", "last_lines")
        saved = self._saved.get(name)
        changed = (
            supervisor.state.live and saved is not None and self._spawned_as.get(name) != saved["updated_at"]
        )
        over = use.phase or (SLEEPING if use.asleep else None)  # vLLM's sleep, over a ready child
        state = InstanceState(over if over and supervisor.state is RuntimeState.READY else status["state"])
        return {**{key: status[key] for key in shown}, "state": state, "restart_required": changed, **usage}

    def saved_names(self) -> list[str]:
        """Every deployment's name, in name order, as last saved."""
        return sorted(self._saved)

    def view(self, name: str) -> dict[str, Any] | None:
        """`name` as `deployments.get` shows it (the record as last saved, its instance now), or None
        when no deployment has that name: for the events stream, without a query."""
        saved = self._saved.get(name)
        return None if saved is None else {**saved, "instance": self.status(name)}

    def listing(self) -> list[dict[str, Any]]:
        """Every deployment and alias as `GET /v1/models` shows it (docs/router.md): nothing is
        loaded, woken or counted as use by reading it."""
        entries = []
        for name, saved in sorted(self._saved.items()):
            card = self._cards.get(name, {})
            state = self.status(name)["state"]
            created = datetime.fromisoformat(saved["created_at"].replace("Z", "+00:00"))
            common = {
                "object": "model",
                "created": int(created.timestamp()),
                "owned_by": "vllm-use",
                "root": name,
                "max_model_len": saved["options"].get("max_model_len") or card.get("max_model_len"),
                "input_modalities": card.get("input_modalities", ["text"]),
                "generation_defaults": card.get("generation_defaults", {}),
                "status": {"value": _LISTED.get(state, "unloaded")},
            }
            entries += [{"id": shown, **common} for shown in (name, *saved["aliases"])]
        return entries

    def target(self, name: str) -> tuple[str, str] | None:
        """The origin and key of `name`'s instance when it is ready and awake, else None."""
        supervisor = self._supervisors.get(name)
        if supervisor is None or supervisor.state is not RuntimeState.READY or supervisor.child is None:
            return None
        if (use := self._use.get(name)) is not None and (use.phase is not None or use.asleep):
            return None
        return f"http://127.0.0.1:{supervisor.child.port}", supervisor.child.api_key

    def is_running(self, model_id: str, path: Path | None) -> bool:
        """For the lifecycle lock: does an instance run (or start, or stop) this model?"""
        return any(supervisor.is_running(model_id, path) for supervisor in self._supervisors.values())

    # --- capacity (docs/router.md, "Capacity"; the caller holds the lifecycle lock) -------------

    def _holds_gpus(self, name: str) -> bool:
        """Whether `name`'s instance holds its GPUs' memory: live, and not asleep (waking counts)."""
        supervisor, use = self._supervisors.get(name), self._use.get(name) or _Use()
        if supervisor is None or not supervisor.state.live:
            return False
        return not (use.asleep and use.phase != WAKING)

    def _check_alone(self, name: str, gpus: tuple[int, ...], share: float) -> None:
        """What no eviction can cure: the deployment alone does not fit."""
        if not self.gpu_count:
            return  # no GPUs: only --max-loaded counts
        missing = [gpu for gpu in gpus if gpu >= self.gpu_count]
        if missing:
            raise Conflict(f"deployment {name} asks for GPU {missing[0]}; NVML shows {self.gpu_count} GPUs")
        if share > self.config.gpu_memory_budget:
            raise Conflict(
                f"deployment {name} wants {share:g} of a GPU's memory, more than --gpu-memory-budget "
                f"{self.config.gpu_memory_budget:g}: lower its gpu_memory_utilization"
            )

    async def _shortfall(self, name: str, gpus: tuple[int, ...], share: float) -> tuple[str, bool] | None:
        """Why `name` cannot start now (and whether for memory), or None when it can."""
        holders = [n for n in self._supervisors if n != name and self._holds_gpus(n)]
        if len(holders) >= self.max_loaded:
            return f"{len(holders)} deployments are loaded (--max-loaded {self.max_loaded})", False
        if not self.gpu_count:
            return None
        for gpu in gpus:
            held = sum(self._use[n].share for n in holders if gpu in self._use[n].gpus)
            if held + share > self.config.gpu_memory_budget + 1e-9:
                return (
                    f"GPU {gpu}: loaded deployments hold {held:g} of its memory, {name} wants {share:g} "
                    f"(--gpu-memory-budget {self.config.gpu_memory_budget:g})",
                    True,
                )
        if self.read_gpus is not None:
            shown = {gpu["index"]: gpu for gpu in (await self.read_gpus())["gpus"]}
            for gpu in gpus:
                seen = shown.get(gpu)
                if seen is not None and seen["memory_free_bytes"] < share * seen["memory_total_bytes"]:
                    free = seen["memory_free_bytes"] / 2**30
                    wanted = share * seen["memory_total_bytes"] / 2**30
                    return f"GPU {gpu}: NVML shows {free:.1f} GiB free, {name} wants {wanted:.1f} GiB", True
        return None

    def _victim(self, name: str, gpus: tuple[int, ...] | None) -> str | None:
        """The least recently used instance that may be evicted for `name`: ready and awake, nothing
        in flight or waiting for it, not pinned; on one of `gpus` when memory is short."""
        idle = [
            n
            for n, supervisor in self._supervisors.items()
            if n != name
            and supervisor.state is RuntimeState.READY
            and (use := self._use.get(n) or _Use()).phase is None
            and not use.asleep
            and not use.in_flight
            and not use.wanted
            and not self._saved.get(n, {}).get("pinned")
            and (gpus is None or set(use.gpus) & set(gpus))
        ]
        if not idle:
            return None
        return min(idle, key=lambda n: self._use[n].last_used or self._use[n].ready_at)

    async def make_room(self, name: str, *, one_more: bool = False) -> None:
        """Before `name`'s instance starts or wakes: evict idle instances, least recently used first,
        until it fits (`one_more`: evict one on its GPUs first, after a start failed for memory).
        None left to evict: NoRoom. The caller holds the lifecycle lock."""
        saved = self._saved.get(name)
        gpus, share = share_of(saved["options"] if saved else {})
        self._check_alone(name, gpus, share)
        if one_more and (victim := self._victim(name, gpus if self.gpu_count else None)) is not None:
            await self._evict(victim, f"{name}'s start failed for memory")
        while (short := await self._shortfall(name, gpus, share)) is not None:
            reason, memory = short
            victim = self._victim(name, gpus if memory else None)
            if victim is None:
                raise NoRoom(f"no room for {name}: {reason}, and none is idle and unpinned; retry later")
            await self._evict(victim, reason)

    async def _evict(self, victim: str, reason: str) -> None:
        """Put `victim` to sleep where it can sleep, else stop it (the caller holds the lock)."""
        self.tally["eviction", victim] += 1
        self._disarm(victim)
        if self._can_sleep(victim):
            log.info("deployment %s: put to sleep to make room (%s)", victim, reason)
            if await self._sleep(victim):
                return
        else:
            log.info("deployment %s: stopped to make room (%s)", victim, reason)
        await self._supervisors[victim].stop(grace_s=self._grace(victim))

    def _grace(self, name: str) -> float:
        return self._saved.get(name, {}).get("stop_timeout_s", STOP_TIMEOUT_DEFAULT_S)

    # --- changes (the caller holds the lifecycle lock) -----------------------------------------

    def adopt(self, name: str | None) -> None:
        """runtime.switch: the runtime's supervisor is `name`'s instance from now (None: no
        deployment's). Both stopped by the caller (who holds the lock); the deployment it served
        before is unloaded from now, and `name`'s own supervisor, if any, is dropped."""
        assert self.runtime is not None and not self.runtime.state.live
        before = self.runtime_name
        if before is not None and self._supervisors.get(before) is self.runtime:
            del self._supervisors[before]
        if name is not None:
            own = self._supervisors.get(name)
            assert own is None or not own.state.live
            self._supervisors[name] = self.runtime
        self.runtime_name = name
        for changed in {before, name} - {None}:
            self._changed(changed)

    async def stop_all(self) -> None:
        """runtime.stop and runtime.switch: every instance stops (the caller holds the lock)."""
        for name, supervisor in list(self._supervisors.items()):
            if supervisor.state.live:
                self._disarm(name)
                await supervisor.stop(grace_s=self._grace(name))

    def spawn(self, deployment: dict[str, Any], model_path: Path, port: int | None = None) -> Child:
        """Start `deployment`'s instance (state `starting`) on a free port of `--runtime-ports`, or,
        when the runtime's supervisor serves it, on `port` or --runtime-port. The caller made room
        first (`make_room`)."""
        name = deployment["name"]
        supervisor = self._supervisors.get(name)
        if supervisor is None:
            supervisor = self._supervisors[name] = Supervisor(self.config)
            supervisor.subscribe(lambda kind, status: self._on_state(name, kind, status))
        if supervisor.state.live:
            raise Conflict(f"deployment {name} is {supervisor.state}", state=supervisor.state.value)
        saved = RuntimeOptions.model_validate_json(json.dumps(deployment["options"]))
        if supervisor is self.runtime:
            port = port or self.config.runtime_port
        else:
            port = self._free_port()
        options = saved.model_copy(update={"served_model_name": name, "port": port})
        sleep_mode = self.sleep_supported and deployment["idle_action"] == "sleep"
        child = supervisor.spawn(
            str(model_path),
            options,
            active_model_id=deployment["model_id"],
            model_path=model_path,
            sleep_mode=sleep_mode,
        )
        use = self._use.setdefault(name, _Use())
        use.gpus, use.share = share_of(deployment["options"])
        use.sleep_mode, use.asleep, use.phase = sleep_mode, False, None
        self._spawned_as[name] = deployment["updated_at"]  # the version it runs
        self.tally["load", name] += 1
        return child

    async def stop(self, name: str, grace_s: float) -> dict[str, Any]:
        supervisor = self._supervisors.get(name)
        if supervisor is not None:
            await supervisor.stop(grace_s=grace_s)
        return self.status(name)

    def forget(self, name: str) -> None:
        """Drop a stopped instance (its deployment was deleted)."""
        supervisor = self._supervisors.get(name)
        if supervisor is not None and not supervisor.state.live:
            if supervisor is self.runtime:
                self.runtime_name = None
            del self._supervisors[name]
            self._disarm(name)
            self._use.pop(name, None)
            self._spawned_as.pop(name, None)

    async def shutdown(self) -> None:
        """vllm-use stops: every instance, each with its deployment's stop_timeout_s."""
        for name, supervisor in list(self._supervisors.items()):
            self._disarm(name)
            if supervisor.state.live:
                await supervisor.stop(grace_s=self._grace(name))

    # --- loading on demand (docs/router.md, "Loading on demand") -------------------------------

    async def ensure_ready(self, name: str) -> None:
        """Return once `name`'s instance is ready and awake, loading or waking it if nothing does
        yet. Raises ModelLoading (503) when `--max-waiting` requests already wait or it is not ready
        within `--load-wait-timeout` (waiting for room included); RuntimeFailed when it fails to
        start (a failure for memory evicts one more and starts it once again first); Conflict when
        an unload cancels it."""
        if self.target(name) is not None:
            return
        if self.waiting >= self.config.max_waiting:
            raise ModelLoading(f"{self.waiting} requests already wait for models to load; retry later")
        self.waiting += 1
        use = self._use.setdefault(name, _Use())
        use.wanted += 1
        try:
            async with asyncio.timeout(self.config.load_wait_timeout):
                await self._bring_up(name)
        except TimeoutError:
            raise ModelLoading(
                f"the model {name} is not ready after {self.config.load_wait_timeout} s; retry later"
            ) from None
        finally:
            self.waiting -= 1
            use.wanted -= 1
            self._room.set()

    async def _bring_up(self, name: str) -> None:
        retried = False
        while self.target(name) is None:
            supervisor, use = self._supervisors.get(name), self._use.setdefault(name, _Use())
            live = supervisor is not None and supervisor.state.live
            if use.phase == WAKING and use.woken is not None:
                await asyncio.shield(use.woken)
            elif live and use.asleep and use.phase is None:
                await self._in_turn(lambda: self.begin_wake(name), lambda: not self._asleep(name))
            elif live and supervisor.state is RuntimeState.STARTING and supervisor.child is not None:
                try:
                    await supervisor.wait_settled(supervisor.child, self.config.load_wait_timeout)
                except RuntimeFailed as exc:
                    if retried or not OUT_OF_MEMORY.search("\n".join(exc.details.get("last_lines", []))):
                        raise
                    retried = True
                    log.warning("deployment %s: its start failed for GPU memory; making more room", name)
                    await self._in_turn(lambda: self._load(name, one_more=True), lambda: self._live(name))
            elif live:  # stopping, or going to sleep: look again when that is done
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), ROOM_RECHECK_S)
            else:
                await self._in_turn(lambda: self._load(name), lambda: self._live(name))

    def _asleep(self, name: str) -> bool:
        use = self._use.get(name)
        return use is not None and use.asleep and use.phase is None

    def _live(self, name: str) -> bool:
        supervisor = self._supervisors.get(name)
        return supervisor is not None and supervisor.state.live

    async def _load(self, name: str, *, one_more: bool = False) -> None:
        assert self.loader is not None
        await self.loader(name, one_more)

    async def _in_turn(self, begin: Callable[[], Awaitable[Any]], moved: Callable[[], bool]) -> None:
        """Begin a start or a wake in arrival order, waiting for room while there is none. Returns
        once it began, or on a Conflict when the instance `moved` meanwhile (someone else began it,
        or it stopped): the caller looks again. A Conflict that nothing explains (the model is no
        longer ready, no free port, a share above the budget) is the request's answer."""
        async with self._turn:
            while True:
                self._room.clear()
                try:
                    await begin()
                    return
                except NoRoom:
                    pass
                except Conflict:
                    if moved():
                        return
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), ROOM_RECHECK_S)

    # --- use and idleness (docs/router.md, "Idle") ---------------------------------------------

    def begin(self, name: str) -> None:
        """A request to `name`'s instance starts: it is not idle until the request ends."""
        use = self._use.setdefault(name, _Use())
        use.in_flight += 1
        self._disarm(name)
        self._changed(name)

    def end(self, name: str) -> None:
        """A request to `name`'s instance ended: the idle timer counts from now."""
        use = self._use.setdefault(name, _Use())
        use.in_flight = max(use.in_flight - 1, 0)
        use.last_used = time.time()
        if not use.in_flight:
            self._arm(name)
        self._changed(name)

    def _on_runtime_state(self, kind: str, status: dict[str, Any] | None) -> None:
        if self.runtime_name is not None:
            self._on_state(self.runtime_name, kind, status)

    def _on_state(self, name: str, kind: str, status: dict[str, Any] | None) -> None:
        if kind != "state" or status is None:
            return
        use = self._use.setdefault(name, _Use())
        if status["state"] != RuntimeState.READY:  # a sleep ends with its child
            use.asleep, use.phase = False, None
            self._end_sleep_timer(use)
        if status["state"] == RuntimeState.READY:
            use.ready_at = time.time()
            self._arm(name)  # loaded and not used yet: idle from now
        elif status["state"] != RuntimeState.STARTING:
            self._disarm(name)
        self._changed(name)

    def _arm(self, name: str) -> None:
        self._disarm(name)
        saved, use = self._saved.get(name), self._use.setdefault(name, _Use())
        supervisor = self._supervisors.get(name)
        if not saved or not saved["idle_timeout_s"] or use.in_flight or supervisor is None:
            return
        if supervisor.state is not RuntimeState.READY or use.phase is not None or use.asleep:
            return
        timeout = saved["idle_timeout_s"]
        use.idle_deadline = time.time() + timeout
        loop = asyncio.get_running_loop()
        use.timer = loop.call_later(timeout, lambda: self._background(name, self._idle(name)))

    def _disarm(self, name: str) -> None:
        use = self._use.get(name)
        if use is not None:
            if use.timer is not None:
                use.timer.cancel()
            use.timer, use.idle_deadline = None, None

    def _background(self, name: str, work: Awaitable[Any]) -> None:
        """Run `work` on its own, keeping a reference until it ends."""
        use = self._use.setdefault(name, _Use())
        task = asyncio.ensure_future(work)
        use.tasks.add(task)
        task.add_done_callback(use.tasks.discard)

    async def _idle(self, name: str) -> None:
        """The idle timeout passed: if it is still idle, its idle action (sleep where it can sleep,
        else stop)."""
        async with self.lifecycle.lock:
            use, supervisor, saved = self._use.get(name), self._supervisors.get(name), self._saved.get(name)
            if use is None or use.in_flight or use.wanted or supervisor is None or saved is None:
                return
            if supervisor.state is not RuntimeState.READY or use.timer is None or use.phase is not None:
                return  # used, reloaded, stopped or asleep meanwhile
            use.timer, use.idle_deadline = None, None
            if self._can_sleep(name):
                log.info("deployment %s: idle for %d s, putting it to sleep", name, saved["idle_timeout_s"])
                if await self._sleep(name):
                    return
            else:
                log.info("deployment %s: idle for %d s, stopping it", name, saved["idle_timeout_s"])
            await supervisor.stop(grace_s=saved["stop_timeout_s"])

    # --- sleep (docs/router.md, "Sleep") --------------------------------------------------------

    def _can_sleep(self, name: str) -> bool:
        use = self._use.get(name)
        saved = self._saved.get(name) or {}
        return bool(use and use.sleep_mode and self.sleep_supported and saved.get("idle_action") == "sleep")

    def check_sleep(self, name: str) -> None:
        """Why `name` cannot be put to sleep now, as Conflict (deployments.sleep)."""
        supervisor, use = self._supervisors.get(name), self._use.get(name) or _Use()
        if not self.sleep_supported:
            raise Conflict(
                "vLLM's sleep mode needs CUDA, and NVML shows no NVIDIA GPU here: unload it instead"
            )
        if supervisor is None or supervisor.state is not RuntimeState.READY or use.phase or use.asleep:
            raise Conflict(f"deployment {name} is {self.status(name)['state']}, not ready")
        if not use.sleep_mode:
            raise Conflict(
                f"deployment {name} was started without vLLM's sleep mode: set its idle_action to sleep "
                "and load it again"
            )
        if use.in_flight:
            raise Conflict(
                f"deployment {name} is answering {use.in_flight} requests; vLLM's sleep would abort them"
            )

    def begin_sleep(self, name: str) -> asyncio.Task[bool]:
        """Put `name` to sleep in the background: `check_sleep` first (Conflict), then no request is
        routed to it; the task says whether it slept (False: it was stopped instead)."""
        self.check_sleep(name)
        supervisor, use = self._supervisors[name], self._use[name]
        child = supervisor.child
        use.phase = SLEEPING  # at once: no request is routed to it from now
        self._disarm(name)
        self._changed(name)

        async def sleep() -> bool:
            async with self.lifecycle.lock:
                if supervisor.child is not child or supervisor.state is not RuntimeState.READY:
                    return False  # stopped or replaced while we waited for the lock
                if await self._sleep(name):
                    return True
                await supervisor.stop(grace_s=self._grace(name))
                return False

        task = asyncio.ensure_future(sleep())
        use.tasks.add(task)
        task.add_done_callback(use.tasks.discard)
        task.add_done_callback(lambda t: self._sleep_settled(name, t))
        return task

    def _sleep_settled(self, name: str, task: asyncio.Task[bool]) -> None:
        use = self._use.get(name)
        if use is not None and not use.asleep and use.phase == SLEEPING:
            use.phase = None  # refused or failed before it began
            self._arm(name)
            self._changed(name)
        if not task.cancelled():
            task.exception()  # retrieved: the caller that waited saw it

    async def _sleep(self, name: str) -> bool:
        """vLLM's sleep (level 1: weights to host memory, KV cache dropped), checked: /is_sleeping
        true and NVML showing the group below SLEPT_SHARE of its memory awake, within SLEEP_CHECK_S.
        False when it did not sleep so (the caller stops it). The caller holds the lock; nothing is
        in flight."""
        supervisor, use = self._supervisors[name], self._use[name]
        child = supervisor.child
        assert child is not None
        use.phase = SLEEPING
        self._changed(name)
        try:
            awake = await self._group_memory(child.pgid)
            if not awake:
                raise _SleepFailed("NVML shows no GPU memory held by it")
            await self._call(child, "POST", "/sleep?level=1")
            deadline = time.monotonic() + SLEEP_CHECK_S
            while True:
                held = await self._group_memory(child.pgid)
                if await self._is_sleeping(child) and held < SLEPT_SHARE * awake:
                    break
                if time.monotonic() > deadline:
                    raise _SleepFailed(
                        f"after {SLEEP_CHECK_S:g} s it still holds {held / 2**20:.0f} MiB of "
                        f"{awake / 2**20:.0f} MiB"
                    )
                await asyncio.sleep(CHECK_EVERY_S)
        except _SleepFailed as exc:
            log.warning("deployment %s: vLLM's sleep failed (%s); stopping it instead", name, exc)
            use.phase = None
            self._changed(name)
            return False
        if supervisor.child is not child or supervisor.state is not RuntimeState.READY:
            return False  # it died meanwhile
        use.phase, use.asleep = None, True
        self.tally["sleep", name] += 1
        log.info("deployment %s: asleep (%.0f MiB of GPU memory given back)", name, awake / 2**20)
        if self.config.max_sleep:
            loop = asyncio.get_running_loop()
            use.sleep_timer = loop.call_later(
                self.config.max_sleep, lambda: self._background(name, self._slept_enough(name, child))
            )
        self._changed(name)
        return True

    async def _slept_enough(self, name: str, child: Child) -> None:
        """--max-sleep passed: stop the sleeper, which still holds its weights in host memory."""
        async with self.lifecycle.lock:
            supervisor, use = self._supervisors.get(name), self._use.get(name)
            if supervisor is None or use is None or supervisor.child is not child:
                return
            if use.asleep and use.phase is None:
                log.info(
                    "deployment %s: asleep for %d s (--max-sleep), stopping it", name, self.config.max_sleep
                )
                await supervisor.stop(grace_s=self._grace(name))

    def _end_sleep_timer(self, use: _Use) -> None:
        if use.sleep_timer is not None:
            use.sleep_timer.cancel()
            use.sleep_timer = None

    async def begin_wake(self, name: str) -> asyncio.Future[bool]:
        """Wake `name` (asleep): make room first, as for a start (waking takes its memory back), then
        /wake_up in the background. The future says whether it woke (False: it failed, was stopped and
        started cold once). Conflict when it is not asleep; NoRoom without room."""
        async with self.lifecycle.lock:
            supervisor, use = self._supervisors.get(name), self._use.get(name)
            if supervisor is None or use is None or not use.asleep or use.phase is not None:
                raise Conflict(f"deployment {name} is {self.status(name)['state']}, not asleep")
            await self.make_room(name)
            child = supervisor.child
            assert child is not None
            use.phase = WAKING
            use.woken = asyncio.get_running_loop().create_future()
            self._end_sleep_timer(use)
            self._changed(name)
            self._background(name, self._wake(name, child, use.woken))
            return use.woken

    async def _wake(self, name: str, child: Child, woken: asyncio.Future[bool]) -> None:
        use, supervisor = self._use[name], self._supervisors[name]
        try:
            await self._call(child, "POST", "/wake_up")
            deadline = time.monotonic() + WAKE_TIMEOUT_S
            while await self._is_sleeping(child):
                if time.monotonic() > deadline:
                    raise _SleepFailed(f"still asleep {WAKE_TIMEOUT_S:g} s after /wake_up")
                await asyncio.sleep(CHECK_EVERY_S)
        except _SleepFailed as exc:
            log.warning("deployment %s: waking failed (%s); stopping it and starting it again", name, exc)
            async with self.lifecycle.lock:
                if supervisor.child is child:
                    await supervisor.stop(grace_s=self._grace(name))
            try:
                await self._load(name)
            except VllmUseError as error:
                log.warning(
                    "deployment %s: the start after a failed wake did not begin: %s", name, error.message
                )
            if not woken.done():
                woken.set_result(False)
            return
        finally:
            if use.phase == WAKING and supervisor.child is child:
                use.phase = None
            self._changed(name)
        if supervisor.child is child and supervisor.state is RuntimeState.READY:
            use.asleep = False
            self.tally["wake", name] += 1
            log.info("deployment %s: awake", name)
            self._arm(name)
        if not woken.done():
            woken.set_result(True)

    async def _group_memory(self, pgid: int) -> int:
        """The GPU memory NVML shows held by the processes of group `pgid` (vLLM's engine and
        workers), in bytes, summed over GPUs."""
        if self.read_gpus is None:
            return 0
        total = 0
        for gpu in (await self.read_gpus())["gpus"]:
            for process in gpu["processes"]:
                with contextlib.suppress(OSError):
                    if os.getpgid(process["pid"]) == pgid:
                        total += process["used_memory_bytes"] or 0
        return total

    async def _call(self, child: Child, method: str, path: str) -> bytes:
        """One request to the instance's own routes (not /v1: no key needed); 200 or _SleepFailed."""
        request = HTTPRequest(
            f"http://127.0.0.1:{child.port}{path}",
            method=method,
            body=b"" if method == "POST" else None,
            follow_redirects=False,
            connect_timeout=5,
            request_timeout=SLEEP_CHECK_DEFAULT_S,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError, StreamClosedError) as exc:
            raise _SleepFailed(f"{path}: {exc}") from None
        if response.code != 200:
            raise _SleepFailed(f"{path} answered {response.code}")
        return response.body or b""

    async def _is_sleeping(self, child: Child) -> bool:
        body = await self._call(child, "GET", "/is_sleeping")
        try:
            return json.loads(body)["is_sleeping"] is True
        except (ValueError, KeyError, TypeError):
            raise _SleepFailed("/is_sleeping answered something else than {is_sleeping: bool}") from None

    def _free_port(self) -> int:
        """The first port of `--runtime-ports` that no instance holds and nothing listens on now."""
        held = {
            supervisor.child.port
            for supervisor in self._supervisors.values()
            if supervisor.child is not None and supervisor.state.live
        }
        for port in self.config.runtime_ports:
            if port not in held and _bindable(port):
                return port
        raise Conflict(
            f"no free port in --runtime-ports {self.config.runtime_ports.start}-"
            f"{self.config.runtime_ports.stop - 1}: unload a deployment or widen the range"
        )


class _SleepFailed(Exception):
    """Module-private: a sleep or a wake did not go as vLLM promises (the instance is stopped)."""


def _bindable(port: int) -> bool:
    """Whether vLLM could bind `port` now. With SO_REUSEADDR, as vLLM (uvicorn) binds: a port whose
    last connections wait in TIME_WAIT after an instance stopped is free for the next one."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

"""The running vLLM children of deployments, one `Supervisor` each (docs/router.md, "Instances").

An instance is the deployment's `vllm serve`, with the deployment's name as the served model name
(so vLLM answers to it), on a port of `--runtime-ports`, with its own API key, scratch directory
and reaper: everything docs/runtime.md says of the runtime's one child holds for each instance.
Its states are the supervisor's, shown as `unloaded` where no child is live or failed.

`names` maps every deployment name and alias to its deployment, for the gateway: one dict lookup
per request. The abilities keep it current (`set_names`) after each change of the table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from vllm_use.clock import iso
from vllm_use.config import Config
from vllm_use.deployments.records import STOP_TIMEOUT_DEFAULT_S
from vllm_use.errors import Conflict, ModelLoading
from vllm_use.runtime.lifecycle import Lifecycle
from vllm_use.runtime.options import RuntimeOptions
from vllm_use.runtime.supervisor import Child, RuntimeState, Supervisor

log = logging.getLogger(__name__)

UNLOADED = "unloaded"
# An instance's state as `GET /v1/models` names it (llama-server's router words).
_LISTED = {RuntimeState.READY: "loaded", RuntimeState.STARTING: "loading", RuntimeState.FAILED: "failed"}


@dataclass
class _Use:
    """How an instance is used: requests in flight, the end of the last one, the idle timer."""

    in_flight: int = 0
    last_used: float | None = None  # time.time() at the end of the last request
    idle_deadline: float | None = None  # time.time() when the idle action runs
    timer: asyncio.TimerHandle | None = None


class Instances:
    def __init__(self, config: Config, lifecycle: Lifecycle, max_loaded: int = 1) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.max_loaded = max_loaded  # instances live at once (--max-loaded, resolved at start)
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
        self.loader: Callable[[str], Awaitable[Child]] | None = None
        self.waiting = 0  # /v1 requests waiting for an instance to become ready
        self._listeners: set[Callable[[str], None]] = set()

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(name)` when what `deployments.get` shows of `name` may have changed (its
        record, its instance's state, use or idle deadline); a deleted deployment's name is passed
        once more after it is gone. Returns the unsubscribe function. Listeners must not block."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _changed(self, name: str) -> None:
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

    def supervisor(self, name: str) -> Supervisor | None:
        return self._supervisors.get(name)

    def status(self, name: str) -> dict[str, Any]:
        """What `deployments.get` shows of the instance: its state, and where it runs."""
        supervisor = self._supervisors.get(name)
        use = self._use.get(name) or _Use()
        usage = {
            "in_flight": use.in_flight,
            "last_used": iso(int(use.last_used * 1000)) if use.last_used else None,
            "idle_deadline": iso(int(use.idle_deadline * 1000)) if use.idle_deadline else None,
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
        return {**{key: status[key] for key in shown}, "restart_required": changed, **usage}

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
                "status": {"value": _LISTED.get(state, "unloaded")},
            }
            entries += [{"id": shown, **common} for shown in (name, *saved["aliases"])]
        return entries

    def target(self, name: str) -> tuple[str, str] | None:
        """The origin and key of `name`'s instance when it is ready, else None."""
        supervisor = self._supervisors.get(name)
        if supervisor is None or supervisor.state is not RuntimeState.READY or supervisor.child is None:
            return None
        return f"http://127.0.0.1:{supervisor.child.port}", supervisor.child.api_key

    def is_running(self, model_id: str, path: Path | None) -> bool:
        """For the lifecycle lock: does an instance run (or start, or stop) this model?"""
        return any(supervisor.is_running(model_id, path) for supervisor in self._supervisors.values())

    # --- changes (the caller holds the lifecycle lock) -----------------------------------------

    async def make_room(self, name: str) -> None:
        """Before `name`'s instance starts: while `max_loaded` instances are live, stop the least
        recently used one that is idle (ready, nothing in flight, not pinned). None idle: ModelLoading
        (503, retry later). The caller holds the lifecycle lock."""
        while True:
            live = [n for n, s in self._supervisors.items() if s.state.live and n != name]
            if len(live) < self.max_loaded:
                return
            idle = [
                n
                for n in live
                if self._supervisors[n].state is RuntimeState.READY
                and not (self._use.get(n) or _Use()).in_flight
                and not self._saved.get(n, {}).get("pinned")
            ]
            if not idle:
                raise ModelLoading(
                    f"{len(live)} deployments are loaded (--max-loaded {self.max_loaded}) and none is idle "
                    "and unpinned; retry later"
                )
            victim = min(idle, key=lambda n: (self._use.get(n) or _Use()).last_used or 0.0)
            log.info(
                "deployment %s: stopped to make room for %s (--max-loaded %d)", victim, name, self.max_loaded
            )
            self._disarm(victim)
            await self._supervisors[victim].stop(
                grace_s=self._saved.get(victim, {}).get("stop_timeout_s", STOP_TIMEOUT_DEFAULT_S)
            )

    def spawn(self, deployment: dict[str, Any], model_path: Path) -> Child:
        """Start `deployment`'s instance on a free port of `--runtime-ports` (state `starting`).
        The caller made room first (`make_room`)."""
        name = deployment["name"]
        supervisor = self._supervisors.get(name)
        if supervisor is None:
            supervisor = self._supervisors[name] = Supervisor(self.config)
            supervisor.subscribe(lambda kind, status: self._on_state(name, kind, status))
        if supervisor.state.live:
            raise Conflict(f"deployment {name} is {supervisor.state}", state=supervisor.state.value)
        saved = RuntimeOptions.model_validate_json(json.dumps(deployment["options"]))
        options = saved.model_copy(update={"served_model_name": name, "port": self._free_port()})
        child = supervisor.spawn(
            str(model_path), options, active_model_id=deployment["model_id"], model_path=model_path
        )
        self._spawned_as[name] = deployment["updated_at"]  # the version it runs
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
            del self._supervisors[name]
            self._disarm(name)
            self._use.pop(name, None)
            self._spawned_as.pop(name, None)

    async def shutdown(self) -> None:
        for name, supervisor in list(self._supervisors.items()):
            self._disarm(name)
            await supervisor.shutdown()

    # --- loading on demand (docs/router.md, "Loading on demand") -------------------------------

    async def ensure_ready(self, name: str) -> None:
        """Return once `name`'s instance is ready, loading it if nothing loads it yet. Raises
        ModelLoading (503) when `--max-waiting` requests already wait or the load takes longer than
        `--load-wait-timeout`; RuntimeFailed when it fails; Conflict when an unload cancels it."""
        if self.target(name) is not None:
            return
        if self.waiting >= self.config.max_waiting:
            raise ModelLoading(f"{self.waiting} requests already wait for models to load; retry later")
        self.waiting += 1
        try:
            supervisor = self._supervisors.get(name)
            if supervisor is None or not supervisor.state.live:
                assert self.loader is not None
                try:
                    await self.loader(name)
                except Conflict:
                    pass  # another request started it meanwhile: wait for that start
                supervisor = self._supervisors.get(name)
            if supervisor is None or supervisor.child is None:  # pragma: no cover - the loader spawned
                raise ModelLoading(f"the model {name} is not loading; retry later")
            await supervisor.wait_settled(supervisor.child, self.config.load_wait_timeout)
            if self.target(name) is None:
                raise ModelLoading(
                    f"the model {name} is still loading after {self.config.load_wait_timeout} s; retry later"
                )
        finally:
            self.waiting -= 1

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

    def _on_state(self, name: str, kind: str, status: dict[str, Any] | None) -> None:
        if kind != "state" or status is None:
            return
        self._changed(name)
        if status["state"] == RuntimeState.READY:
            self._arm(name)  # loaded and not used yet: idle from now
        elif status["state"] != RuntimeState.STARTING:
            self._disarm(name)

    def _arm(self, name: str) -> None:
        self._disarm(name)
        saved, use = self._saved.get(name), self._use.setdefault(name, _Use())
        supervisor = self._supervisors.get(name)
        if not saved or not saved["idle_timeout_s"] or use.in_flight or supervisor is None:
            return
        if supervisor.state is not RuntimeState.READY:
            return
        timeout = saved["idle_timeout_s"]
        use.idle_deadline = time.time() + timeout
        loop = asyncio.get_running_loop()
        use.timer = loop.call_later(timeout, lambda: asyncio.ensure_future(self._idle(name)))

    def _disarm(self, name: str) -> None:
        use = self._use.get(name)
        if use is not None:
            if use.timer is not None:
                use.timer.cancel()
            use.timer, use.idle_deadline = None, None

    async def _idle(self, name: str) -> None:
        """The idle timeout passed: stop the instance if it is still idle. Sleep (vLLM's sleep mode)
        is not done yet, so `idle_action: sleep` stops too (docs/router.md)."""
        async with self.lifecycle.lock:
            use, supervisor, saved = self._use.get(name), self._supervisors.get(name), self._saved.get(name)
            if use is None or use.in_flight or supervisor is None or saved is None:
                return
            if supervisor.state is not RuntimeState.READY or use.timer is None:
                return  # used, reloaded or stopped meanwhile
            use.timer, use.idle_deadline = None, None
            log.info("deployment %s: idle for %d s, stopping it", name, saved["idle_timeout_s"])
            await supervisor.stop(grace_s=saved["stop_timeout_s"])

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


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

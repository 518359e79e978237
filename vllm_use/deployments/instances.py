"""The running vLLM children of deployments, one `Supervisor` each (docs/router.md, "Instances").

An instance is the deployment's `vllm serve`, with the deployment's name as the served model name
(so vLLM answers to it), on a port of `--runtime-ports`, with its own API key, scratch directory
and reaper: everything docs/runtime.md says of the runtime's one child holds for each instance.
Its states are the supervisor's, shown as `unloaded` where no child is live or failed.

`names` maps every deployment name and alias to its deployment, for the gateway: one dict lookup
per request. The abilities keep it current (`set_names`) after each change of the table.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from vllm_use.config import Config
from vllm_use.errors import Conflict
from vllm_use.runtime.options import RuntimeOptions
from vllm_use.runtime.supervisor import Child, RuntimeState, Supervisor

UNLOADED = "unloaded"


class Instances:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._supervisors: dict[str, Supervisor] = {}
        self.names: dict[str, str] = {}  # a deployment's name or alias → its name
        # What the gateway rewrites `model` from and to: --model-aliases and the deployments' aliases.
        self.aliases: dict[str, str] = dict(config.model_aliases)

    def set_names(self, deployments: list[dict[str, Any]]) -> None:
        self.names = {
            name: deployment["name"]
            for deployment in deployments
            for name in (deployment["name"], *deployment["aliases"])
        }
        own = {alias: d["name"] for d in deployments for alias in d["aliases"]}
        self.aliases = {**self.config.model_aliases, **own}

    # --- views ---------------------------------------------------------------------------------

    def supervisor(self, name: str) -> Supervisor | None:
        return self._supervisors.get(name)

    def status(self, name: str) -> dict[str, Any]:
        """What `deployments.get` shows of the instance: its state, and where it runs."""
        supervisor = self._supervisors.get(name)
        if supervisor is None or supervisor.state is RuntimeState.STOPPED:
            return {"state": UNLOADED, "port": None, "pid": None, "error": None, "last_lines": []}
        status = supervisor.status()
        return {key: status[key] for key in ("state", "port", "pid", "error", "last_lines")}

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

    def spawn(self, deployment: dict[str, Any], model_path: Path) -> Child:
        """Start `deployment`'s instance on a free port of `--runtime-ports` (state `starting`)."""
        name = deployment["name"]
        supervisor = self._supervisors.setdefault(name, Supervisor(self.config))
        if supervisor.state.live:
            raise Conflict(f"deployment {name} is {supervisor.state}", state=supervisor.state.value)
        saved = RuntimeOptions.model_validate_json(json.dumps(deployment["options"]))
        options = saved.model_copy(update={"served_model_name": name, "port": self._free_port()})
        return supervisor.spawn(
            str(model_path), options, active_model_id=deployment["model_id"], model_path=model_path
        )

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

    async def shutdown(self) -> None:
        for supervisor in list(self._supervisors.values()):
            await supervisor.shutdown()

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

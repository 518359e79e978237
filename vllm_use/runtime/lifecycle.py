"""The lifecycle lock shared by `models.delete` and the runtime's start/stop/restart/switch
(docs/runtime.md, "Commands"; docs/models-and-downloads.md, "Deleting").

Whoever changes what runs, or deletes what could run, holds `lock`. The runtime
registers a `running` check (by model id, or by real path for a directly started
process); until it exists nothing runs and the check answers False.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

RunningCheck = Callable[[str, Path | None], bool]


class Lifecycle:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self._checks: list[RunningCheck] = []

    def add_running_check(self, check: RunningCheck) -> None:
        self._checks.append(check)

    def is_running(self, model_id: str, path: Path | None) -> bool:
        """Caller holds `lock`."""
        return any(check(model_id, path) for check in self._checks)

"""`GET /livez` and `GET /readyz` (docs/observability.md, "Probes"): no auth, never cached.

`/livez`: the process answers, 200 `{"status": "ok"}`. `/readyz`: 200 `{"status": "ready"}`, or
503 `{"status": "not_ready", "reasons": [...]}` naming what is not ready (vllm_use/readiness.py).
Both answer HEAD as GET, without the body. `/healthz` (handlers/static.py) stays as it was.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from vllm_use.readiness import Readiness


class ProbeHandler(tornado.web.RequestHandler):
    """A public JSON probe: `Cache-Control: no-store` on every answer."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    async def head(self) -> None:
        await self.get()  # each probe's own GET; Tornado sends HEAD's headers without the body


class LiveHandler(ProbeHandler):
    async def get(self) -> None:
        self.finish({"status": "ok"})


class ReadyHandler(ProbeHandler):
    def initialize(self, readiness: Readiness) -> None:
        super().initialize()
        self.readiness = readiness

    async def get(self) -> None:
        reasons = await self.readiness.reasons()
        if reasons:
            self.set_status(503)
            self.finish({"status": "not_ready", "reasons": reasons})
        else:
            self.finish({"status": "ready"})


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The probes' routes. Builds the `Readiness`: call before the start-up loads begin."""
    readiness = Readiness(common["app"])
    return [(r"/livez", LiveHandler, {}), (r"/readyz", ReadyHandler, {"readiness": readiness})]

"""`GET /api/downloads/events`: Server-Sent Events of download state and progress (S4.2).

Not a registry method: a stream for the console. It needs `admin.read` (checked
with the same `Identity.may_call` the executor uses), sends each task change as
`event: task`, a `: heartbeat` comment every `HEARTBEAT_S`, and ends cleanly when
the client goes away or the server shuts down.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from tornado.iostream import StreamClosedError

from handlers.base import JsonHandler
from vllm_use.errors import PermissionDenied
from vllm_use.scopes import MethodScope, Scope, Surface

HEARTBEAT_S = 15.0
QUEUE_MAX = 1000
EVENTS_SCOPE = MethodScope(api=Scope.ADMIN_READ, mcp=None)


@tornado.web.stream_request_body
class DownloadEventsHandler(JsonHandler):
    async def get(self) -> None:
        if self.identity is None or not self.identity.may_call(EVENTS_SCOPE, Surface.API):
            self.fail(PermissionDenied("admin.read is required"))
            return
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_MAX)

        def listener(event: dict[str, Any]) -> None:
            if queue.full():  # a client that does not read loses the oldest progress, not memory
                queue.get_nowait()
            queue.put_nowait(event)

        unsubscribe = self.app.downloads.subscribe(listener)
        self._closed = asyncio.Event()
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        try:
            await self.flush()  # headers now: the client is connected even before any event
            # The current state first, so a new page needs no separate list call.
            for task in await self.app.downloads.list():
                await self._send("task", {"type": "task", "task": task})
            while not self._closed.is_set() and not self.app.stopping.is_set():
                waiters = [
                    asyncio.ensure_future(queue.get()),
                    asyncio.ensure_future(self._closed.wait()),
                    asyncio.ensure_future(self.app.stopping.wait()),
                ]
                done, pending = await asyncio.wait(
                    waiters, timeout=HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED
                )
                for waiter in pending:
                    waiter.cancel()
                if waiters[0] in done:
                    await self._send("task", waiters[0].result())
                elif not done:
                    self.write(": heartbeat\n\n")
                    await self.flush()
        except StreamClosedError:
            pass
        finally:
            unsubscribe()
        if not self._closed.is_set():
            self.finish()

    async def _send(self, name: str, data: dict[str, Any]) -> None:
        self.write(f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")
        await self.flush()

    def on_connection_close(self) -> None:
        # The base fails a body read still pending (a GET that announced a body and hung up).
        super().on_connection_close()
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [(r"/api/downloads/events/?", DownloadEventsHandler, common)]

"""Server-Sent Events for the console: downloads (docs/models-and-downloads.md), the runtime
(docs/runtime.md) and deployments (docs/router.md).

Not registry methods, and not MCP tools: streams for the console. Each needs
`admin.read` (`required`, checked by the base with the `Identity.may_call` the executor uses),
sends the current state first, then each change, a `: heartbeat` comment every
`HEARTBEAT_S`, and ends cleanly when the client goes away or the server shuts
down. A client that does not read costs a bounded queue, never memory.

`GET /api/downloads/events`
    `event: task` `{"type": "task", "task": {…}}`: every task now, then each change.
`GET /api/runtime/events`
    `event: state` `{"type": "state", "status": {…}}`: the status (as `runtime.status`) now, then
    at each state change. `event: log` `{"type": "log", "reset": bool, "lines": […],
    "skipped": bool}`: the newest `LOG_TAIL` lines of vLLM's log now (`reset`), then new lines as
    vLLM writes them (at most `LOG_TAIL` an event; `skipped` says some were left out), and
    `reset` again when a new vLLM starts with an empty log. `?log=false`: the state events only
    (the console's top bar); any other value than `true` or `false` is a 400.
`GET /api/deployments/events`
    `event: deployment` `{"type": "deployment", "deployment": {…}}`: every deployment now, in name
    order, then one whenever it may have changed (its record, its instance's state, use or idle
    deadline), as `deployments.get` shows it when the event is sent; `event: deleted`
    `{"type": "deleted", "name": …}` once it is gone. Changes are coalesced: a burst of them for one
    deployment is one event, so what waits is at most one name per deployment. Reading it loads
    nothing and is not use.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from typing import Any

import tornado.web
from tornado.iostream import StreamClosedError

from handlers.base import JsonHandler
from vllm_use.errors import InvalidArguments
from vllm_use.runtime.supervisor import RuntimeLog
from vllm_use.scopes import MethodScope, Scope

HEARTBEAT_S = 15.0
QUEUE_MAX = 1000
LOG_TAIL = 200
EVENTS_SCOPE = MethodScope(api=Scope.ADMIN_READ, mcp=None)


@tornado.web.stream_request_body
class EventStreamHandler(JsonHandler):
    """One event stream. A subclass subscribes (calling `wake` when it has something to send),
    sends the current state, and sends what is pending; this class does the rest."""

    required = EVENTS_SCOPE

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Start listening; returns the unsubscribe function. Runs before `send_current`, so no
        change between the two is lost."""
        raise NotImplementedError

    async def send_current(self) -> None:
        raise NotImplementedError

    async def send_pending(self) -> None:
        raise NotImplementedError

    def read_query(self) -> None:
        """Check the query's options (after the credential); raise `InvalidArguments` for bad ones."""

    async def get(self) -> None:
        try:
            self.read_query()
        except InvalidArguments as exc:
            self.fail(exc)
            return
        self._closed = asyncio.Event()
        woken = asyncio.Event()
        unsubscribe = self.subscribe(woken.set)
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        try:
            await self.flush()  # headers now: the client is connected even before any event
            await self.send_current()  # so a new page needs no separate call
            while not self._closed.is_set() and not self.app.stopping.is_set():
                waiters = [
                    asyncio.ensure_future(woken.wait()),
                    asyncio.ensure_future(self._closed.wait()),
                    asyncio.ensure_future(self.app.stopping.wait()),
                ]
                done, pending = await asyncio.wait(
                    waiters, timeout=HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED
                )
                for waiter in pending:
                    waiter.cancel()
                if woken.is_set():
                    woken.clear()  # before sending: what arrives meanwhile wakes us again
                    await self.send_pending()
                elif not done:
                    self.write(": heartbeat\n\n")
                    await self.flush()
        except StreamClosedError:
            pass
        finally:
            unsubscribe()
        if not self._closed.is_set():
            self.finish()

    async def send(self, name: str, data: dict[str, Any]) -> None:
        self.write(f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")
        await self.flush()

    def on_connection_close(self) -> None:
        # The base fails a body read still pending (a GET that announced a body and hung up).
        super().on_connection_close()
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()


@tornado.web.stream_request_body
class DownloadEventsHandler(EventStreamHandler):
    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        # A client that does not read loses the oldest progress, not memory.
        self._queue: deque[dict[str, Any]] = deque(maxlen=QUEUE_MAX)

        def listener(event: dict[str, Any]) -> None:
            self._queue.append(event)
            wake()

        return self.app.downloads.subscribe(listener)

    async def send_current(self) -> None:
        for task in await self.app.downloads.list():
            await self.send("task", {"type": "task", "task": task})

    async def send_pending(self) -> None:
        while self._queue:
            await self.send("task", self._queue.popleft())


@tornado.web.stream_request_body
class RuntimeEventsHandler(EventStreamHandler):
    def read_query(self) -> None:
        value = self.get_query_argument("log", "true")
        if value not in ("true", "false"):
            raise InvalidArguments(
                "log must be true or false", errors=[{"loc": ["log"], "msg": "must be true or false"}]
            )
        self._with_log = value == "true"

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        # State changes are few and each one counts (the console waits for ready or failed); log
        # lines are not queued at all: a flag, and the lines are read from vLLM's log when sent.
        self._states: deque[dict[str, Any]] = deque(maxlen=QUEUE_MAX)
        self._vllm_log: RuntimeLog | None = None
        self._seq = 0
        self._log_pending = False

        def listener(kind: str, status: dict[str, Any] | None) -> None:
            if status is not None:
                self._states.append(status)
            elif self._with_log:
                self._log_pending = True
            else:
                return  # a log line, for a client that wants none
            wake()

        return self.app.runtime.subscribe(listener)

    async def send_current(self) -> None:
        await self._send_state(self.app.runtime.status())
        if self._with_log:
            await self._send_log()

    async def send_pending(self) -> None:
        while self._states:
            await self._send_state(self._states.popleft())
        if self._with_log and (self._log_pending or self.app.runtime.logs is not self._vllm_log):
            self._log_pending = False
            await self._send_log()

    async def _send_state(self, status: dict[str, Any]) -> None:
        status = {**status, "upstream": self.app.upstream_origin()}
        await self.send("state", {"type": "state", "status": status})

    async def _send_log(self) -> None:
        logs = self.app.runtime.logs
        reset = logs is not self._vllm_log
        lines, skipped = logs.since(0 if reset else self._seq, LOG_TAIL)
        self._vllm_log, self._seq = logs, logs.seq
        if lines or reset:
            await self.send("log", {"type": "log", "reset": reset, "lines": lines, "skipped": skipped})


@tornado.web.stream_request_body
class DeploymentEventsHandler(EventStreamHandler):
    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        # Names, not states: the state is read when the event is sent, so a burst of changes is one
        # event and a client that does not read holds one name per deployment at most.
        self._pending: set[str] = set()

        def listener(name: str) -> None:
            self._pending.add(name)
            wake()

        return self.app.instances.subscribe(listener)

    async def send_current(self) -> None:
        for name in self.app.instances.saved_names():
            await self._send_deployment(name)

    async def send_pending(self) -> None:
        names, self._pending = sorted(self._pending), set()
        for name in names:
            await self._send_deployment(name)

    async def _send_deployment(self, name: str) -> None:
        shown = self.app.instances.view(name)
        if shown is None:
            await self.send("deleted", {"type": "deleted", "name": name})
        else:
            await self.send("deployment", {"type": "deployment", "deployment": shown})


def default_handlers(common: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    return [
        (r"/api/downloads/events/?", DownloadEventsHandler, common),
        (r"/api/runtime/events/?", RuntimeEventsHandler, common),
        # Before /api/deployments/{name} (handlers/api.py): "events" is no deployment's name.
        (r"/api/deployments/events/?", DeploymentEventsHandler, common),
    ]

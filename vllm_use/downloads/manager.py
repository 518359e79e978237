"""The durable download queue: `hf download` children, progress, stalls, cancel
(docs/models-and-downloads.md).

Runs on the IOLoop. SQLite is the truth: a task is persisted `pending` on
acceptance (with its model switched to `downloading` in the same transaction),
`running` with `started_at` before its child is spawned (if that write fails the
task fails and nothing runs), and terminal with its model in one transaction.
The one-time token lives only in memory until the child is spawned and only in
the child's environment (`HF_TOKEN`) after that.

Each child runs in its own process group with stdout and stderr merged into one
pipe, drained continuously into a bounded `LogBuffer`. Progress is the bytes
under the target directory (partial files included), measured every
`POLL_S` in an executor, against the total from the hub's file list; no byte
progress for `stall_after_s` marks the task stalled (it keeps running; cancel
works at any moment).

The time estimate (`eta_s`) stays null until the rate has been measured over at
least `ESTIMATE_AFTER_S` and `ESTIMATE_AFTER_BYTES` since bytes started to move
(`estimate_s`): hf's first seconds write only metadata, and a rate taken from
them gave estimates like "3 d 15 h left" for a download that took a minute.

Before `hf` starts, that total (when the hub tells it) is compared with the free
space of the models dir: a download that can't fit fails at once ("not enough
disk space: needs …, … free in …") instead of filling the disk. `hf` runs in the
models dir with `config.child_env()`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.process import Subprocess

from vllm_use import fsafety
from vllm_use.clock import now_ms
from vllm_use.config import Config, child_env
from vllm_use.downloads import files, tasks
from vllm_use.downloads.tasks import TaskStatus
from vllm_use.errors import Conflict, InvalidArguments, NotFound
from vllm_use.logbuffer import LogBuffer, cut_utf8
from vllm_use.models import records as model_records
from vllm_use.models import store as model_store
from vllm_use.models.records import ModelStatus
from vllm_use.processes import children
from vllm_use.storage import Database

log = logging.getLogger(__name__)

POLL_S = 1.0
PERSIST_PROGRESS_S = 5.0
TERM_GRACE_S = 3.0
REAP_CAP_S = 10.0
ERROR_MAX = 64 * 1024
ESTIMATE_AFTER_S = 5.0  # estimate_s: the least measuring time …
ESTIMATE_AFTER_BYTES = 1024 * 1024  # … and bytes moved, before an ETA is given
HUB_TOTAL_TIMEOUT_S = 30.0  # the size is only a check: a slow hub costs the check, not the download

Listener = Callable[[dict[str, Any]], None]


@dataclass
class Progress:
    done: int = 0
    total: int | None = None
    rate: float = 0.0
    stalled: bool = False
    last_change: float = field(default_factory=time.monotonic)
    last_sample: tuple[float, int] | None = None
    since: tuple[float, int] | None = None  # the sample just before bytes first moved: the rate's window


def estimate_s(remaining: int | None, rate: float, window_s: float, moved: int) -> float | None:
    """Seconds left, or None until the rate means something: measured over at least
    `ESTIMATE_AFTER_S` seconds and `ESTIMATE_AFTER_BYTES` bytes (docs/models-and-downloads.md)."""
    if remaining is None or remaining < 0 or rate <= 0:
        return None
    if window_s < ESTIMATE_AFTER_S or moved < ESTIMATE_AFTER_BYTES:
        return None
    return round(remaining / rate, 1)


@dataclass
class Running:
    proc: Subprocess
    target: Path
    exited: asyncio.Future[int]


class DownloadManager:
    def __init__(self, config: Config, db: Database, stall_after_s: float = 600.0) -> None:
        self.config = config
        self.db = db
        self.root = config.models_dir
        self.logs_dir = config.data_dir / "logs" / "downloads"
        self.stall_after_s = stall_after_s
        self.persist_failed = False
        self._queue: deque[str] = deque()
        self._tokens: dict[str, str] = {}
        self._running: dict[str, Running] = {}
        self._cancel_requested: set[str] = set()
        self._progress: dict[str, Progress] = {}
        self._logs: dict[str, LogBuffer] = {}
        self._listeners: set[Listener] = set()
        self._closing = False
        self._workers: dict[str, asyncio.Future[None]] = {}  # task id → its worker, from take to end

    # --- start-up ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Synchronous, before listening: the private log directory."""
        fsafety.secure_dir(self.logs_dir.parent, option="--data-dir")
        fsafety.secure_dir(self.logs_dir, option="--data-dir")

    # --- events --------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def _emit(self, task: dict[str, Any]) -> None:
        event = {"type": "task", "task": task}
        for listener in list(self._listeners):
            listener(event)

    async def _emit_task(self, task_id: str) -> None:
        row = await self.db.query(model_store.task_row, task_id)
        if row is not None:
            self._emit(self.describe(tasks.parse_row(row)))

    # --- views ---------------------------------------------------------------------------------

    def describe(self, record: tasks.TaskRecord) -> dict[str, Any]:
        """The task as the API shows it: the record plus live progress while it runs."""
        out = record.public()
        progress = self._progress.get(record.id) if record.status == TaskStatus.RUNNING else None
        if progress is not None:
            out["bytes_done"] = progress.done
            out["bytes_total"] = progress.total if progress.total is not None else record.bytes_total
        total = out["bytes_total"]
        rate = progress.rate if progress else 0.0
        out["rate_bytes_per_s"] = round(rate, 1)
        out["stalled"] = bool(progress and progress.stalled)
        remaining = (total - out["bytes_done"]) if total is not None else None
        out["eta_s"] = None
        if progress is not None and progress.since is not None:
            then, before = progress.since
            window = (progress.last_sample[0] if progress.last_sample else then) - then
            out["eta_s"] = estimate_s(remaining, rate, window, progress.done - before)
        out["queue_position"] = self._queue.index(record.id) + 1 if record.id in self._queue else None
        return out

    async def get(self, task_id: str) -> tasks.TaskRecord:
        row = await self.db.query(model_store.task_row, task_id)
        if row is None:
            raise NotFound(f"no download task {task_id}")
        return tasks.parse_row(row)

    async def list(self) -> list[dict[str, Any]]:
        rows = await self.db.query(model_store.task_rows)
        return [self.describe(tasks.parse_row(row)) for row in rows]

    async def logs(self, task_id: str, tail: int | None) -> list[str]:
        await self.get(task_id)
        buffer = self._logs.get(task_id)
        if buffer is not None:
            return buffer.lines(tail)
        path = self.logs_dir / f"{task_id}.log"
        text = await asyncio.get_running_loop().run_in_executor(None, files.read_log, path)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return lines[-tail:] if tail else lines

    # --- commands ------------------------------------------------------------------------------

    async def start(self, model_id: str, task_id: str | None, token: str | None) -> dict[str, Any]:
        task_id = task_id or tasks.new_task_id()
        row = await self.db.query(model_store.model_row, model_id)
        if row is None:
            raise NotFound(f"no model with id {model_id}")
        model = model_records.parse_row(row)
        if model.source != "huggingface":
            raise Conflict(f"model {model_id} is a local model; only Hugging Face models are downloaded")
        record = {
            "id": task_id,
            "model_id": model_id,
            "repository": model.repository,
            "revision": model.revision,
            "status": TaskStatus.PENDING,
            "bytes_done": 0,
            "bytes_total": None,
            "exit_code": None,
            "error": None,
            "created_at": now_ms(),
            "started_at": None,
            "finished_at": None,
        }
        outcome = await self.db.query(model_store.accept_task, record, False)
        if outcome == "task_exists":
            raise Conflict(
                f"download task id {task_id} is already taken; task ids are never reused", loc=["id"]
            )
        if outcome != "ok":
            raise Conflict(
                f"model {model_id} is {model.status}; only a registered, failed or canceled model downloads"
            )
        return await self._enqueue(task_id, token)

    async def retry(self, task_id: str, token: str | None) -> dict[str, Any]:
        old = await self.get(task_id)
        if old.status not in tasks.RETRYABLE:
            raise Conflict(
                f"download task {task_id} is {old.status}; only failed or canceled tasks can be retried"
            )
        row = await self.db.query(model_store.model_row, old.model_id)
        if row is None:
            raise Conflict(
                f"the model of task {task_id} was deleted; register it again and start a new download"
            )
        model = model_records.parse_row(row)  # re-read: never the old task's repository/revision/path
        fresh = {
            "id": task_id,
            "model_id": model.id,
            "repository": model.repository,
            "revision": model.revision,
        }
        outcome = await self.db.query(model_store.accept_task, fresh, True)
        if outcome != "ok":
            raise Conflict(f"task {task_id} can't be retried now: model {model.id} is {model.status}")
        return await self._enqueue(task_id, token)

    async def _enqueue(self, task_id: str, token: str | None) -> dict[str, Any]:
        if token:
            self._tokens[task_id] = token
        self._logs.pop(task_id, None)
        self._queue.append(task_id)
        self._pump()
        record = await self.get(task_id)
        described = self.describe(record)
        self._emit(described)
        return described

    async def cancel(self, task_id: str) -> dict[str, Any]:
        record = await self.get(task_id)
        if record.status in tasks.FINISHED:
            raise Conflict(f"download task {task_id} already {record.status}; there is nothing to cancel")
        if task_id in self._queue:
            self._queue.remove(task_id)
            self._tokens.pop(task_id, None)
            await self._cancel(
                task_id,
                record.model_id,
                error="canceled",
            )
        elif task_id in self._workers:
            await self._cancel_worker(task_id)
        return self.describe(await self.get(task_id))

    async def _cancel_worker(self, task_id: str) -> None:
        """Stop a task a worker has taken: before its spawn (the worker sees the flag) or its child."""
        worker = self._workers.get(task_id)
        if worker is None:
            return
        self._cancel_requested.add(task_id)
        running = self._running.get(task_id)
        if running is not None:
            await self._stop_child(running)
        await asyncio.shield(worker)

    async def shutdown(self) -> bool:
        """Cancel everything and persist it (docs/architecture.md, "Start-up and shutdown").

        False if a final state could not be written."""
        self._closing = True
        for task_id in list(self._queue):
            self._queue.remove(task_id)
            row = await self.db.query(model_store.task_row, task_id)
            if row is not None:
                await self._cancel(
                    task_id,
                    row["model_id"],
                    error="shutdown",
                )
        await asyncio.gather(*(self._cancel_worker(task_id) for task_id in list(self._workers)))
        self._tokens.clear()
        return not self.persist_failed

    # --- the workers ---------------------------------------------------------------------------

    def _pump(self) -> None:
        """Give queued tasks to free workers. A worker counts from the moment it takes a task."""
        while self._queue and len(self._workers) < self.config.max_parallel_downloads and not self._closing:
            task_id = self._queue.popleft()
            worker = asyncio.ensure_future(self._run(task_id))
            self._workers[task_id] = worker  # also keeps a reference: the loop holds tasks weakly
            worker.add_done_callback(lambda _f, t=task_id: self._worker_done(t))

    def _worker_done(self, task_id: str) -> None:
        self._workers.pop(task_id, None)
        self._cancel_requested.discard(task_id)
        self._pump()

    async def _run(self, task_id: str) -> None:
        token = self._tokens.pop(task_id, None)
        record = await self.get(task_id)
        try:
            started = await self.db.query(model_store.mark_running, task_id)
        except Exception:
            log.exception("could not persist task %s as running", task_id)
            started = False
        if not started:
            await self._fail(
                task_id,
                record.model_id,
                error="could not start",
            )
            return
        record = await self.get(task_id)  # now running, with started_at
        target = self.root / record.model_id
        loop = asyncio.get_running_loop()
        total: int | None = None
        try:
            await loop.run_in_executor(None, files.prepare_target, self.root, target)
            total = await self._hub_total(record, token)
            shortfall = None
            if total is not None:
                shortfall = await loop.run_in_executor(None, files.disk_shortfall, self.root, target, total)
            if task_id in self._cancel_requested:  # canceled (or shut down) while we got here
                await self._cancel(
                    task_id,
                    record.model_id,
                    error="canceled",
                )
                return
            if shortfall is not None:
                log.warning("download %s: %s", task_id, shortfall)
                await self._fail(
                    task_id,
                    record.model_id,
                    error=shortfall,
                    bytes_total=total,
                )
                return
            proc = self._spawn(record, target, token)
        except (InvalidArguments, OSError) as exc:
            message = exc.message if isinstance(exc, InvalidArguments) else f"cannot start hf: {exc}"
            await self._fail(task_id, record.model_id, error=message)
            return
        # The child is reaped once: ask once, here, and let every waiter share this future.
        running = Running(proc, target, asyncio.ensure_future(children.exited(proc)))
        self._running[task_id] = running
        buffer = self._logs[task_id] = LogBuffer()
        progress = self._progress[task_id] = Progress(total=total)
        await self._emit_task(task_id)
        poller = asyncio.ensure_future(self._poll(task_id, record, running, progress))
        try:
            await children.drain(proc, buffer)
            code = await asyncio.shield(running.exited)
        finally:
            poller.cancel()
        await self._complete(task_id, record, running, progress, buffer, code)

    def _spawn(self, record: tasks.TaskRecord, target: Path, token: str | None) -> Subprocess:
        # Validated values only: the repository starts alphanumeric and the revision can't start
        # with "-", so neither can be read as a flag.
        argv = [self.config.hf_bin, "download", record.repository, "--revision", record.revision]
        argv += ["--local-dir", str(target)]
        if self.config.hf_cache_dir:
            argv += ["--cache-dir", str(self.config.hf_cache_dir)]
        extra = {
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",
            "NO_COLOR": "1",
        }
        if token:
            extra["HF_TOKEN"] = token
        else:
            extra["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"  # noqa: S105 - a switch, not a secret
        log.info("download %s: starting hf for %s@%s", record.id, record.repository, record.revision)
        return children.spawn(argv, child_env(extra), cwd=self.root, parent_death=True)

    async def _hub_total(self, record: tasks.TaskRecord, token: str | None) -> int | None:
        """The repository's size from the hub's file list, or None if it doesn't say in time."""
        loop = asyncio.get_running_loop()
        lookup = loop.run_in_executor(None, files.hub_total, record.repository, record.revision, token)
        try:
            return await asyncio.wait_for(lookup, HUB_TOTAL_TIMEOUT_S)
        except TimeoutError:
            log.info(
                "download %s: the hub did not tell the size within %.0f s", record.id, HUB_TOTAL_TIMEOUT_S
            )
            return None

    async def _poll(
        self, task_id: str, record: tasks.TaskRecord, running: Running, progress: Progress
    ) -> None:
        loop = asyncio.get_running_loop()
        last_persist = time.monotonic()
        while True:
            done = await loop.run_in_executor(None, files.measure, running.target)
            now = time.monotonic()
            changed = done != progress.done
            if changed:
                progress.last_change = now
                if progress.since is None and progress.last_sample is not None:
                    progress.since = progress.last_sample
            if progress.last_sample is not None:
                then, before = progress.last_sample
                instant = max(done - before, 0) / max(now - then, 1e-6)
                progress.rate = instant if progress.rate == 0 else 0.7 * progress.rate + 0.3 * instant
            progress.last_sample = (now, done)
            progress.done = done
            stalled = now - progress.last_change >= self.stall_after_s
            if stalled and not progress.stalled:
                log.warning("download %s: no progress for %.0f s", task_id, self.stall_after_s)
            if changed or stalled != progress.stalled:
                progress.stalled = stalled
                self._emit(self.describe(record))
            if now - last_persist >= PERSIST_PROGRESS_S:
                last_persist = now
                await self.db.query(model_store.save_progress, task_id, done, progress.total)
            await asyncio.sleep(POLL_S)

    async def _complete(
        self,
        task_id: str,
        record: tasks.TaskRecord,
        running: Running,
        progress: Progress,
        buffer: LogBuffer,
        code: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, files.write_log, self.logs_dir / f"{task_id}.log", buffer)
        if code != 0:
            # A killed hf leaves its partial files behind; a new run never resumes them.
            await loop.run_in_executor(None, files.remove_partials, running.target)
        done = await loop.run_in_executor(None, files.measure, running.target)
        if task_id in self._cancel_requested:
            await self._cancel(
                task_id,
                record.model_id,
                error="canceled",
                exit_code=code,
                bytes_done=done,
            )
        elif code == 0:
            try:
                size = await loop.run_in_executor(None, files.verify_target, self.root, record.model_id)
            except (InvalidArguments, OSError) as exc:
                message = exc.message if isinstance(exc, InvalidArguments) else str(exc)
                await self._fail(
                    task_id,
                    record.model_id,
                    error=message,
                    exit_code=code,
                    bytes_done=done,
                )
            else:
                await self._finish(
                    task_id,
                    record.model_id,
                    TaskStatus.SUCCEEDED,
                    model_status=ModelStatus.READY,
                    exit_code=0,
                    bytes_done=size,
                    bytes_total=size,
                    size_bytes=size,
                )
        else:
            last = buffer.last_line(prefer=b"Error:") or f"hf exited with {code}"
            await self._fail(
                task_id,
                record.model_id,
                exit_code=code,
                error=cut_utf8(last.encode(), ERROR_MAX).decode("utf-8", "ignore"),
                bytes_done=done,
            )
        self._running.pop(task_id, None)
        self._progress.pop(task_id, None)
        self._logs.pop(task_id, None)
        log.info("download %s: hf exited with %s", task_id, code)

    async def _fail(self, task_id: str, model_id: str, **fields: Any) -> None:
        """The task failed, and so did its model's download."""
        await self._finish(task_id, model_id, TaskStatus.FAILED, model_status=ModelStatus.FAILED, **fields)

    async def _cancel(self, task_id: str, model_id: str, **fields: Any) -> None:
        """The task was canceled (by a client, a restart or shutdown), and its model's download too."""
        await self._finish(
            task_id, model_id, TaskStatus.CANCELED, model_status=ModelStatus.CANCELED, **fields
        )

    async def _finish(self, task_id: str, model_id: str, status: TaskStatus, **fields: Any) -> None:
        """Persist a terminal state and publish it; a failed write makes shutdown exit non-zero."""
        progress = self._progress.get(task_id)
        if progress is not None and progress.total is not None:
            fields.setdefault("bytes_total", progress.total)
        try:
            await self.db.query(model_store.finish_task, task_id, model_id, status, **fields)
        except Exception:
            log.exception("could not persist download %s as %s", task_id, status)
            self.persist_failed = True
            return
        await self._emit_task(task_id)

    async def _stop_child(self, running: Running) -> None:
        """SIGTERM to the child's group, SIGKILL after the grace period. Runs on the IOLoop."""
        pid = running.proc.pid
        children.signal_group(pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(running.exited), TERM_GRACE_S)
        except TimeoutError:
            log.warning("hf child %d ignored SIGTERM; killing its process group", pid)
        # The group may hold more than the main pid (helpers it started): kill whatever is left.
        children.signal_group(pid, signal.SIGKILL)

"""`models.*` (docs/models-and-downloads.md): list, get, add, register local / Hugging Face, scan, delete.

Ids are validated by the input models (pattern) before any query or file
operation; filesystem work runs in an executor; `models.delete` holds the
lifecycle lock until its delete has committed.

`models.add` is the console's one step (docs/models-and-downloads.md, "Add model"): a `source` that
reads as `owner/name` is a Hugging Face repository, asked about on the hub (models/hub.py, in the
executor, bounded by `HUB_CHECK_TIMEOUT_S`) before anything is saved, then registered and its download
started at once; anything else is a directory under the models root, registered as `register_local`
does. Any refusal leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from vllm_use.abilities.downloads import TaskOut, Token
from vllm_use.clock import now_ms
from vllm_use.context import Call
from vllm_use.deployments import store as deployment_store
from vllm_use.errors import Conflict, InvalidArguments, NotFound
from vllm_use.fields import NO_CONTROL, ModelId
from vllm_use.models import files, hub, records, store
from vllm_use.models.records import ModelStatus
from vllm_use.registry import Args, NoArgs, Registry, Result
from vllm_use.scopes import MODELS_WRITE, READ

log = logging.getLogger(__name__)

HUB_CHECK_TIMEOUT_S = 30.0  # the whole hub check; past it the add is refused, nothing saved

ModelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=records.NAME_MAX, pattern=NO_CONTROL),
    Field(description="1 to 256 UTF-8 bytes, no control characters"),
]


class IdArgs(Args):
    id: ModelId


class LocalArgs(Args):
    name: ModelName | None = Field(
        default=None, description="1 to 256 UTF-8 bytes, no control characters; default: the directory's name"
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        pattern=NO_CONTROL,
        description="a directory directly under the models root, absolute or relative to it",
    )


class HuggingFaceArgs(Args):
    repository: str = Field(
        min_length=3,
        max_length=records.REPO_MAX,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="owner/name on the Hub (letters, digits, '.', '_', '-')",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=records.REVISION_MAX,
        pattern=r"^[^\s\x00-\x1f\x7f-\x9f-][^\s\x00-\x1f\x7f-\x9f]*$",
        description="a branch, tag or commit: no spaces or control characters, not starting with '-'",
    )
    name: ModelName | None = None


Revision = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=records.REVISION_MAX,
        pattern=r"^[^\s\x00-\x1f\x7f-\x9f-][^\s\x00-\x1f\x7f-\x9f]*$",
    ),
    Field(description="a branch, tag or commit: no spaces or control characters, not starting with '-'"),
]


class AddArgs(Args):
    source: str = Field(
        min_length=1,
        max_length=4096,
        pattern=NO_CONTROL,
        description="a Hugging Face repository (owner/name: checked on the hub, registered and downloaded "
        "at once) or a directory directly under the models root (a plain name or an absolute path)",
    )
    revision: Revision | None = Field(
        default=None,
        description="for a repository (default main): a branch, tag or commit, no spaces or control "
        "characters, not starting with '-'",
    )
    token: Token | None = Field(
        default=None,
        description="for a gated or private repository, printable ASCII: used for the hub check and this "
        "download only; never stored or logged",
    )
    name: ModelName | None = Field(
        default=None, description="default: the repository or the directory's name"
    )


class DeleteArgs(Args):
    id: ModelId
    files: bool = Field(default=False, description="also remove the model's directory")


class ModelOut(Result):
    id: str
    name: str
    source: Literal["local", "huggingface"]
    repository: str | None
    revision: str | None
    status: ModelStatus
    path: str | None
    size_bytes: int | None
    error: str | None
    created_at: str
    updated_at: str


class ModelResult(Result):
    model: ModelOut


class Added(Result):
    model: ModelOut
    task: TaskOut | None = Field(description="the download started for a repository; null for a directory")


class ModelList(Result):
    models: list[ModelOut]


class Deleted(Result):
    deleted: str


def root(call: Call) -> Path:
    return call.app.config.models_dir


async def in_executor(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def load_model(call: Call, model_id: str) -> records.ModelRecord:
    """The validated record, or NotFound. `model_id` was validated by the input model."""
    row = await call.app.db.query(store.model_row, model_id)
    if row is None:
        raise NotFound(f"no model with id {model_id}")
    return records.parse_row(row)


def display_name(directory: str) -> str:
    """A model's default name: its directory's, shortened to fit the name's byte limit."""
    return directory if len(directory.encode()) <= records.NAME_MAX else directory[:60]


def new_record(name: str, source: str, directory: str, **fields: Any) -> dict[str, Any]:
    now = now_ms()
    model_id = fields.pop("id", None) or uuid.uuid4().hex
    return {
        "id": model_id,
        "name": name,
        "source": source,
        "repository": None,
        "revision": None,
        "dir": directory or model_id,
        "status": ModelStatus.REGISTERED,
        "size_bytes": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
        **fields,
    }


async def list_models(call: Call, args: NoArgs) -> dict[str, Any]:
    rows = await call.app.db.query(store.model_rows)
    return {"models": [records.parse_row(row).public(root(call)) for row in rows]}


async def get_model(call: Call, args: IdArgs) -> dict[str, Any]:
    return {"model": (await load_model(call, args.id)).public(root(call))}


async def register_local(call: Call, args: LocalArgs, field: str = "path") -> dict[str, Any]:
    """Also `models.add` for a directory, which names the `field` "source" in its errors."""
    if args.name is not None:  # an explicit name is checked as given: "" and blanks are refused
        records.validate_name(args.name)
    directory = await in_executor(files.resolve_local_dir, root(call), args.path, field)
    size = await in_executor(files.directory_size, root(call) / directory)
    name = args.name if args.name is not None else display_name(directory)
    record = new_record(name, "local", directory, status=ModelStatus.READY, size_bytes=size)
    if not await call.app.db.query(store.insert_model, record):
        raise Conflict(f"{root(call) / directory} is already registered", loc=[field])
    return {"model": records.parse_row(record).public(root(call))}


async def register_huggingface(call: Call, args: HuggingFaceArgs) -> dict[str, Any]:
    records.validate_repository(args.repository)
    records.validate_revision(args.revision)
    name = records.validate_name(args.name) if args.name is not None else args.repository
    model_id = uuid.uuid4().hex
    record = new_record(
        name, "huggingface", model_id, id=model_id, repository=args.repository, revision=args.revision
    )
    if not await call.app.db.query(store.insert_model, record):
        raise Conflict("a model already owns this directory")
    return {"model": records.parse_row(record).public(root(call))}


def is_repository(source: str) -> bool:
    """`owner/name` (one slash, not a path: no leading '/', '.' or '~') reads as a Hugging Face
    repository; anything else is a directory. A directory must sit directly under the models root,
    so a relative `a/b` could never be one."""
    return source.count("/") == 1 and not source.startswith(("/", ".", "~")) and not source.endswith("/")


async def add(call: Call, args: AddArgs) -> dict[str, Any]:
    source = args.source.strip()
    if not is_repository(source):
        for field_name in ("revision", "token"):
            if getattr(args, field_name) is not None:
                raise records.invalid(field_name, "only for a Hugging Face repository, not a directory")
        try:
            local = await register_local(call, LocalArgs(path=source, name=args.name), "source")
        except InvalidArguments as exc:
            if "does not exist" not in exc.message:
                raise
            missing = exc.message.removeprefix("invalid arguments: source: ")
            raise records.invalid(
                "source", f"{missing} (a Hugging Face repository is written owner/name)"
            ) from None
        return {**local, "task": None}
    try:
        repository = records.validate_repository(source, "source")
    except InvalidArguments:
        raise records.invalid(
            "source",
            "a Hugging Face repository is owner/name (letters, digits, '-', '_', '.'), e.g. acme/tiny-chat",
        ) from None
    revision = records.validate_revision(args.revision or "main")
    name = records.validate_name(args.name) if args.name is not None else repository
    # A repository already registered at this revision: say so before asking the hub.
    existing = await call.app.db.query(store.model_rows)
    for row in existing:
        same = records.parse_row(row)
        if same.repository == repository and same.revision == revision:
            raise Conflict(
                f"{repository}@{revision} is already registered as {same.name} ({records_word(same.status)}); "
                "use its row on the Models page (Download, Retry or Delete)",
                loc=["source"],
            )
    # Only what the hub says may be downloaded is saved (models/hub.py); it runs in the executor.
    try:
        await asyncio.wait_for(in_executor(hub.check, repository, revision, args.token), HUB_CHECK_TIMEOUT_S)
    except TimeoutError:
        raise hub.unreachable(f"no answer within {HUB_CHECK_TIMEOUT_S:.0f} s") from None
    model_id = uuid.uuid4().hex
    record = new_record(name, "huggingface", model_id, id=model_id, repository=repository, revision=revision)
    if not await call.app.db.query(store.insert_model, record):
        raise Conflict("a model already owns this directory")
    task = await call.app.downloads.start(model_id, None, args.token)
    model = await load_model(call, model_id)
    log.info("models.add: %s@%s registered as %s, download %s", repository, revision, model_id, task["id"])
    return {"model": model.public(root(call)), "task": task}


def records_word(status: ModelStatus) -> str:
    """The console's word for a model's status (static/js/states.js), for messages."""
    words = {
        ModelStatus.READY: "downloaded",
        ModelStatus.REGISTERED: "not downloaded",
        ModelStatus.ERROR: "failed",
    }
    return words.get(status, str(status))


async def scan(call: Call, args: NoArgs) -> dict[str, Any]:
    known = await call.app.db.query(store.model_dirs)
    names = await in_executor(files.scan_candidates, root(call), known)
    found = []
    for name in names:
        size = await in_executor(files.directory_size, root(call) / name)
        found.append(new_record(display_name(name), "local", name, status=ModelStatus.READY, size_bytes=size))
    inserted = await call.app.db.query(store.insert_models, found)
    return {"models": [records.parse_row(r).public(root(call)) for r in inserted]}


async def delete(call: Call, args: DeleteArgs) -> dict[str, Any]:
    app = call.app
    async with app.lifecycle.lock:
        record = await load_model(call, args.id)
        path = root(call) / record.dir if record.dir else None
        # Messages name the model and its deployments by name, as the operator knows them.
        if record.status is ModelStatus.DOWNLOADING:
            raise Conflict(f"{record.name} is downloading; cancel the download first")
        if app.lifecycle.is_running(record.id, path):
            raise Conflict(f"{record.name} is running in the runtime; stop the runtime first")
        serving = await app.db.query(deployment_store.using_model, record.id)
        if serving:
            which = (
                f"the deployment {serving[0]}"
                if len(serving) == 1
                else f"the deployments {', '.join(serving)}"
            )
            raise Conflict(
                f"{record.name} is served by {which}; delete {'it' if len(serving) == 1 else 'them'} "
                f"or give {'it' if len(serving) == 1 else 'them'} another model first"
            )
        quarantined = None
        if args.files and record.dir:
            try:
                quarantined = await in_executor(files.quarantine, root(call), record.id, record.dir)
            except OSError as exc:
                raise InvalidArguments(f"cannot move {path} aside: {exc.strerror}", loc=["files"]) from None
            records.crash_point("quarantined")
        try:
            deleted = await app.db.query(store.delete_model, record.id)
        except Exception:
            if quarantined is not None:
                await in_executor(files.restore, root(call), record.id, record.dir)
            raise
        if not deleted:
            raise NotFound(f"no model with id {record.id}")
        records.crash_point("committed")
    if quarantined is not None:
        try:
            await in_executor(files.purge, quarantined)
        except OSError:
            log.exception("could not remove %s; the next start removes it", quarantined)
    return {"deleted": record.id}


def register(registry: Registry) -> None:
    registry.method("models.list", "Registered models with status, path and size.", NoArgs, ModelList, READ)(
        list_models
    )
    registry.method("models.get", "One model by id.", IdArgs, ModelResult, READ)(get_model)
    registry.method(
        "models.add",
        "Add a model in one step: a Hugging Face repository (owner/name) is checked on the hub first "
        "(not found, gated or needing a token: refused, nothing saved), then registered and its download "
        "started; a directory under the models root is registered ready.",
        AddArgs,
        Added,
        MODELS_WRITE,
    )(add)
    registry.method(
        "models.register_local",
        "Register a model directory that already sits directly under the models root; it is ready at once.",
        LocalArgs,
        ModelResult,
        MODELS_WRITE,
    )(register_local)
    registry.method(
        "models.register_huggingface",
        "Register a Hugging Face repository (owner/name at a revision) to download into <models-dir>/<id>.",
        HuggingFaceArgs,
        ModelResult,
        MODELS_WRITE,
    )(register_huggingface)
    registry.method(
        "models.scan",
        "Register every real subdirectory of the models root that holds a config.json and has no record yet.",
        NoArgs,
        ModelList,
        MODELS_WRITE,
    )(scan)
    registry.method(
        "models.delete",
        "Delete a model record; with files=true also its directory (crash-safe). A running or downloading "
        "model cannot be deleted.",
        DeleteArgs,
        Deleted,
        MODELS_WRITE,
    )(delete)

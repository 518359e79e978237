"""A small, faithful fake of the Hugging Face Hub for the real `hf download` CLI (huggingface_hub 2.4).

Point the CLI at it with ``HF_ENDPOINT=hub.url``. It serves exactly what ``hf download REPO --revision
REV --local-dir DIR`` asks for, with the status codes, headers and JSON bodies the real Hub sends:

    GET  /api/models/{repo}[/revision/{rev}]            model info: ``sha``, ``siblings`` (``?blobs=true``: sizes)
    GET  /api/models/{repo}/tree/{rev}[/{dir}]          ``?recursive=true&expand=…``; paginated with a
                                                        ``Link: <…&cursor=N>; rel="next"`` header
    GET  /api/models/{repo}/auth-check                  200 when the token may download the repo, else
                                                        the errors below (``HfApi.auth_check``)
    HEAD|GET /{repo}/resolve/{rev}/{path}               regular file: 200 with ``ETag`` (git blob id),
                                                        ``X-Repo-Commit``, ``Content-Length``; ``Range`` → 206
                                                        LFS file: 302 to the "CDN" with ``X-Linked-Etag``
                                                        (sha256), ``X-Linked-Size``, ``X-Repo-Commit``
    HEAD|GET /_cdn/{repo}/{commit}/{path}               the CDN: no auth, ``Range`` supported
    anything else                                       404 (the CLI probes ``/api/agent-harnesses``)

Errors, as the Hub does them (huggingface_hub reads ``X-Error-Code``, then the JSON ``error`` field):

    unknown or ``missing()`` repo, no token     401  X-Error-Code: RepoNotFound  "Invalid username or password."
    unknown or ``missing()`` repo, any token    404  X-Error-Code: RepoNotFound  "Repository not found"
    ``require_token`` repo, no token            401  RepoNotFound (private) or GatedRepo (``gated=True``)
                                                 but a gated repo's model info and file list are public,
                                                 as on the Hub (model info says ``"gated": "manual"``)
    ``require_token`` repo, another token       401  X-Error-Message: "Invalid credentials in Authorization header"
    unknown revision                            404  X-Error-Code: RevisionNotFound
    unknown file                                404  X-Error-Code: EntryNotFound (with X-Repo-Commit)

A file is "LFS" (served through the CDN redirect, so the client drops ``Authorization`` for the body) when
its suffix is one the Hub's default ``.gitattributes`` tracks (``.safetensors``, ``.bin``, …) or when
``add_repo(lfs=…)`` names it. The CDN host is ``localhost`` (the hub itself listens on ``127.0.0.1``): a
different origin, which is what makes the client treat it as off-Hub.

Faults apply to GET bodies (resolve and CDN alike), keyed by (repo, path): ``slow``, ``fail_midway``,
``block``. Every wait watches the stop event, so ``stop()`` ends them and closes every open connection
within a second.

No xet headers are ever sent, so hf-xet (installed alongside huggingface_hub) is never used.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
import traceback
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

# Suffixes the Hub's default .gitattributes stores in LFS (a subset: the ones model repos use).
LFS_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".onnx",
    ".msgpack",
    ".gguf",
    ".model",
    ".npy",
    ".npz",
    ".pkl",
    ".pickle",
    ".parquet",
    ".arrow",
    ".zip",
    ".tar",
    ".gz",
    ".zst",
)
TREE_PAGE_SIZE = 1000  # the Hub's page size for /tree (50 when expand=true)
TREE_PAGE_SIZE_EXPANDED = 50
_CHUNK = 64 * 1024
_DATE = "2026-01-01T00:00:00.000Z"


class Request(NamedTuple):
    """One request as received: ``path`` keeps the query string; header names are lower-case; ``at``
    is when it arrived (``time.monotonic()``), taken before anything of the answer is sent."""

    method: str
    path: str
    headers: dict[str, str]
    at: float = 0.0


@dataclass
class _File:
    path: str
    data: bytes
    lfs: bool
    blob_id: str = field(init=False)  # git blob sha1, the Hub's `oid` and the ETag of a regular file
    sha256: str = field(init=False)  # the LFS oid, the ETag of an LFS file

    def __post_init__(self) -> None:
        self.blob_id = hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()  # noqa: S324
        self.sha256 = hashlib.sha256(self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id

    def pointer_size(self) -> int:
        return len(
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n"
        )


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit sha
    commits: dict[str, dict[str, _File]] = field(default_factory=dict)  # sha -> path -> file

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass
class _Fault:
    bytes_per_second: float | None = None
    fail_after: int | None = None
    fail_times: int | None = None  # None: every GET fails
    fail_reset: bool = False
    block_after: int | None = None


def _default_sha(files: dict[str, bytes], revision: str) -> str:
    digest = hashlib.sha1(revision.encode())  # noqa: S324
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


def _is_lfs_name(path: str) -> bool:
    return path.lower().endswith(LFS_SUFFIXES)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        self.connections: set[socket.socket] = set()
        self.handler_threads: set[threading.Thread] = set()
        self.conn_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.handler_threads.add(threading.current_thread())
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conn_lock:
                self.connections.discard(request)
                self.handler_threads.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up and connections closed by ``stop()`` are normal here."""

    def abort_connections(self) -> None:
        with self.conn_lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Abort(Exception):
    """Raised inside a handler to drop the connection without a response (stop, injected fault)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server.hub
        headers = {k.lower(): v for k, v in self.headers.items()}
        hub._record(Request(self.command, self.path, headers, time.monotonic()))
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
        try:
            hub._route(self)
        except _Abort:
            self.close_connection = True
        except OSError:  # the client hung up, or stop() shut the socket
            self.close_connection = True
        except Exception:
            traceback.print_exc()  # a bug in the fake: say so, and answer 500
            self.close_connection = True
            try:
                self.send_json(500, {"error": "FakeHub internal error"})
            except OSError:
                pass

    # --- helpers used by FakeHub._route -------------------------------------------------------------

    def send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        hdrs = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        hdrs.setdefault("Content-Length", str(len(body)))
        hdrs.setdefault("X-Request-Id", "Root=1-" + uuid.uuid4().hex[:24])
        for name, value in hdrs.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def send_json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(data).encode(), headers)

    def send_error_json(
        self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self.send_json(status, {"error": message}, headers)


class FakeHub:
    """An HTTP fake of the Hub on 127.0.0.1 (a free port), serving in a background thread.

    Use as a context manager (``with FakeHub() as hub:``), via the ``fake_hub`` fixture below, or with
    explicit ``start()``/``stop()``. All public methods are thread-safe and may be called while serving.
    """

    def __init__(self, *, cdn_host: str = "localhost") -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._repos: dict[str, _Repo] = {}
        self._missing: set[str] = set()
        self._tokens: dict[str, tuple[str, bool]] = {}
        self._faults: dict[tuple[str, str], _Fault] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._requests: list[Request] = []
        self._served: dict[tuple[str, str], int] = {}
        self._streaming: dict[str, int] = {}  # repo -> its file bodies being sent right now
        self.most_repos_streaming = 0  # the most repos whose files were ever sent at the same time
        self._claimed: dict[tuple[str, str], int] = {}
        self._cdn_host = cdn_host
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.tree_page_size = TREE_PAGE_SIZE
        self.port = 0

    # --- lifecycle ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, the value for ``HF_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeHub:
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakehub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> list[threading.Thread]:
        """Stop serving: end every sleep/block, close every open connection, join the threads.

        Returns the threads still alive after ``timeout`` (none, when every wait noticed the stop).
        """
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return []
        deadline = time.monotonic() + timeout
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        server.shutdown()
        server.abort_connections()
        server.server_close()
        thread.join(max(0.0, deadline - time.monotonic()))
        with server.conn_lock:
            handlers = list(server.handler_threads)
        for t in handlers:
            t.join(max(0.0, deadline - time.monotonic()))
        self._server = self._thread = None
        return [t for t in (thread, *handlers) if t.is_alive()]

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- content ------------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        revision: str = "main",
        sha: str | None = None,
        *,
        lfs: Iterable[str] | None = None,
    ) -> str:
        """Publish ``files`` (repo path → bytes; nested paths allowed) as commit ``sha`` of ``revision``.

        ``sha`` defaults to a deterministic 40-hex digest of the content. ``lfs`` names the paths to
        serve as LFS files; by default, those with an LFS suffix (``LFS_SUFFIXES``). Returns the sha.
        """
        sha = sha or _default_sha(files, revision)
        if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"sha must be 40 lower-case hex digits, got {sha!r}")
        lfs_paths = set(lfs) if lfs is not None else {p for p in files if _is_lfs_name(p)}
        commit = {p: _File(p, bytes(data), p in lfs_paths) for p, data in files.items()}
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo())
            repo.commits[sha] = commit
            repo.refs[revision] = sha
            self._missing.discard(repo_id)
        return sha

    def missing(self, repo_id: str) -> None:
        """Answer for ``repo_id`` as for a repository that does not exist (even if it was added)."""
        with self._lock:
            self._missing.add(repo_id)

    def require_token(self, repo_id: str, token: str, *, gated: bool = False) -> None:
        """Make ``repo_id`` private (or gated) to ``Authorization: Bearer <token>``."""
        with self._lock:
            self._tokens[repo_id] = (token, gated)

    # --- faults -------------------------------------------------------------------------------------

    def claim_size(self, repo_id: str, path: str, size: int) -> None:
        """Report ``size`` for the file in the model info's sizes (``?blobs=true``), whatever it holds."""
        with self._lock:
            self._claimed[(repo_id, path)] = size

    def slow(self, repo_id: str, path: str, bytes_per_second: float) -> None:
        """Stream the file's GET body at about ``bytes_per_second`` (small chunks with sleeps)."""
        with self._lock:
            self._faults.setdefault((repo_id, path), _Fault()).bytes_per_second = float(bytes_per_second)

    def fail_midway(
        self, repo_id: str, path: str, after_bytes: int, *, times: int | None = None, reset: bool = False
    ) -> None:
        """Send full headers, then the file's bytes up to offset ``after_bytes``, then drop the connection.

        The cut is at an absolute file offset, so a ranged retry that starts at or past it gets no byte:
        the fault persists across the client's resumes. ``times`` limits it to the next N GETs (None:
        all). ``reset=True`` closes with a TCP RST instead of a FIN.
        """
        with self._lock:
            fault = self._faults.setdefault((repo_id, path), _Fault())
            fault.fail_after, fault.fail_times, fault.fail_reset = int(after_bytes), times, reset

    def block(self, repo_id: str, path: str, *, after_bytes: int = 0) -> None:
        """Send the GET headers (and ``after_bytes`` bytes), then stall until ``unblock()`` or ``stop()``."""
        with self._lock:
            self._faults.setdefault((repo_id, path), _Fault()).block_after = int(after_bytes)
            self._blocked.add((repo_id, path))

    def unblock(self, repo_id: str | None = None, path: str | None = None) -> None:
        """Release blocked files (all of them by default); stalled responses carry on."""
        with self._cond:
            self._blocked = {
                k for k in self._blocked if not ((repo_id in (None, k[0])) and (path in (None, k[1])))
            }
            self._cond.notify_all()

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()
            self._blocked.clear()
            self._cond.notify_all()

    # --- recording ----------------------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """A snapshot of every request received, in order."""
        with self._lock:
            return list(self._requests)

    def reset_requests(self) -> None:
        """Forget the requests recorded so far (e.g. between two CLI runs of one test)."""
        with self._lock:
            self._requests.clear()

    def authorizations(self) -> list[str]:
        """The ``Authorization`` header values seen, in order (requests without one are skipped)."""
        return [r.headers["authorization"] for r in self.requests if "authorization" in r.headers]

    def gets(self, repo_id: str, path: str) -> list[Request]:
        """The body GETs for one file (resolve or CDN), e.g. to see the client's ``Range`` on resume."""
        suffixes = (f"/{quote(path)}",)
        return [
            r
            for r in self.requests
            if r.method == "GET"
            and urlsplit(r.path).path.endswith(suffixes)
            and (
                urlsplit(r.path).path.startswith(f"/{repo_id}/resolve/")
                or urlsplit(r.path).path.startswith(f"/_cdn/{repo_id}/")
            )
        ]

    def bytes_served(self, repo_id: str, path: str) -> int:
        """Body bytes written so far for one file, over all GETs."""
        with self._lock:
            return self._served.get((repo_id, path), 0)

    def _record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    # --- routing ------------------------------------------------------------------------------------

    def _route(self, h: _Handler) -> None:
        split = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = split.path.strip("/").split("/")
        if len(parts) >= 3 and parts[0] == "api" and parts[1] == "models" and h.command == "GET":
            self._api_models(h, parts[2:], query)
        elif len(parts) >= 4 and parts[0] == "_cdn" and h.command in ("GET", "HEAD"):
            self._cdn(h, parts[1:])
        elif "resolve" in parts[1:3] and h.command in ("GET", "HEAD"):
            self._resolve(h, parts)
        else:
            h.send_json(404, {"error": "Sorry, we can't find the page you are looking for."})

    def _authorize(self, h: _Handler, repo_id: str, *, metadata: bool = False) -> _Repo | None:
        """The repo if the request may see it; otherwise send the Hub's answer and return None.

        `metadata`: model info and the file list, which the Hub shows anyone for a gated repository
        (only its files need access)."""
        auth = h.headers.get("Authorization")
        with self._lock:
            repo = None if repo_id in self._missing else self._repos.get(repo_id)
            required = self._tokens.get(repo_id)
        if repo is None:
            if auth:
                h.send_error_json(404, "RepoNotFound", "Repository not found")
            else:
                h.send_error_json(401, "RepoNotFound", "Invalid username or password.")
            return None
        if required is not None:
            token, gated = required
            if auth == f"Bearer {token}" or (gated and metadata and not auth):
                return repo
            if auth:
                h.send_error_json(401, None, "Invalid credentials in Authorization header")
            elif gated:
                h.send_error_json(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in.",
                )
            else:
                h.send_error_json(401, "RepoNotFound", "Invalid username or password.")
            return None
        return repo

    @staticmethod
    def _split_repo(parts: list[str], keywords: tuple[str, ...]) -> tuple[str, list[str]]:
        """``a/b/tree/x`` → (``a/b``, [``tree``, ``x``]); also legacy one-segment ids (``gpt2/tree/x``)."""
        if len(parts) >= 2 and parts[1] in keywords:
            return parts[0], parts[1:]
        return "/".join(parts[:2]), parts[2:]

    def _api_models(self, h: _Handler, parts: list[str], query: dict[str, str]) -> None:
        repo_id, rest = self._split_repo(parts, ("revision", "tree", "auth-check"))
        if rest == ["auth-check"]:
            if self._authorize(h, repo_id) is not None:
                h.send_json(200, {"access": True})
            return
        if not rest:
            rest = ["revision", "main"]
        if rest[0] not in ("revision", "tree") or len(rest) < 2:
            h.send_json(404, {"error": "Sorry, we can't find the page you are looking for."})
            return
        repo = self._authorize(h, repo_id, metadata=True)
        if repo is None:
            return
        revision = unquote(rest[1])
        with self._lock:
            sha = repo.resolve(revision)
            files = dict(repo.commits[sha]) if sha else {}
        if sha is None:
            h.send_error_json(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if rest[0] == "revision":
            h.send_json(200, self._model_info(repo_id, sha, files, blobs=query.get("blobs") == "true"))
        else:
            self._tree(h, repo_id, revision, sha, files, unquote("/".join(rest[2:])), query)

    def _model_info(self, repo_id: str, sha: str, files: dict[str, _File], *, blobs: bool) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = []
        for f in sorted(files.values(), key=lambda f: f.path):
            entry: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                size = self._claimed.get((repo_id, f.path), len(f.data))
                entry.update(size=size, blobId=f.blob_id)
                if f.lfs:
                    entry["lfs"] = {"sha256": f.sha256, "size": size, "pointerSize": f.pointer_size()}
            siblings.append(entry)
        return {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],  # noqa: S324
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": sha,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": repo_id in self._tokens and not self._tokens[repo_id][1],
            "gated": "manual" if repo_id in self._tokens and self._tokens[repo_id][1] else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "library_name": "transformers",
            "siblings": siblings,
            "usedStorage": sum(len(f.data) for f in files.values()),
        }

    def _tree(
        self,
        h: _Handler,
        repo_id: str,
        revision: str,
        sha: str,
        files: dict[str, _File],
        base: str,
        query: dict[str, str],
    ) -> None:
        recursive = query.get("recursive", "false").lower() == "true"
        expand = query.get("expand", "false").lower() == "true"
        prefix = f"{base.strip('/')}/" if base.strip("/") else ""
        dirs: set[str] = set()
        entries: list[dict[str, Any]] = []
        for f in files.values():
            if not f.path.startswith(prefix):
                continue
            rel = f.path[len(prefix) :].split("/")
            for depth in range(1, len(rel)):
                if depth == 1 or recursive:
                    dirs.add(prefix + "/".join(rel[:depth]))
            if len(rel) == 1 or recursive:
                entry: dict[str, Any] = {
                    "type": "file",
                    "oid": f.blob_id,
                    "size": len(f.data),
                    "path": f.path,
                }
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": f.pointer_size()}
                if expand:
                    entry["lastCommit"] = {"id": sha, "title": "Upload", "date": _DATE}
                    entry["securityFileStatus"] = {"status": "safe", "avScan": None, "pickleImportScan": None}
                entries.append(entry)
        if prefix and not entries and not dirs:
            h.send_error_json(
                404, "EntryNotFound", f"{base} does not exist on {revision}", {"X-Repo-Commit": sha}
            )
            return
        for d in dirs:
            entry = {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "path": d}  # noqa: S324
            if expand:
                entry["lastCommit"] = {"id": sha, "title": "Upload", "date": _DATE}
            entries.append(entry)
        entries.sort(key=lambda e: e["path"])
        size = TREE_PAGE_SIZE_EXPANDED if expand else self.tree_page_size
        start = int(query.get("cursor") or 0)
        page = entries[start : start + size]
        headers = {"X-Repo-Commit": sha}
        if start + size < len(entries):
            split = urlsplit(h.path)
            params = [(k, v) for k, v in parse_qs(split.query).items() if k != "cursor"]
            qs = "&".join(f"{k}={quote(v[-1])}" for k, v in params) + f"&cursor={start + size}"
            headers["Link"] = f'<{self.url}{split.path}?{qs.lstrip("&")}>; rel="next"'
        h.send_json(200, page, headers)

    def _resolve(self, h: _Handler, parts: list[str]) -> None:
        repo_id, rest = self._split_repo(parts, ("resolve",))
        if not rest or rest[0] != "resolve" or len(rest) < 3:
            h.send_json(404, {"error": "Sorry, we can't find the page you are looking for."})
            return
        repo = self._authorize(h, repo_id)
        if repo is None:
            return
        revision, path = unquote(rest[1]), unquote("/".join(rest[2:]))
        with self._lock:
            sha = repo.resolve(revision)
            f = repo.commits[sha].get(path) if sha else None
        if sha is None:
            h.send_error_json(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if f is None:
            h.send_error_json(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
            return
        common = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            location = f"http://{self._cdn_host}:{self.port}/_cdn/{repo_id}/{sha}/{quote(path)}"
            body = f"Found. Redirecting to {location}".encode()
            h.send(
                302,
                body,
                {
                    **common,
                    "Content-Type": "text/plain; charset=utf-8",
                    "Location": location,
                    "ETag": f'"{f.sha256}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.data)),
                },
            )
            return
        self._send_file(h, repo_id, f, {**common, "ETag": f'"{f.blob_id}"'})

    def _cdn(self, h: _Handler, parts: list[str]) -> None:
        # /_cdn/{repo_id}/{sha}/{path}: repo ids have one or two segments; the sha is the 40-hex one.
        for i in (1, 2):
            if i < len(parts) and len(parts[i]) == 40:
                repo_id, sha, path = "/".join(parts[:i]), parts[i], unquote("/".join(parts[i + 1 :]))
                break
        else:
            h.send_json(404, {"error": "Not found"})
            return
        with self._lock:
            repo = self._repos.get(repo_id)
            f = repo.commits.get(sha, {}).get(path) if repo else None
        if f is None:
            h.send(
                404,
                b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code></Error>",
                {"Content-Type": "text/xml"},
            )
            return
        self._send_file(h, repo_id, f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"})

    # --- file bodies --------------------------------------------------------------------------------

    def _send_file(self, h: _Handler, repo_id: str, f: _File, headers: dict[str, str]) -> None:
        total = len(f.data)
        start, end = 0, total - 1
        status = 200
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes=") :].split(",")[0].strip().partition("-")
            try:
                if first:
                    start, end = int(first), min(int(last), total - 1) if last else total - 1
                else:
                    start, end = max(0, total - int(last)), total - 1
            except ValueError:
                start, end = 0, total - 1
            else:
                if start >= total or start > end:
                    h.send(416, b"", {"Content-Range": f"bytes */{total}"})
                    return
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end}/{total}"}
        headers = {
            **headers,
            "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start + 1),
            "Content-Disposition": f'inline; filename="{f.path.rsplit("/", 1)[-1]}"',
        }
        if h.command == "HEAD":
            h.send(status, b"", headers)
            return
        key = (repo_id, f.path)
        with self._lock:
            fault = self._faults.get(key)
            fault = _Fault(**vars(fault)) if fault else None
            if fault and fault.fail_after is not None:
                original = self._faults[key]
                if original.fail_times is not None:
                    if original.fail_times <= 0:
                        fault.fail_after = None
                    else:
                        original.fail_times -= 1
        h.send(status, b"", headers)
        with self._lock:
            self._streaming[repo_id] = self._streaming.get(repo_id, 0) + 1
            self.most_repos_streaming = max(self.most_repos_streaming, len(self._streaming))
        try:
            self._stream(h, key, f.data, start, end + 1, fault)
        finally:
            with self._lock:
                self._streaming[repo_id] -= 1
                if not self._streaming[repo_id]:
                    del self._streaming[repo_id]

    def _stream(
        self, h: _Handler, key: tuple[str, str], data: bytes, start: int, stop: int, fault: _Fault | None
    ) -> None:
        """Write ``data[start:stop]``, applying the file's faults at absolute file offsets."""
        rate = fault.bytes_per_second if fault else None
        chunk = max(1, int(rate / 20)) if rate else _CHUNK
        cut = fault.fail_after if fault else None
        hold = fault.block_after if fault else None
        pos, sent, started = start, 0, time.monotonic()
        while pos < stop:
            if self._stopping.is_set():
                raise _Abort
            limit = stop
            if hold is not None and key in self._blocked:
                if pos >= hold:
                    self._wait_unblocked(key)
                    continue
                limit = min(limit, hold)
            if cut is not None:
                if pos >= cut:
                    self._drop(h, reset=bool(fault and fault.fail_reset))
                limit = min(limit, cut)
            end = min(limit, pos + chunk)
            h.wfile.write(data[pos:end])
            h.wfile.flush()
            with self._lock:
                self._served[key] = self._served.get(key, 0) + (end - pos)
            sent += end - pos
            pos = end
            if rate:
                delay = started + sent / rate - time.monotonic()
                if delay > 0 and self._stopping.wait(delay):
                    raise _Abort

    def _wait_unblocked(self, key: tuple[str, str]) -> None:
        with self._cond:
            while key in self._blocked and not self._stopping.is_set():
                self._cond.wait(0.5)
        if self._stopping.is_set():
            raise _Abort

    @staticmethod
    def _drop(h: _Handler, *, reset: bool) -> None:
        """Close the connection mid-body: a FIN (the client sees a short body) or, with ``reset``, a RST."""
        h.wfile.flush()
        conn = h.connection
        if reset:
            # SO_LINGER with a zero timeout makes close() send a RST; every file object on the socket
            # must be closed for the descriptor to close.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.wfile.close()
            h.rfile.close()
            conn.close()
        else:
            conn.shutdown(socket.SHUT_RDWR)
        raise _Abort

#!/usr/bin/env python3
"""A fast, stdlib-only stand-in for the `vllm` executable, for the runtime supervisor's unit tests.

It mimics what the real vLLM 0.32 (CPU build) does, as measured in docs/vllm-facts.md:

- `vllm --version` prints the version (`0.32.0+fake`) and exits 0.
- `vllm serve MODEL [flags]` parses the serve flags (unknown `--flag [value…]` are recorded, not rejected,
  unless FAKE_VLLM_STRICT=1), binds the port at once but does NOT listen while "loading" (connections are
  refused, exactly like the real one), then listens and serves `GET /health` (200, empty body),
  `GET /version`, `GET /metrics`, `GET /v1/models`, `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`,
  `/v1/messages` and `/v1/messages/count_tokens` (plain and streamed). The generated text is a
  deterministic echo, `Echo: <the last user message>`, one piece (token) per word, cut to `max_tokens`
  and to the room the prompt leaves in `--max-model-len` (finish reason `length`); a prompt counts a
  token per word, plus 3 per message (1 for a completion's prompt). Every body, SSE event and error is vLLM 0.32's, from
  `tests/fakes/shapes.py` (shared with tests/fakes/upstream.py; both compared with the real one by
  tests/test_fakes_match_vllm.py): a request without `model` is served by the first served name, an
  unknown one is 404 ``The model `x` does not exist. Valid aliases: …``, a body that is not
  `application/json`, not JSON or not an object is 400, an unknown path 404, a wrong method 405.
- Like uvicorn, a keep-alive connection is closed 5 s after its last response (a fresh one that has
  not sent a request yet is not timed out).
- Log lines look like vLLM's: `(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:NN] …` on stdout, uvicorn's
  `INFO:     …` lines on stderr, the access log on stdout; `Uvicorn running on http://HOST:PORT` is printed
  once the socket is listening.
- SIGTERM/SIGINT: logs uvicorn's shutdown lines, terminates its child processes, exits 0 within ~0.1 s.
- A missing local model path (the positional starts with `/`, `.`, `~` or has 2+ slashes, and does not
  exist) or a path that is not a directory: error on stderr, exit 1. A port already in use: exit 1.
  `--gpu-memory-utilization` outside (0, 1], or `--enable-auto-tool-choice` without
  `--tool-call-parser`, or `--long-prefill-token-threshold` above the max model len (vLLM's
  SchedulerConfig check, a pydantic ValidationError): exit 1 (as the real one). A bad `--dtype` choice or a non-integer int flag:
  argparse error, exit 2.
- `--api-key K` (or env VLLM_API_KEY) makes every path under `/v1` (routed or not) answer 401
  `{"error": "Unauthorized"}` unless the first `Authorization` header is `Bearer K` (the scheme in any
  case), like the real one; `/health` and `/version` stay open.

Behaviour knobs (environment variables; all optional). vllm-use gives its children an allow-listed
environment without them, so tests set them in a wrapper script (`fake_vllm_bin` in tests/fakes/__init__.py):

  FAKE_VLLM_RECORD=/path.json   Write a JSON record: argv, parsed args, unknown args (`extra_args` as
                                `[{name, values}]`), pid, ppid, pgid, sid, cwd, env, open fds ({fd: target}),
                                parent-death signal (PR_GET_PDEATHSIG), SigBlk/SigIgn/SigCgt masks from
                                /proc/self/status (Python itself ignores SIGPIPE and SIGXFSZ; read before
                                any handler is installed), children [{pid, name}], phase
                                (`starting` → `loading` → `ready`, then `exited` with `exit_code` and
                                `exit_reason`). Rewritten atomically at each phase. `{pid}` in the path is
                                replaced by the pid (one file per start).
  FAKE_VLLM_IMPORT_SECONDS=0    Seconds before it even binds its port (the real one imports for ~10 s
                                first): meanwhile another process may take the port.
  FAKE_VLLM_LOAD_SECONDS=0.3    Seconds of "loading" (port bound but closed) before it listens.
  FAKE_VLLM_NEVER_HEALTHY=...   `503` (or `1`): listens, but /health answers 503 forever (other routes
                                work). `closed`: never listens (loads forever).
  FAKE_VLLM_IGNORE_SIGTERM=1    SIGTERM and SIGINT are logged and ignored; only SIGKILL ends it.
  FAKE_VLLM_EXIT_AFTER=<s>      <s> seconds after start, print a last line to stderr (containing
                                `FAKE_VLLM_EXIT_AFTER`) and exit with FAKE_VLLM_EXIT_CODE (default 1).
                                Children are terminated first unless FAKE_VLLM_EXIT_ORPHANS=1.
  FAKE_VLLM_SPAWN_CHILDREN=N    Start N child processes in the same process group (not a new session):
                                the first is `VLLM::EngineCore`, then `VLLM::Worker` (N=2) or
                                `VLLM::Worker_TP0..` (argv[0] and prctl(PR_SET_NAME), so /proc/PID/comm is
                                `VLLM::EngineCor` - 15 chars). They inherit stdout/stderr (so they hold the
                                log pipe open), exit on SIGTERM, and, like the real ones, do NOT die when the
                                main process is SIGKILLed (orphans until their group is signalled).
  FAKE_VLLM_LINE_BYTES=<n>      With FAKE_VLLM_LINES=<k>: print k lines of exactly n bytes each (newline
  FAKE_VLLM_LINES=<k>           not counted) while loading, alternating stdout/stderr (line 0 on stdout);
                                the last line always goes to stderr and contains `FAKE_VLLM_LAST_LINE`
                                (it is made long enough to hold the marker). Lines start with
                                `fake line NNNNNN ` and are padded with FAKE_VLLM_LINE_FILL (default `x`; a
                                multibyte character like `é` tests UTF-8 boundaries; the last few bytes
                                are `x` when the character doesn't fit).
  FAKE_VLLM_FAIL_ON_START=<c>   Halfway through loading: print EngineCore failure lines to stderr (the last
                                one `RuntimeError: Engine core initialization failed. …`) and exit <c>.
  FAKE_VLLM_TOKEN_SECONDS=0.002 Delay between streamed SSE chunks (raise it to test disconnects/relays).
  FAKE_VLLM_ENGINE_DIES=<n>     The engine dies once it has streamed n pieces in all (plain answers do
                                not count): the streams under way end as vLLM's do when its EngineCore
                                is killed (an in-band error event and a clean end; /v1/responses is cut),
                                then the server logs uvicorn's shutdown and exits 0, as the real one.
  FAKE_VLLM_OFFLINE=1           A hub id (e.g. `org/name`, not a local path) fails like the real one
                                without network: after the load time, error on stderr, exit 1. Default:
                                hub ids "load" like local paths.
  FAKE_VLLM_REQUIRE_CONFIG=1    A local directory without `config.json` fails like the real one (exit 1).
                                Default: any existing directory is accepted.
  FAKE_VLLM_STRICT=1            Unknown flags are an argparse error (exit 2), as in the real vLLM.
  FAKE_VLLM_VERSION=<v>         The version printed/served (default `0.32.0+fake`).
  FAKE_VLLM_NVML_DIR=<dir>      The fake NVML's directory (tests/fakes/nvml/pynvml.py): like the real one on
                                a GPU, it wants `--gpu-memory-utilization` of each visible GPU
                                (CUDA_VISIBLE_DEVICES, default `0`; the first `-tp` of them), fails to start
                                with vLLM's "Free memory on device … is less than desired GPU memory
                                utilization" when NVML shows less free, and holds that memory from its
                                load until it exits or sleeps. FAKE_VLLM_OOM_BESIDE_OTHERS=1: its start fails
                                with torch's "CUDA out of memory" while another process holds memory on
                                one of its GPUs (as a model whose peak exceeds its share does).
  Sleep mode                    With VLLM_SERVER_DEV_MODE=1 (as vLLM: the dev routes exist only then),
                                `POST /sleep?level=1`, `POST /wake_up`, `GET /is_sleeping` are served;
                                without `--enable-sleep-mode` sleep and wake answer 500. Asleep, it holds
                                5 % of its memory. FAKE_VLLM_SLEEP_KEEPS_MEMORY=1: /sleep answers 200 and
                                /is_sleeping true while the memory stays held (vllm-project/vllm#47654).
                                FAKE_VLLM_WAKE_FAILS=1: /wake_up answers 500 and it stays asleep.
                                FAKE_VLLM_SLEEP_SECONDS (default 0.1): how long /sleep and /wake_up take.
  FAKE_VLLM_BODIES=/path.jsonl  Append each chat completion's request body, as received (one JSON line
                                each), so a test sees what reached the upstream (e.g. the chat page's
                                attachments). Content parts are checked as vLLM's parser does: `text`,
                                `image_url` with a `url`, `input_audio` with `data` and `format`; another
                                part or a part without its field is a 400.
  FAKE_VLLM_METRICS_FAILS=1     `GET /metrics` answers 500 (the rest works): an instance whose metrics
                                cannot be read. Without it, /metrics serves a few of vLLM's families in the
                                Prometheus text format with its labels (`engine`, `model_name`):
                                `vllm:num_requests_running` (the streams under way), `..._waiting` (0),
                                `vllm:kv_cache_usage_perc` (0) and `vllm:generation_tokens_total` (the
                                streamed pieces so far).
  FAKE_VLLM_MAX_LIFETIME=600    Safety net: the main process and its children exit by themselves after
                                this many seconds (0 = never), so a forgotten test process doesn't linger.

Usage in tests: `--vllm-bin /abs/path/tests/fakes/vllm.py`; start it with `start_new_session=True` and
signal its process group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The shapes live next to this file, which runs as a bare executable (sys.path[0] is its directory,
# unless PYTHONSAFEPATH says otherwise); the tests import them as `tests.fakes.shapes`.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import shapes

VERSION = os.environ.get("FAKE_VLLM_VERSION") or "0.32.0+fake"
CHILD_MARK = "__fake_vllm_child__"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
STARTED = time.monotonic()

_out_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------- helpers


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        return default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def _write(stream: Any, data: bytes) -> None:
    with _out_lock:
        try:
            stream.buffer.write(data)
            stream.buffer.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass


def out(line: str) -> None:
    _write(sys.stdout, (line + "\n").encode("utf-8", "replace"))


def err(line: str) -> None:
    _write(sys.stderr, (line + "\n").encode("utf-8", "replace"))


def vlog(level: str, where: str, msg: str, proc: str = "APIServer", pid: int | None = None) -> str:
    """A line in vLLM's logger format, with the per-process prefix of vLLM ≥ 0.10."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"({proc} pid={pid or os.getpid()}) {level} {stamp} [{where}] {msg}"


def uvlog(msg: str) -> str:
    return f"(APIServer pid={os.getpid()}) INFO:     {msg}"


def set_comm(name: str) -> None:
    """prctl(PR_SET_NAME): the name `ps -o comm` and /proc/PID/comm show (15 bytes max)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def parent_death_signal() -> int | None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_int(0)
        if libc.prctl(2, ctypes.byref(value), 0, 0, 0) == 0:  # PR_GET_PDEATHSIG
            return value.value
    return None


def signal_masks() -> dict[str, str]:
    masks: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn", "SigCgt"):
                masks[key] = value.strip()
    return masks


def human_int(text: str) -> int:
    """vLLM's human_readable_int: `64M` = 64 MiB (upper case binary), `64m` = 64e6 (lower case decimal)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid human-readable integer: {text!r}")
    number, unit = m.groups()
    if not unit:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid integer: {text!r}")
        return int(number)
    power = "kmgt".index(unit.lower()) + 1
    base = 1024 if unit.isupper() else 1000
    return int(float(number) * base**power)


def max_len_arg(text: str) -> int:
    if text.strip().lower() in ("auto", "-1"):
        return -1
    return human_int(text)


# ---------------------------------------------------------------------------------------------- argv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (fake)")
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    sub = parser.add_subparsers(dest="subparser", required=True)
    serve = sub.add_parser("serve", help="Start the vLLM OpenAI Compatible API server.")
    bool_flag = argparse.BooleanOptionalAction
    serve.add_argument("model_tag", nargs="?", default=None)
    serve.add_argument("--model", default=None)
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-model-len", type=max_len_arg, default=None)
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--dtype", choices=DTYPES, default="auto")
    serve.add_argument("--quantization", "-q", default=None)
    serve.add_argument("--enable-prefix-caching", action=bool_flag, default=None)
    serve.add_argument("--tool-call-parser", default=None)
    serve.add_argument("--reasoning-parser", default=None)
    serve.add_argument("--enable-auto-tool-choice", action=bool_flag, default=False)
    serve.add_argument("--trust-remote-code", action=bool_flag, default=False)
    serve.add_argument("--distributed-executor-backend", default=None)
    serve.add_argument("--enforce-eager", action=bool_flag, default=False)
    serve.add_argument("--kv-cache-memory-bytes", type=human_int, default=None)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--seed", type=int, default=None)
    serve.add_argument("--long-prefill-token-threshold", type=int, default=None)
    serve.add_argument("--uvicorn-log-level", default="info")
    serve.add_argument("--disable-uvicorn-access-log", action=bool_flag, default=False)
    serve.add_argument("--disable-log-requests", action=bool_flag, default=False)
    serve.add_argument("--disable-log-stats", action=bool_flag, default=False)
    serve.add_argument("--enable-sleep-mode", action="store_true", default=False)
    return parser


def group_unknown(tokens: list[str]) -> list[dict[str, Any]]:
    """`--flag v1 v2 --other --x=y` → [{name: --flag, values: [v1, v2]}, {name: --other, values: []}, …]."""
    groups: list[dict[str, Any]] = []
    for tok in tokens:
        if tok.startswith("-") and len(tok) > 1 and not re.fullmatch(r"-\d+(\.\d+)?", tok):
            name, eq, value = tok.partition("=")
            groups.append({"name": name, "values": [value] if eq else []})
        elif groups:
            groups[-1]["values"].append(tok)
        else:
            groups.append({"name": None, "values": [tok]})
    return groups


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.count("/") >= 2 or os.sep + os.sep in model


# ---------------------------------------------------------------------------------------------- record


class Recorder:
    def __init__(self, base: dict[str, Any]) -> None:
        raw = os.environ.get("FAKE_VLLM_RECORD", "")
        self.path = raw.replace("{pid}", str(os.getpid())) if raw else ""
        self.data = base

    def write(self, **updates: Any) -> None:
        self.data.update(updates)
        if not self.path:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=1, sort_keys=True, default=str)
            os.replace(tmp, self.path)


def open_fds() -> dict[str, str]:
    """{fd: what it points to} for the fds inherited from the parent (e.g. to spot leaked sockets)."""
    fds: dict[str, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return fds
    for name in sorted(names, key=int):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if not target.startswith("/proc/") or not target.endswith("/fd"):  # the listing's own fd
                fds[name] = target
    return fds


# ---------------------------------------------------------------------------------------------- HTTP


def words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], family: int, app: App) -> None:
        self.address_family = family
        self.app = app
        super().__init__(addr, Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn() (a DNS lookup); bind only.
        if self.allow_reuse_address:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    """One connection: requests in turn, with uvicorn's keep-alive rule (`handle`)."""

    protocol_version = "HTTP/1.1"
    server: FakeServer

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        app = self.server.app
        if app.access_log:
            try:
                phrase = f"{int(code)} {self.responses.get(int(code), ('',))[0]}"
            except (TypeError, ValueError):
                phrase = str(code)
            host, port = self.client_address[:2]
            out(uvlog(f'{host}:{port} - "{self.command} {self.path} {self.request_version}" {phrase}'))

    def handle(self) -> None:
        """uvicorn closes a connection KEEP_ALIVE_S after its last response; a fresh one waits for
        its first request as long as it takes. (A pipelined request already buffered in `rfile`
        is not seen by select: nothing here pipelines.)"""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            try:
                readable, _, _ = select.select([self.connection], [], [], shapes.KEEP_ALIVE_S)
            except (OSError, ValueError):
                return
            if not readable:
                return  # idle too long: the server closes it
            self.handle_one_request()

    # -- plumbing

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, code: int, body: bytes, ctype: str = "application/json", **headers: str) -> None:
        self.send_response(code)
        if body or code != 200 or ctype != "application/json":
            self.send_header("content-type", ctype)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, shapes.json_bytes(obj))

    def _dispatch(self) -> None:
        app = self.server.app
        path = self.path.split("?", 1)[0]
        # Read first, whatever the answer: a body left unread would be taken for the next request.
        self.body = self._read_body()
        try:
            if not shapes.authorized(path, self.headers.get("Authorization"), app.api_key):
                self._json(401, shapes.UNAUTHORIZED)
                return
            shapes.check_route(path, self.command, ROUTES)
            routes = ROUTES[path]
            routes.get(self.command, routes.get("GET"))(self)
        except shapes.ApiError as e:
            headers = {"allow": e.allow} if isinstance(e, shapes.DetailError) and e.allow else {}
            self._send(e.status, shapes.json_bytes(e.body(path)), **headers)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _dispatch

    # -- routes

    def health(self) -> None:
        self._send(503 if self.server.app.never_healthy else 200, b"")

    def version(self) -> None:
        self._json(200, {"version": VERSION})

    def metrics(self) -> None:
        app = self.server.app
        if os.environ.get("FAKE_VLLM_METRICS_FAILS", "") not in ("", "0"):
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        self._send(200, app.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")

    def sleep(self) -> None:
        self._sleep_or_wake(True)

    def wake_up(self) -> None:
        self._sleep_or_wake(False)

    def _sleep_or_wake(self, asleep: bool) -> None:
        app = self.server.app
        if not app.args.enable_sleep_mode:
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        time.sleep(max(0.0, _env_float("FAKE_VLLM_SLEEP_SECONDS", 0.1)))
        if not asleep and os.environ.get("FAKE_VLLM_WAKE_FAILS", "") not in ("", "0"):
            err(
                vlog(
                    "ERROR", "gpu_worker.py:120", "CUDA out of memory while waking up (FAKE_VLLM_WAKE_FAILS)"
                )
            )
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        app.asleep = asleep
        keeps = os.environ.get("FAKE_VLLM_SLEEP_KEEPS_MEMORY", "") not in ("", "0")
        app.hold_memory(0.05 if asleep and not keeps else 1.0)
        self._send(200, b"")

    def is_sleeping(self) -> None:
        self._json(200, {"is_sleeping": self.server.app.asleep})

    def models(self) -> None:
        app = self.server.app
        self._json(200, shapes.models(app.served_names, app.model, app.max_model_len))

    def _request(self) -> dict[str, Any]:
        path = self.path.split("?", 1)[0]
        return shapes.parse_body(path, self.headers.get("Content-Type"), self.body)

    def _plan(
        self, body: dict[str, Any], prompt: str, n_prompt: int, limit: Any
    ) -> tuple[str, list[str], str]:
        """(model, pieces, finish reason): the echo of the prompt, cut to `limit` and to the room the
        prompt leaves in the context (finish reason `length`)."""
        app = self.server.app
        model = shapes.served_model(body, app.served_names)
        shapes.check_max_tokens(limit, app.max_model_len)
        if app.engine_dead.is_set():
            raise shapes.ApiError(500, shapes.ENGINE_DEAD, "InternalServerError")  # not measured: it exits
        room = max(app.max_model_len - n_prompt, 0)
        pieces = words("Echo: " + prompt)
        cap = room if limit is None else min(limit, room)
        if len(pieces) > cap:
            return model, pieces[:cap], "length"
        return model, pieces, "stop"

    def _answer(
        self,
        body: dict[str, Any],
        plan: tuple[str, list[str], str],
        n_prompt: int,
        shape: Any,
        stream: shapes.Stream,
    ) -> None:
        model, pieces, finish = plan
        if body.get("stream"):
            self._stream(stream, pieces, finish)
            return
        self._json(200, shape(shapes.Generated(model, "".join(pieces), n_prompt, len(pieces), finish)))

    def chat(self) -> None:
        body = self._request()
        messages = body.get("messages")
        shapes.check_messages(messages)
        check_parts(messages)
        self.server.app.record_body(self.body)
        last_user, n_prompt = "", 0
        for m in messages:
            text = shapes.text_of(m.get("content")) if isinstance(m, dict) else ""
            n_prompt += len(words(text)) + 3
            if isinstance(m, dict) and m.get("role") == "user":
                last_user = text
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        plan = self._plan(body, last_user.strip(), n_prompt, limit)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._answer(
            body, plan, n_prompt, shapes.chat_completion, shapes.ChatStream(plan[0], n_prompt, usage)
        )

    def completions(self) -> None:
        body = self._request()
        prompt = body.get("prompt")
        shapes.check_prompt(prompt)
        text = prompt if isinstance(prompt, str) else " ".join(str(p) for p in prompt)
        n_prompt = len(words(text)) + 1
        plan = self._plan(body, text.strip(), n_prompt, body.get("max_tokens"))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._answer(
            body, plan, n_prompt, shapes.completion, shapes.CompletionStream(plan[0], n_prompt, usage)
        )

    def responses_api(self) -> None:  # not `responses`: the status phrases of the base class
        body = self._request()
        given = body.get("input")
        if isinstance(given, list):
            text = " ".join(shapes.text_of(m.get("content")) for m in given if isinstance(m, dict))
        else:
            text = shapes.text_of(given)
        n_prompt = len(words(text)) + 3
        plan = self._plan(body, text.strip(), n_prompt, body.get("max_output_tokens"))
        max_len = self.server.app.max_model_len
        stream = shapes.ResponsesStream(plan[0], n_prompt, body, max_len)
        self._answer(body, plan, n_prompt, lambda g: shapes.response(body, g, max_len), stream)

    def _anthropic_prompt(self, body: dict[str, Any]) -> tuple[str, int]:
        messages = body.get("messages")
        shapes.check_messages(messages)
        texts = [shapes.text_of(m.get("content")) for m in messages if isinstance(m, dict)]
        return (texts[-1] if texts else ""), sum(len(words(t)) + 3 for t in texts)

    def messages(self) -> None:
        body = self._request()
        text, n_prompt = self._anthropic_prompt(body)
        plan = self._plan(body, text.strip(), n_prompt, body.get("max_tokens"))
        self._answer(body, plan, n_prompt, shapes.message, shapes.MessagesStream(plan[0], n_prompt))

    def count_tokens(self) -> None:
        body = self._request()
        shapes.served_model(body, self.server.app.served_names)
        self._json(200, shapes.count_tokens(self._anthropic_prompt(body)[1]))

    def _stream(self, stream: shapes.Stream, pieces: list[str], finish: str) -> None:
        """Write the events as chunks, FAKE_VLLM_TOKEN_SECONDS apart; the engine may die meanwhile
        (FAKE_VLLM_ENGINE_DIES)."""
        app = self.server.app
        self.send_response(200)
        self.send_header("content-type", shapes.SSE_CONTENT_TYPE)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        rid = getattr(stream, "id", "request")
        last = pieces.pop() if pieces else ""
        app.streaming(+1)
        try:
            self._chunk(stream.start())
            for i, piece in enumerate(pieces):
                if i and app.token_seconds > 0:
                    time.sleep(app.token_seconds)
                if app.generated_one():
                    self._chunk([stream.piece(piece)])
                else:
                    self._engine_died(stream)
                    return
            if app.token_seconds > 0 and pieces:
                time.sleep(app.token_seconds)
            if not app.generated_one():
                self._engine_died(stream)
                return
            self._chunk(stream.end(last, finish))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            out(vlog("INFO", "async_llm.py:437", f"Aborted request {rid}."))
        finally:
            app.streaming(-1)

    def _chunk(self, events: list[bytes]) -> None:
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()

    def _engine_died(self, stream: shapes.Stream) -> None:
        """What the real one sends when EngineCore dies under a stream; the server then exits."""
        events, clean = stream.engine_died()
        self._chunk(events)
        if clean:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        self.close_connection = True  # not clean: cut, without the last chunk


# Served only with VLLM_SERVER_DEV_MODE=1, as vLLM's development routes are.
DEV_ROUTES: dict[str, dict[str, Any]] = {
    "/sleep": {"POST": Handler.sleep},
    "/wake_up": {"POST": Handler.wake_up},
    "/is_sleeping": {"GET": Handler.is_sleeping},
}
ROUTES: dict[str, dict[str, Any]] = {
    "/health": {"GET": Handler.health},
    "/version": {"GET": Handler.version},
    "/metrics": {"GET": Handler.metrics},
    "/v1/models": {"GET": Handler.models},
    "/v1/chat/completions": {"POST": Handler.chat},
    "/v1/completions": {"POST": Handler.completions},
    "/v1/responses": {"POST": Handler.responses_api},
    "/v1/messages": {"POST": Handler.messages},
    "/v1/messages/count_tokens": {"POST": Handler.count_tokens},
}


# What a content part needs, by type (vLLM's ChatCompletionContentPartParam, the ones used here).
PART_FIELDS = {"text": ("text",), "image_url": ("image_url", "url"), "input_audio": ("input_audio", "data")}


def check_parts(messages: list[Any]) -> None:
    """A message's content list: each part of a known type with its field, as vLLM's parser wants."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            fields = PART_FIELDS.get(part.get("type")) if isinstance(part, dict) else None
            value: Any = part
            for name in fields or ():
                value = value.get(name) if isinstance(value, dict) else None
            if fields is None or not isinstance(value, str):
                raise shapes.ApiError(400, f"Unknown or incomplete content part: {str(part)[:80]}")


# ---------------------------------------------------------------------------------------------- main


class App:
    def __init__(self, args: argparse.Namespace, model: str) -> None:
        self.args = args
        self.model = model
        self.served_names: list[str] = list(args.served_model_name or [model])
        self.max_model_len = self._max_len()
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
        self.access_log = not args.disable_uvicorn_access_log
        self.token_seconds = max(0.0, _env_float("FAKE_VLLM_TOKEN_SECONDS", 0.002))
        mode = os.environ.get("FAKE_VLLM_NEVER_HEALTHY", "").strip().lower()
        self.never_listen = mode == "closed"
        self.never_healthy = mode in ("1", "503", "true", "yes")
        self.children: list[subprocess.Popen[bytes]] = []
        self.child_info: list[dict[str, Any]] = []
        self.server: FakeServer | None = None
        self.signals: list[int] = []
        raw = os.environ.get("FAKE_VLLM_ENGINE_DIES", "").strip()
        self.engine_dies_after = int(raw) if raw.isdigit() else None
        self.engine_dead = threading.Event()
        self.generated = 0
        self._streams = 0
        self._engine_lock = threading.Lock()
        self.asleep = False
        self.bodies = os.environ.get("FAKE_VLLM_BODIES") or None
        self._bodies_lock = threading.Lock()
        self.nvml_dir = os.environ.get("FAKE_VLLM_NVML_DIR") or None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")
        self.gpus = [int(i) for i in visible[: max(args.tensor_parallel_size, 1)] if i.strip().isdigit()]

    def record_body(self, raw: bytes) -> None:
        """FAKE_VLLM_BODIES: the request body, one line (compact JSON has no newline)."""
        if not self.bodies:
            return
        line = json.dumps(json.loads(raw), separators=(",", ":")).encode() + b"\n"
        with self._bodies_lock, open(self.bodies, "ab") as f:
            f.write(line)

    def _nvml(self) -> Any:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "nvml", "pynvml.py")
        spec = importlib.util.spec_from_file_location("fake_pynvml", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def short_of_memory(self) -> str | None:
        """vLLM's start-up check on a GPU: the free memory must cover what it wants."""
        if self.nvml_dir is None:
            return None
        nvml = self._nvml()
        beside = os.environ.get("FAKE_VLLM_OOM_BESIDE_OTHERS", "") not in ("", "0")
        for index in self.gpus:
            total, free = nvml.total_and_free(self.nvml_dir, index)
            if beside and free < total:
                return (
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU "
                    f"{index} has a total capacity of {total / 2**30:.2f} GiB of which "
                    f"{free / 2**30 - 0.01:.2f} GiB is free."
                )
            wanted = self.args.gpu_memory_utilization * total
            if free < wanted:
                return (
                    f"ValueError: Free memory on device cuda:{index} ({free / 2**30:.2f}/{total / 2**30:.2f} GiB) "
                    f"on startup is less than desired GPU memory utilization "
                    f"({self.args.gpu_memory_utilization}, {wanted / 2**30:.2f} GiB). Decrease GPU memory "
                    "utilization or reduce GPU memory used by other processes."
                )
        return None

    def hold_memory(self, fraction: float) -> None:
        """Hold `fraction` of the memory it wants on each of its GPUs (NVML shows it)."""
        if self.nvml_dir is None:
            return
        nvml = self._nvml()
        used = {}
        for index in self.gpus:
            total, _ = nvml.total_and_free(self.nvml_dir, index)
            used[index] = int(self.args.gpu_memory_utilization * total * fraction)
        nvml.record_process(self.nvml_dir, os.getpid(), used)

    def generated_one(self) -> bool:
        """One more streamed piece from the engine, or False: it died (FAKE_VLLM_ENGINE_DIES)."""
        with self._engine_lock:
            if self.engine_dead.is_set():
                return False
            if self.engine_dies_after is not None and self.generated >= self.engine_dies_after:
                self.engine_dead.set()
                return False
            self.generated += 1
            return True

    def streaming(self, delta: int) -> None:
        with self._engine_lock:
            self._streams += delta

    def active_streams(self) -> int:
        with self._engine_lock:
            return self._streams

    def metrics_text(self) -> bytes:
        """A few of vLLM's families as its /metrics writes them (prometheus_client's text format)."""
        with self._engine_lock:
            running, generated = self._streams, self.generated
        labels = f'engine="0",model_name="{self.served_names[0]}"'
        families = [
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "gauge", running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge", 0),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", 0),
            ("vllm:generation_tokens_total", "Number of generation tokens processed.", "counter", generated),
        ]
        lines = []
        for name, text, kind, value in families:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)}"]
        return ("\n".join(lines) + "\n").encode()

    def _max_len(self) -> int:
        if self.args.max_model_len is not None and self.args.max_model_len > 0:
            return int(self.args.max_model_len)
        with (
            contextlib.suppress(Exception),
            open(os.path.join(os.path.expanduser(self.model), "config.json")) as f,
        ):
            value = json.load(f).get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value
        return 2048


def child_main(name: str, tag: str, ready_fd: int) -> None:
    set_comm(name)
    pid = os.getpid()
    with contextlib.suppress(OSError):
        os.write(ready_fd, b".")
        os.close(ready_fd)
    out(vlog("INFO", "core.py:93", f"{name} started (fake), waiting for work", proc=tag, pid=pid))
    lifetime = _env_float("FAKE_VLLM_MAX_LIFETIME", 600.0)
    while lifetime <= 0 or time.monotonic() - STARTED < lifetime:
        time.sleep(0.2)
    os._exit(0)


def spawn_children(app: App, n: int) -> int:
    """Start the children; returns the read end of a pipe each writes one byte to once it's named."""
    me = os.path.abspath(__file__)
    ready_r, ready_w = os.pipe()
    for i in range(n):
        if i == 0:
            name, tag = "VLLM::EngineCore", "EngineCore_DP0"
        elif n == 2:
            name, tag = "VLLM::Worker", "Worker"
        else:
            name, tag = f"VLLM::Worker_TP{i - 1}", f"Worker_TP{i - 1}"
        argv = [name, me, CHILD_MARK, name, tag, str(ready_w)]
        proc = subprocess.Popen(
            argv, executable=sys.executable or "python3", stdin=subprocess.DEVNULL, pass_fds=(ready_w,)
        )
        app.children.append(proc)
        app.child_info.append({"pid": proc.pid, "name": name})
    os.close(ready_w)
    return ready_r


def stop_children(app: App, grace: float = 2.0) -> None:
    for p in app.children:
        with contextlib.suppress(OSError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in app.children:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(1.0)


def finish(app: App | None, rec: Recorder, code: int, reason: str, *, children: bool = True) -> None:
    if app is not None and children:
        stop_children(app)
    rec.write(phase="exited", exit_code=code, exit_reason=reason)
    with _out_lock:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
    os._exit(code)


def traceback_exit(rec: Recorder, lines: list[str], code: int, reason: str, app: App | None = None) -> None:
    err("Traceback (most recent call last):")
    err('  File "/opt/vllm/bin/vllm", line 10, in <module>')
    err("    sys.exit(main())")
    for line in lines:
        err(line)
    finish(app, rec, code, reason)


def serve_main(argv: list[str]) -> None:
    rec = Recorder(
        {
            "argv": [sys.argv[0], *argv],
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "cwd": os.getcwd(),
            "executable": sys.executable,
            "env": dict(os.environ),
            "open_fds": open_fds(),
            "parent_death_signal": parent_death_signal(),
            "signal_masks": signal_masks(),
            "children": [],
            "phase": "starting",
        }
    )
    rec.write()
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        rec.data.update(args=dict(vars(args)), unknown_args=unknown, extra_args=group_unknown(unknown))
        rec.write()
        if unknown and os.environ.get("FAKE_VLLM_STRICT", "") not in ("", "0"):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as e:  # argparse: usage error (2) or --help (0)
        rec.write(phase="exited", exit_code=e.code, exit_reason="argparse")
        raise

    # Signals: flag only; the main loop acts on them.
    pending: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        pending.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    model = args.model_tag or args.model or DEFAULT_MODEL
    app = App(args, model)
    ignore_term = os.environ.get("FAKE_VLLM_IGNORE_SIGTERM", "") not in ("", "0")
    exit_after = _env_float("FAKE_VLLM_EXIT_AFTER", -1.0)
    exit_code = _env_int("FAKE_VLLM_EXIT_CODE", 1)
    lifetime = _env_float("FAKE_VLLM_MAX_LIFETIME", 600.0)

    def pump(until: float | None) -> None:
        """Sleep until `until` (monotonic; None = forever), acting on signals and the exit knobs."""
        while True:
            while pending:
                signum = pending.pop(0)
                name = signal.Signals(signum).name
                if ignore_term:
                    err(vlog("WARNING", "fake_vllm.py:1", f"FAKE_VLLM_IGNORE_SIGTERM: ignoring {name}"))
                    continue
                if app.server is not None:
                    err(uvlog("Shutting down"))
                    err(uvlog("Waiting for application shutdown."))
                    err(uvlog("Application shutdown complete."))
                    err(uvlog(f"Finished server process [{os.getpid()}]"))
                else:
                    out(vlog("INFO", "launcher.py:101", f"Received {name} while loading, shutting down."))
                finish(app, rec, 0, f"signal {name}")
            now = time.monotonic()
            if exit_after >= 0 and now - STARTED >= exit_after:
                err(
                    vlog(
                        "ERROR",
                        "core_client.py:564",
                        "Engine core proc EngineCore_DP0 died unexpectedly, "
                        f"shutting down client. (FAKE_VLLM_EXIT_AFTER={exit_after:g})",
                    )
                )
                orphans = os.environ.get("FAKE_VLLM_EXIT_ORPHANS", "") not in ("", "0")
                finish(app, rec, exit_code, "exit_after", children=not orphans)
            if lifetime > 0 and now - STARTED >= lifetime:
                finish(app, rec, 0, "max_lifetime")
            if app.engine_dead.is_set():
                engine_died()
            if until is not None and now >= until:
                return
            step = 0.01
            if until is not None:
                step = min(step, max(until - now, 0.0))
            time.sleep(step)

    def engine_died() -> None:
        """FAKE_VLLM_ENGINE_DIES: the streams under way say so in-band, then the server shuts
        down and exits 0, as the real one does when its EngineCore dies."""
        err(
            vlog(
                "WARNING",
                "core_client.py:817",
                "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
            )
        )
        err(vlog("ERROR", "async_llm.py:906", "AsyncLLM output_handler failed."))
        err(
            vlog(
                "ERROR",
                "async_llm.py:906",
                f"vllm.v1.engine.exceptions.EngineDeadError: {shapes.ENGINE_DEAD}",
            )
        )
        deadline = time.monotonic() + 2.0
        while app.active_streams() and time.monotonic() < deadline:
            time.sleep(0.01)
        err(uvlog("Shutting down"))
        err(uvlog("Waiting for application shutdown."))
        err(uvlog("Application shutdown complete."))
        err(uvlog(f"Finished server process [{os.getpid()}]"))
        finish(app, rec, 0, "engine_died")

    # What the real one checks before run_server.
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        traceback_exit(
            rec, ["TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"], 1, "config"
        )
    if not (0 < args.gpu_memory_utilization <= 1):
        traceback_exit(
            rec,
            [
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
                "gpu_memory_utilization",
                f"  Input should be less than or equal to 1 [type=less_than_equal, input_value={args.gpu_memory_utilization}]",
            ],
            1,
            "config",
        )

    out(vlog("INFO", "api_server.py:1896", f"vLLM API server version {VERSION}"))
    defaults = vars(build_parser().parse_args(["serve"]))
    non_default = {k: v for k, v in vars(args).items() if defaults.get(k) != v and k != "subparser"}
    out(vlog("INFO", "utils.py:328", f"non-default args: {non_default!r}"))

    pump(time.monotonic() + max(0.0, _env_float("FAKE_VLLM_IMPORT_SECONDS", 0.0)))
    host = args.host if args.host else "0.0.0.0"  # noqa: S104 - the real default: all interfaces
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        app.server = None
        server = FakeServer((host, args.port), family, app)
        server.server_bind()  # bound now, listening only when "loaded": connections are refused meanwhile
    except OSError as e:
        traceback_exit(rec, [f"OSError: [Errno {e.errno}] {e.strerror}"], 1, "bind")

    hub_id = not looks_like_path(model) and not os.path.exists(os.path.expanduser(model))
    local = os.path.expanduser(model)
    bad_local = not hub_id and (
        not os.path.isdir(local)
        or (
            os.environ.get("FAKE_VLLM_REQUIRE_CONFIG", "") not in ("", "0")
            and not os.path.isfile(os.path.join(local, "config.json"))
        )
    )
    if bad_local:
        traceback_exit(
            rec,
            [
                f"ValueError: Invalid repository ID or local directory specified: '{model}'.",
                "Please verify the following requirements:",
                "1. Provide a valid Hugging Face repository ID.",
                "2. Specify a local directory that contains a recognized configuration file.",
                "   - For Hugging Face models: ensure the presence of a 'config.json'.",
            ],
            1,
            "model_path",
        )

    out(vlog("INFO", "model.py:547", "Resolved architecture: LlamaForCausalLM"))
    out(vlog("INFO", "model.py:1510", f"Using max model len {app.max_model_len}"))
    threshold = args.long_prefill_token_threshold
    if threshold is not None and threshold > app.max_model_len:  # vLLM's SchedulerConfig check
        traceback_exit(
            rec,
            [
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig",
                f"  Value error, long_prefill_token_threshold ({threshold}) cannot be greater than the "
                f"max_model_len ({app.max_model_len}). [type=value_error, input_value=ArgsKwargs((), "
                "{...}), input_type=ArgsKwargs]",
                "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
            ],
            1,
            "config",
        )
    if args.kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        msg = "Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default."
        out(vlog("WARNING", "cpu.py:121", msg))

    n_lines = _env_int("FAKE_VLLM_LINES", 0)
    line_bytes = _env_int("FAKE_VLLM_LINE_BYTES", 80)
    if n_lines > 0:
        fill = (os.environ.get("FAKE_VLLM_LINE_FILL") or "x").encode()
        for i in range(n_lines):
            last = i == n_lines - 1
            head = f"fake line {i:06d} " + ("FAKE_VLLM_LAST_LINE " if last else "")
            raw = head.encode()
            size = max(line_bytes, len(raw)) if last else line_bytes
            raw = raw[:size]
            reps = (size - len(raw)) // len(fill)
            raw += fill * reps
            raw += b"x" * (size - len(raw))
            _write(sys.stderr if last or i % 2 else sys.stdout, raw + b"\n")

    n_children = max(0, _env_int("FAKE_VLLM_SPAWN_CHILDREN", 0))
    ready_r = spawn_children(app, n_children)
    os.set_blocking(ready_r, False)
    named, wait_until = 0, time.monotonic() + 10
    while named < n_children and time.monotonic() < wait_until:
        try:
            chunk = os.read(ready_r, 64)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            break  # every child closed its end (named, or died)
        named += len(chunk or b"")
        if named < n_children:
            pump(time.monotonic() + 0.005)
    os.close(ready_r)
    rec.write(children=app.child_info, phase="loading")
    short = app.short_of_memory()
    if short is not None:
        err(vlog("ERROR", "core.py:708", "EngineCore failed to start.", proc="EngineCore_DP0"))
        traceback_exit(rec, [short], 1, "out_of_memory", app)
    app.hold_memory(1.0)
    if os.environ.get("VLLM_SERVER_DEV_MODE", "") == "1":
        ROUTES.update(DEV_ROUTES)
    out(
        vlog(
            "INFO",
            "core.py:93",
            f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{model}', "
            f"served_model_name={app.served_names[0]}, max_seq_len={app.max_model_len}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, dtype={args.dtype}, enforce_eager={args.enforce_eager}",
        )
    )

    load = max(0.0, _env_float("FAKE_VLLM_LOAD_SECONDS", 0.3))
    fail_code = os.environ.get("FAKE_VLLM_FAIL_ON_START", "").strip()
    if fail_code:
        pump(time.monotonic() + load / 2)
        err(vlog("ERROR", "core.py:708", "EngineCore failed to start.", proc="EngineCore_DP0"))
        err(
            vlog(
                "ERROR",
                "core.py:708",
                "FAKE_VLLM_FAIL_ON_START: simulated load failure",
                proc="EngineCore_DP0",
            )
        )
        try:
            code = int(fail_code)
        except ValueError:
            code = 1
        traceback_exit(
            rec,
            [
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
            ],
            code,
            "fail_on_start",
            app,
        )
    pump(time.monotonic() + load)
    if hub_id and os.environ.get("FAKE_VLLM_OFFLINE", "") not in ("", "0"):
        traceback_exit(
            rec,
            [
                "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the "
                "file on the Hub and we cannot find the requested files in the local cache.",
                f"OSError: We couldn't connect to 'https://huggingface.co' to load the files of {model}.",
            ],
            1,
            "offline",
            app,
        )
    if app.never_listen:
        out(vlog("INFO", "gpu_model_runner.py:2600", "FAKE_VLLM_NEVER_HEALTHY=closed: still loading..."))
        pump(None)

    out(vlog("INFO", "api_server.py:1692", f"Starting vLLM API server 0 on http://{host}:{args.port}"))
    out(vlog("INFO", "launcher.py:44", "Available routes are:"))
    for path, methods in ROUTES.items():
        out(vlog("INFO", "launcher.py:52", f"Route: {path}, Methods: {', '.join(methods)}"))
    err(uvlog(f"Started server process [{os.getpid()}]"))
    err(uvlog("Waiting for application startup."))
    err(uvlog("Application startup complete."))
    server.server_activate()
    app.server = server
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    err(uvlog(f"Uvicorn running on http://{shown}:{args.port} (Press CTRL+C to quit)"))
    rec.write(phase="ready")
    pump(None)


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 4 and argv[0] == CHILD_MARK:
        child_main(argv[1], argv[2], int(argv[3]))
        return
    if argv and argv[0] in ("--version", "-v"):
        print(VERSION, flush=True)
        return
    if argv and argv[0] == "serve":
        serve_main(argv)
        return
    build_parser().parse_args(argv)  # help, or argparse's usage error (exit 2)


if __name__ == "__main__":
    main()

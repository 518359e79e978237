"""Configuration: every option has a flag, an env var `VLLM_USE_<NAME>` and a default.

Precedence is flag > env > default. Everything is validated before the server
listens; a bad value raises `ConfigError` naming the option (`--port`), which
the CLI prints and turns into exit status 2. Credentials (`--admin-token`,
`--upstream-api-key`) live only here, in memory: never in settings, logs or
child environments (`child_env()` scrubs them).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vllm_use.errors import ConfigError
from vllm_use.fields import has_control
from vllm_use.jsonlog import TEXT_FORMAT, JsonFormatter, TextFormatter, lighten_records

ENV_PREFIX = "VLLM_USE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
LOOPS = ("uvloop", "asyncio")
_ALIAS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$")


Reader = Callable[["_Values", str], Any]  # (the options being read, this option's name) → its value


@dataclass(frozen=True)
class Option:
    """One configuration option: its flag, env var, default, and how its raw value is read."""

    name: str
    help: str
    default: Any
    read: Reader
    secret: bool = False
    switch: bool = (
        False  # a flag without a value (`--allow-remote-code`); env: 1/true/yes/on or 0/false/no/off
    )

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def option(
    help: str, default: Any, read: Reader, *, secret: bool = False, switch: bool = False
) -> dict[str, Any]:
    """The metadata that makes a `Config` field an option (`field(metadata=option(...))`); the field's
    name is the option's name."""
    return {"option": {"help": help, "default": default, "read": read, "secret": secret, "switch": switch}}


# --- readers: a raw value (a string from a flag or env, or the default) → the Config value ----------


def _text(max_len: int = 4096) -> Reader:
    def read(values: _Values, name: str) -> str:
        value = str(values.raw(name))
        if len(value) > max_len or has_control(value):
            raise ConfigError(
                values.label(name), f"must be at most {max_len} characters without control characters"
            )
        return value

    return read


def _integer(lo: int, hi: int) -> Reader:
    def read(values: _Values, name: str) -> int:
        value = values.raw(name)
        if isinstance(value, str):
            if not re.fullmatch(r"[0-9]{1,10}", value.strip()):
                raise ConfigError(values.label(name), f"must be an integer from {lo} to {hi}, got {value!r}")
            value = int(value.strip())
        if not lo <= value <= hi:
            raise ConfigError(values.label(name), f"must be an integer from {lo} to {hi}, got {value}")
        return value

    return read


def _fraction(values: _Values, name: str) -> float:
    """A number in (0, 1]."""
    value = values.raw(name)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not 0 < number <= 1:  # NaN fails too
        raise ConfigError(values.label(name), f"must be a number above 0 and at most 1, got {value!r}")
    return number


def _optional(read: Reader, unset: tuple[Any, ...] = (None, "")) -> Reader:
    """`read`, or None when the option's raw value is one of `unset` (not given, or empty)."""
    return lambda values, name: None if values.raw(name) in unset else read(values, name)


def _switch(values: _Values, name: str) -> bool:
    value = values.raw(name)
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(values.label(name), f"must be 1/true/yes/on or 0/false/no/off, got {value!r}")


def _path(values: _Values, name: str) -> Path:
    value = _text()(values, name)
    if not value:
        raise ConfigError(values.label(name), "must not be empty")
    return Path(value).expanduser().absolute()


def _models_dir(values: _Values, name: str) -> Path:
    return values["data_dir"] / "models" if not values.given(name) else _path(values, name)


def _host(values: _Values, name: str) -> str:
    host = _text(max_len=255)(values, name)
    _validate_host(host, values.label(name))
    return host


def _secret(file_option: str) -> Reader:
    """A credential from its flag/env, or read once from its file option (never both)."""

    def read(values: _Values, name: str) -> str | None:
        value, file_value = values.raw(name), values.raw(file_option)
        if value not in (None, "") and file_value not in (None, ""):
            raise ConfigError(
                values.label(file_option),
                f"give either {values.label(name)} or {values.label(file_option)}, not both",
            )
        if file_value in (None, ""):
            return _token(value, values.label(name))
        from vllm_use import fsafety  # no import cycle at module load: fsafety imports errors only

        secret = fsafety.read_secret_file(values[file_option], option=values.label(file_option))
        return _token(secret, values.label(file_option))

    return read


def _upstream(values: _Values, name: str) -> str:
    if not values.given(name):
        return f"http://127.0.0.1:{values['runtime_port']}"
    return validate_upstream(_text(max_len=2048)(values, name), values.label(name))


PORT_RANGE_MAX = 1000


def _port_range(values: _Values, name: str) -> range:
    """`FIRST-LAST`, both from 1024 to 65535, at most `PORT_RANGE_MAX` ports."""
    text = _text(max_len=16)(values, name).strip()
    found = re.fullmatch(r"([0-9]{4,5})-([0-9]{4,5})", text)
    first, last = (int(found.group(1)), int(found.group(2))) if found else (0, -1)
    if not (1024 <= first <= last <= 65535 and last - first < PORT_RANGE_MAX):
        raise ConfigError(
            values.label(name),
            f"must be FIRST-LAST, ports from 1024 to 65535, at most {PORT_RANGE_MAX} of them, got {text!r}",
        )
    return range(first, last + 1)


def _choice(allowed: tuple[str, ...]) -> Reader:
    def read(values: _Values, name: str) -> str:
        value = _text(max_len=16)(values, name).lower()
        if value not in allowed:
            raise ConfigError(values.label(name), f"must be one of {', '.join(allowed)}")
        return value

    return read


def _aliases(values: _Values, name: str) -> dict[str, str]:
    return parse_aliases(_text(max_len=65536)(values, name), values.label(name))


def _origins(values: _Values, name: str) -> tuple[str, ...]:
    return parse_origins(_text(max_len=65536)(values, name), values.label(name))


def _command(values: _Values, name: str) -> str:
    return _executable(_text()(values, name), values.label(name))


def _tools(values: _Values, name: str) -> tuple[str, ...]:
    """`--tools NAME[,NAME…]`: built-in tools by name (docs/tools.md); the file tools and
    exec_shell_command need `--tools-root`."""
    from vllm_use.tools.toolbox import BUILTIN_TOOLS, ROOTED_TOOLS  # the tools' own home

    names = tuple(dict.fromkeys(part.strip() for part in _text()(values, name).split(",") if part.strip()))
    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise ConfigError(
            values.label(name),
            f"unknown tool {unknown[0]!r}; the built-in tools are {', '.join(BUILTIN_TOOLS)}",
        )
    rooted = [n for n in names if n in ROOTED_TOOLS]
    if rooted and values["tools_root"] is None:
        raise ConfigError(values.label("tools_root"), f"is required by the tool {rooted[0]} (--tools)")
    return names


def _tools_root(values: _Values, name: str) -> Path | None:
    """A real directory (not a symlink), resolved, apart from the data and models dirs: neither
    one of them, nor inside one, nor containing one (a tool could read keys or models)."""
    if values.raw(name) in (None, ""):
        return None
    given, label = _path(values, name), values.label(name)
    if given.is_symlink() or not given.is_dir():
        raise ConfigError(label, f"must be an existing directory, not a symlink: {given}")
    root = given.resolve()
    for other in ("data_dir", "models_dir"):
        theirs = values[other].resolve()
        if root == theirs or root.is_relative_to(theirs) or theirs.is_relative_to(root):
            raise ConfigError(
                label, f"must be apart from {OPTIONS_BY_NAME[other].flag} (not it, in it, nor around it)"
            )
    return root


@dataclass(frozen=True)
class Config:
    """The validated configuration. Each `option(...)` field is an option (flag `--<name>`, env
    `VLLM_USE_<NAME>`), declared here once: its help, its raw default, how it is read. Adding an
    option is adding a field (and its README line: tests/test_docs.py checks). Options are read
    in this order, each on first use, so one may depend on another (`models_dir` on `data_dir`),
    and the first bad one stops the start, named by the flag or env var it came from."""

    host: str = field(metadata=option("address to listen on (loopback by default)", "127.0.0.1", _host))
    port: int = field(metadata=option("port to listen on", 8080, _integer(1, 65535)))
    data_dir: Path = field(
        metadata=option("where the SQLite database and admin-token live", "~/.local/share/vllm-use", _path)
    )
    models_dir: Path = field(metadata=option("managed models root", "<data-dir>/models", _models_dir))
    hf_cache_dir: Path | None = field(
        metadata=option("optional Hugging Face cache dir for hf children", None, _optional(_path))
    )
    admin_token: str | None = field(
        metadata=option(
            "bootstrap admin token (else <data-dir>/admin-token is used)",
            None,
            _secret("admin_token_file"),
            secret=True,
        )
    )
    admin_token_file: Path | None = field(
        metadata=option("read the bootstrap admin token from this file (0600)", None, _optional(_path))
    )
    upstream: str = field(
        metadata=option(
            "vLLM origin for /v1 (loopback http(s) only)", "http://127.0.0.1:<runtime-port>", _upstream
        )
    )
    upstream_api_key: str | None = field(
        metadata=option(
            "key injected as Bearer on upstream requests", None, _secret("upstream_api_key_file"), secret=True
        )
    )
    upstream_api_key_file: Path | None = field(
        metadata=option("read the upstream key from this file (0600)", None, _optional(_path))
    )
    model_aliases: dict[str, str] = field(metadata=option("alias=upstream-model,... for /v1", "", _aliases))
    max_audit_records: int = field(
        metadata=option("gateway audit records kept (0 = record nothing new)", 10000, _integer(0, 10_000_000))
    )
    trusted_origins: tuple[str, ...] = field(
        metadata=option("comma-separated extra origins allowed on /mcp", "", _origins)
    )
    vllm_bin: str = field(metadata=option("the vllm executable", "vllm", _command))
    hf_bin: str = field(metadata=option("the hf executable", "hf", _command))
    max_parallel_downloads: int = field(
        metadata=option("concurrent hf download children", 2, _integer(1, 64))
    )
    download_stall_timeout: int = field(
        metadata=option(
            "seconds without byte progress before a download is reported stalled", 600, _integer(1, 86400)
        )
    )
    runtime_port: int = field(
        metadata=option("port the supervised vllm serve listens on", 8000, _integer(1, 65535))
    )
    no_autoload: bool = field(
        metadata=option(
            "a /v1 request for a deployment that is not loaded gets 409 instead of loading it",
            False,
            _switch,
            switch=True,
        )
    )
    load_wait_timeout: int = field(
        metadata=option(
            "seconds a /v1 request waits for its deployment to load before 503", 600, _integer(1, 7200)
        )
    )
    max_waiting: int = field(
        metadata=option(
            "/v1 requests waiting for deployments to load, at most (then 503)", 64, _integer(0, 10_000)
        )
    )
    max_loaded: int = field(
        metadata=option(
            "deployment instances loaded at once; 0: one per GPU, 1 without GPUs (docs/router.md)",
            0,
            _integer(0, 64),
        )
    )
    gpu_memory_budget: float = field(
        metadata=option(
            "the share of each GPU's memory that loaded instances may hold together (docs/router.md)",
            0.95,
            _fraction,
        )
    )
    max_sleep: int = field(
        metadata=option(
            "seconds an instance may sleep before it is stopped to free host memory; 0: no limit",
            3600,
            _integer(0, 604_800),
        )
    )
    runtime_ports: range = field(
        metadata=option(
            "ports for the deployments' vLLM instances, FIRST-LAST (docs/router.md)", "8100-8199", _port_range
        )
    )
    allow_remote_code: bool = field(
        metadata=option(
            "let runtime options set trust_remote_code (vLLM then runs Python code shipped with the model)",
            False,
            _switch,
            switch=True,
        )
    )
    allow_any_model_path: bool = field(
        metadata=option(
            "let runtime.start serve a directory outside the models dir or a Hub id (vLLM fetches it)",
            False,
            _switch,
            switch=True,
        )
    )
    # None: derived from the fd limit at start (app.py)
    max_connections: int | None = field(
        metadata=option(
            "open client connections at most (default: what the fd limit allows, <= 1024)",
            None,
            _optional(_integer(1, 1_000_000), unset=(None,)),
        )
    )
    body_timeout: int = field(
        metadata=option("seconds a client may take to send a request body", 60, _integer(1, 3600))
    )
    tools: tuple[str, ...] = field(
        metadata=option(
            "built-in tools offered at /tools, NAME[,NAME…] (docs/tools.md); none by default", "", _tools
        )
    )
    tools_root: Path | None = field(
        metadata=option("the directory the file tools and exec_shell_command work in", None, _tools_root)
    )
    tools_mcp_config: Path | None = field(
        metadata=option(
            "an MCP servers file whose tools /tools offers (docs/tools.md)", None, _optional(_path)
        )
    )
    tools_timeout: int = field(
        metadata=option("seconds one /tools call may run, at most", 60, _integer(1, 3600))
    )
    log_level: str = field(metadata=option("debug, info, warning or error", "info", _choice(LOG_LEVELS)))
    log_format: str = field(
        metadata=option(
            "text, or json: one JSON object per line for journald and log shippers (docs/observability.md)",
            "text",
            _choice(LOG_FORMATS),
        )
    )
    loop: str = field(
        metadata=option(
            "the event loop: uvloop (a C event loop, the default) or asyncio (Python's own; docs/performance.md)",
            "uvloop",
            _choice(LOOPS),
        )
    )
    metrics_public: bool = field(
        metadata=option(
            "serve GET /metrics without a key (else a key with the metrics scope; docs/observability.md)",
            False,
            _switch,
            switch=True,
        )
    )
    # Derived, not options:
    upstream_explicit: bool = False  # --upstream was given (else: the runtime's own port)
    secrets_on_command_line: tuple[str, ...] = ()  # flags whose secret was given in argv (warned at start)

    def __repr__(self) -> str:  # never print credentials, even by accident
        return f"Config(host={self.host!r}, port={self.port}, data_dir={str(self.data_dir)!r})"

    @property
    def bootstrap_token_path(self) -> Path:
        """Where the generated admin token lives when none is configured."""
        return self.data_dir / "admin-token"

    @property
    def tools_enabled(self) -> bool:
        """Whether /tools is served (docs/tools.md): off unless a tool or an MCP file is named."""
        return bool(self.tools) or self.tools_mcp_config is not None

    @property
    def db_path(self) -> Path:
        return self.data_dir / "vllm-use.db"

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.admin_token, self.upstream_api_key) if s)


OPTIONS: tuple[Option, ...] = tuple(
    Option(f.name, **f.metadata["option"]) for f in fields(Config) if "option" in f.metadata
)
OPTIONS_BY_NAME = {opt.name: opt for opt in OPTIONS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-use", description="Run a local vLLM server safely.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the server (API, MCP, gateway, console)")
    for opt in OPTIONS:
        if opt.switch:
            serve.add_argument(
                opt.flag,
                dest=opt.name,
                action="store_const",
                const="1",
                default=None,
                help=f"{opt.help} [env {opt.env}]",
            )
        else:
            serve.add_argument(opt.flag, dest=opt.name, default=None, help=f"{opt.help} [env {opt.env}]")
    return parser


# What a child may inherit from our environment: see child_env's docstring for each entry's reason.
CHILD_ENV_NAMES = frozenset(
    {
        *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM"),
        *("TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "LD_LIBRARY_PATH"),
        *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy"),
        *("all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
        *("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
        *("HF_HUB_DISABLE_XET", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_DISABLE_TELEMETRY"),
        *("HF_HUB_ENABLE_HF_TRANSFER", "HF_XET_HIGH_PERFORMANCE"),
        *("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"),
        *("VLLM_ATTENTION_BACKEND", "VLLM_LOGGING_LEVEL", "VLLM_HOST_IP", "VLLM_CACHE_ROOT"),
        *("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK", "VLLM_WORKER_MULTIPROC_METHOD"),
        *("VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_RPC_TIMEOUT", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
        "RAY_ADDRESS",
    }
)
CHILD_ENV_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "KMP_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
)
_CREDENTIAL_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_KEY|PRIVATE_KEY", re.IGNORECASE)


def child_env(extra: dict[str, str] | None = None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every child (vLLM's reaper and vLLM, `hf`, the version probes).

    An allow-list, never "ours minus a few names": a child inherits a variable only if its name is
    in `CHILD_ENV_NAMES` or starts with one of `CHILD_ENV_PREFIXES`, and never one whose name looks
    like a credential (`_CREDENTIAL_NAME`), then gets `extra` (what the caller sets on purpose: a
    download's one-time `HF_TOKEN`, the runtime's own `VLLM_API_KEY`, its private `TMPDIR`). So
    `GITHUB_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `OPENAI_API_KEY`, `HF_TOKEN`, `VLLM_API_KEY`, our own
    `VLLM_USE_*` (which hold our credentials; vLLM's own `VLLM_USE_*` switches share the prefix and
    stay behind too) and `PYTHON*` (`PYTHONPATH` would choose the code a child runs) never reach a
    child. Why each entry is allowed (docs/security.md):

    - `PATH`: vLLM and hf start helpers and compilers; `HOME`, `USER`, `LOGNAME`: libraries derive
      per-user cache and config paths and names from them; `SHELL`: helpers that start a shell.
    - `LANG`, `LANGUAGE`, `LC_*`, `TZ`, `TERM`: text decoding, log timestamps, terminal output.
    - `TMPDIR`, `XDG_CACHE_HOME`, `XDG_CONFIG_HOME`: where scratch files and caches go (vLLM's
      `TMPDIR` is replaced by a private directory); `LD_LIBRARY_PATH`: CUDA often lives outside the
      default library path.
    - `HTTP(S)_PROXY`, `NO_PROXY`, `ALL_PROXY` (either case), `SSL_CERT_FILE`, `SSL_CERT_DIR`,
      `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`: the network the operator set up, so hf (and vLLM for
      a Hub id) reaches the hub like every other program here. A proxy URL may carry the proxy's
      own password: that is the operator's choice of setup, and the hub traffic needs it.
    - `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_XET_CACHE`, `HF_HUB_OFFLINE`,
      `TRANSFORMERS_OFFLINE`, `HF_HUB_DISABLE_XET`, `HF_HUB_ETAG_TIMEOUT`, `HF_HUB_DOWNLOAD_TIMEOUT`,
      `HF_HUB_DISABLE_TELEMETRY`, `HF_HUB_ENABLE_HF_TRANSFER`, `HF_XET_HIGH_PERFORMANCE`: which hub,
      which caches, offline mode and timeouts. Never a token or `HF_TOKEN_PATH`.
    - `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_OMP_THREADS_BIND`, `VLLM_CPU_NUM_OF_RESERVED_CPU`,
      `VLLM_ATTENTION_BACKEND`, `VLLM_LOGGING_LEVEL`, `VLLM_HOST_IP`, `VLLM_CACHE_ROOT`,
      `VLLM_WORKER_MULTIPROC_METHOD`, `VLLM_ENGINE_ITERATION_TIMEOUT_S`, `VLLM_RPC_TIMEOUT`,
      `VLLM_ALLOW_LONG_MAX_MODEL_LEN`, `VLLM_NO_USAGE_STATS`, `VLLM_DO_NOT_TRACK`, `DO_NOT_TRACK`:
      how the engine uses this machine, and no usage reports. Not `VLLM_PLUGINS` or
      `VLLM_LOGGING_CONFIG_PATH` (they choose code and log handlers).
    - `RAY_ADDRESS`: the Ray cluster to join for `distributed_executor_backend=ray`.
    - `CUDA_*`, `NVIDIA_*`, `NCCL_*`, `OMP_*`, `MKL_*`, `KMP_*`, `TORCH_*`, `PYTORCH_*`,
      `TRITON_*`: GPU selection and math-library tuning, settings rather than credentials.

    The tests' fake vLLM gets its `FAKE_VLLM_*` knobs from a wrapper script, not through here.
    """
    base = os.environ if environ is None else environ
    env = {
        name: value
        for name, value in base.items()
        if (name in CHILD_ENV_NAMES or name.startswith(CHILD_ENV_PREFIXES))
        and not _CREDENTIAL_NAME.search(name)
    }
    env.update(extra or {})
    return env


class _Values:
    """The options being read: each one's raw value (flag > env > default), the flag or env var it
    came from, and its value once read. `values[name]` reads an option on first use."""

    def __init__(self, args: argparse.Namespace, environ: dict[str, str]) -> None:
        self._raw: dict[str, tuple[str, Any]] = {}
        for opt in OPTIONS:
            value, source = getattr(args, opt.name, None), opt.flag
            if value is None and opt.env in environ:
                value, source = environ[opt.env], opt.env
            self._raw[opt.name] = (source, opt.default if value is None else value)
        self._read: dict[str, Any] = {}

    def raw(self, name: str) -> Any:
        return self._raw[name][1]

    def label(self, name: str) -> str:
        return self._raw[name][0]

    def given(self, name: str) -> bool:
        return self.raw(name) != OPTIONS_BY_NAME[name].default

    def __getitem__(self, name: str) -> Any:
        if name not in self._read:
            self._read[name] = OPTIONS_BY_NAME[name].read(self, name)
        return self._read[name]


def load(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    """Merge flags, env and defaults and validate every value; raise ConfigError naming the option."""
    values = _Values(args, dict(os.environ if environ is None else environ))
    return Config(
        **{opt.name: values[opt.name] for opt in OPTIONS},
        upstream_explicit=values.given("upstream"),
        secrets_on_command_line=tuple(
            OPTIONS_BY_NAME[name].flag
            for name in ("admin_token", "upstream_api_key")
            if values.label(name) == OPTIONS_BY_NAME[name].flag and values.raw(name)
        ),
    )


def _validate_host(host: str, label: str) -> None:
    if not host:
        raise ConfigError(label, "must not be empty")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,253})", host):
        raise ConfigError(label, f"is not an IP address or host name: {host!r}")


def _token(value: Any, label: str) -> str | None:
    """A credential from a flag/env: visible ASCII, no spaces, 16–512 characters. Never echoed back."""
    if value is None or value == "":
        return None
    value = str(value)
    if not 16 <= len(value) <= 512 or not re.fullmatch(r"[\x21-\x7e]+", value) or "," in value:
        raise ConfigError(label, "must be 16 to 512 visible ASCII characters without spaces or commas")
    return value


def _executable(value: str, label: str) -> str:
    if not value or value.startswith("-"):
        raise ConfigError(label, "must be a command name or path, not empty and not starting with '-'")
    return value


def validate_upstream(value: str, label: str) -> str:
    """An `http(s)://` loopback origin: no credentials, path, query or fragment."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(label, "must start with http:// or https://")
    if parts.username or parts.password or "@" in parts.netloc:
        raise ConfigError(label, "must not contain credentials")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(label, "must be an origin only (no path, query or fragment)")
    host = parts.hostname or ""
    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not loopback:
        raise ConfigError(label, f"must point at a loopback address, got host {host!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(label, f"has an invalid port: {exc}") from None
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}" + (f":{port}" if port else "")


def parse_aliases(value: str, label: str) -> dict[str, str]:
    """`alias=upstream-model,…` → dict; duplicates, empty parts and odd characters fail."""
    aliases: dict[str, str] = {}
    if not value.strip():
        return aliases
    for item in value.split(","):
        alias, sep, target = (part.strip() for part in item.partition("="))
        if not sep or not _ALIAS_NAME.match(alias) or not _ALIAS_NAME.match(target):
            raise ConfigError(label, f"expects alias=upstream-model pairs separated by commas, got {item!r}")
        if alias in aliases:
            raise ConfigError(label, f"alias {alias!r} is defined twice")
        aliases[alias] = target
    return aliases


def parse_origins(value: str, label: str) -> tuple[str, ...]:
    origins = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        parts = urlsplit(item)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
        ):
            raise ConfigError(label, f"expects origins like https://example.com:8443, got {item!r}")
        origins.append(item.rstrip("/").lower())
    return tuple(origins)


def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_warnings(config: Config) -> list[str]:
    """What an operator should know about this configuration (logged at start, docs/security.md)."""
    warnings = [
        f"{flag} was given on the command line, where every local user can read it in "
        f"/proc/<pid>/cmdline; use {flag}-file or the environment variable instead"
        for flag in config.secrets_on_command_line
    ]
    if not is_loopback_host(config.host):
        warnings.append(
            f"listening on {config.host}, beyond this machine, without TLS: keys and prompts cross the "
            "network in clear text; put a TLS proxy in front (docs/security.md)"
        )
    return warnings


def configure_logging(level: str, log_format: str = "text") -> None:
    """The root logger on stderr: `text` lines, or one JSON object per line (docs/observability.md)."""
    logging.basicConfig(level=getattr(logging, level.upper()), format=TEXT_FORMAT)
    lighten_records()
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())

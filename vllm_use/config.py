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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vllm_use.errors import ConfigError
from vllm_use.fields import has_control

ENV_PREFIX = "VLLM_USE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
_ALIAS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$")


@dataclass(frozen=True)
class Option:
    """One configuration option: its flag, env var, default and parser."""

    name: str
    help: str
    default: Any = None
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


OPTIONS: tuple[Option, ...] = (
    Option("host", "address to listen on (loopback by default)", "127.0.0.1"),
    Option("port", "port to listen on", 8080),
    Option("data_dir", "where the SQLite database and admin-token live", "~/.local/share/vllm-use"),
    Option("models_dir", "managed models root", "<data-dir>/models"),
    Option("hf_cache_dir", "optional Hugging Face cache dir for hf children", None),
    Option("admin_token", "bootstrap admin token (else <data-dir>/admin-token is used)", None, secret=True),
    Option("admin_token_file", "read the bootstrap admin token from this file (0600)", None),
    Option("upstream", "vLLM origin for /v1 (loopback http(s) only)", "http://127.0.0.1:<runtime-port>"),
    Option("upstream_api_key", "key injected as Bearer on upstream requests", None, secret=True),
    Option("upstream_api_key_file", "read the upstream key from this file (0600)", None),
    Option("model_aliases", "alias=upstream-model,... for /v1", ""),
    Option("max_audit_records", "gateway audit records kept (0 = record nothing new)", 10000),
    Option("trusted_origins", "comma-separated extra origins allowed on /mcp", ""),
    Option("vllm_bin", "the vllm executable", "vllm"),
    Option("hf_bin", "the hf executable", "hf"),
    Option("max_parallel_downloads", "concurrent hf download children", 2),
    Option(
        "download_stall_timeout", "seconds without byte progress before a download is reported stalled", 600
    ),
    Option("runtime_port", "port the supervised vllm serve listens on", 8000),
    Option(
        "allow_remote_code",
        "let runtime options set trust_remote_code (vLLM then runs Python code shipped with the model)",
        False,
        switch=True,
    ),
    Option(
        "allow_any_model_path",
        "let runtime.start serve a directory outside the models dir or a Hub id (vLLM fetches it)",
        False,
        switch=True,
    ),
    Option(
        "max_connections",
        "open client connections at most (default: what the fd limit allows, <= 1024)",
        None,
    ),
    Option("body_timeout", "seconds a client may take to send a request body", 60),
    Option("log_level", "debug, info, warning or error", "info"),
)


@dataclass(frozen=True)
class Config:
    host: str
    port: int
    data_dir: Path
    models_dir: Path
    hf_cache_dir: Path | None
    admin_token: str | None
    upstream: str
    upstream_explicit: bool
    upstream_api_key: str | None
    model_aliases: dict[str, str]
    max_audit_records: int
    trusted_origins: tuple[str, ...]
    vllm_bin: str
    hf_bin: str
    max_parallel_downloads: int
    download_stall_timeout: int
    runtime_port: int
    log_level: str
    allow_remote_code: bool = False
    allow_any_model_path: bool = False
    max_connections: int | None = None  # None: derived from the fd limit at start (app.py)
    body_timeout: int = 60
    secrets_on_command_line: tuple[str, ...] = ()  # flags whose secret was given in argv (warned at start)

    def __repr__(self) -> str:  # never print credentials, even by accident
        return f"Config(host={self.host!r}, port={self.port}, data_dir={str(self.data_dir)!r})"

    @property
    def bootstrap_token_path(self) -> Path:
        """Where the generated admin token lives when none is configured."""
        return self.data_dir / "admin-token"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "vllm-use.db"

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.admin_token, self.upstream_api_key) if s)


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


def load(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    """Merge flags, env and defaults and validate every value; raise ConfigError naming the option."""
    environ = dict(os.environ if environ is None else environ)
    raw: dict[str, tuple[str, Any]] = {}
    for opt in OPTIONS:
        value = getattr(args, opt.name, None)
        source = opt.flag
        if value is None and opt.env in environ:
            value, source = environ[opt.env], opt.env
        if value is None:
            value = opt.default
        raw[opt.name] = (source, value)

    def opt_label(name: str) -> str:
        return raw[name][0]

    def text(name: str, *, max_len: int = 4096) -> str:
        value = str(raw[name][1])
        if len(value) > max_len or has_control(value):
            raise ConfigError(
                opt_label(name), f"must be at most {max_len} characters without control characters"
            )
        return value

    def integer(name: str, lo: int, hi: int) -> int:
        value = raw[name][1]
        if isinstance(value, str):
            if not re.fullmatch(r"[0-9]{1,10}", value.strip()):
                raise ConfigError(opt_label(name), f"must be an integer from {lo} to {hi}, got {value!r}")
            value = int(value.strip())
        if not lo <= value <= hi:
            raise ConfigError(opt_label(name), f"must be an integer from {lo} to {hi}, got {value}")
        return value

    def switch(name: str) -> bool:
        value = raw[name][1]
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("", "0", "false", "no", "off"):
            return False
        raise ConfigError(opt_label(name), f"must be 1/true/yes/on or 0/false/no/off, got {value!r}")

    def path(name: str, value: str) -> Path:
        if not value:
            raise ConfigError(opt_label(name), "must not be empty")
        return Path(value).expanduser().absolute()

    host = text("host", max_len=255)
    _validate_host(host, opt_label("host"))
    port = integer("port", 1, 65535)
    data_dir = path("data_dir", text("data_dir"))
    models_raw = raw["models_dir"][1]
    models_dir = data_dir / "models" if models_raw == OPTIONS_BY_NAME["models_dir"].default else None
    if models_dir is None:
        models_dir = path("models_dir", text("models_dir"))
    hf_cache_dir = path("hf_cache_dir", text("hf_cache_dir")) if raw["hf_cache_dir"][1] else None
    admin_token = _secret(raw, "admin_token", "admin_token_file", opt_label)
    upstream_key = _secret(raw, "upstream_api_key", "upstream_api_key_file", opt_label)
    on_command_line = tuple(
        OPTIONS_BY_NAME[name].flag
        for name in ("admin_token", "upstream_api_key")
        if raw[name][0] == OPTIONS_BY_NAME[name].flag and raw[name][1]
    )
    max_connections = (
        integer("max_connections", 1, 1_000_000) if raw["max_connections"][1] is not None else None
    )
    runtime_port = integer("runtime_port", 1, 65535)
    upstream_raw = raw["upstream"][1]
    upstream_explicit = upstream_raw != OPTIONS_BY_NAME["upstream"].default
    if not upstream_explicit:
        upstream = f"http://127.0.0.1:{runtime_port}"
    else:
        upstream = validate_upstream(text("upstream", max_len=2048), opt_label("upstream"))
    log_level = text("log_level", max_len=16).lower()
    if log_level not in LOG_LEVELS:
        raise ConfigError(opt_label("log_level"), f"must be one of {', '.join(LOG_LEVELS)}")
    return Config(
        host=host,
        port=port,
        data_dir=data_dir,
        models_dir=models_dir,
        hf_cache_dir=hf_cache_dir,
        admin_token=admin_token,
        upstream=upstream,
        upstream_explicit=upstream_explicit,
        upstream_api_key=upstream_key,
        model_aliases=parse_aliases(text("model_aliases", max_len=65536), opt_label("model_aliases")),
        max_audit_records=integer("max_audit_records", 0, 10_000_000),
        trusted_origins=parse_origins(text("trusted_origins", max_len=65536), opt_label("trusted_origins")),
        vllm_bin=_executable(text("vllm_bin"), opt_label("vllm_bin")),
        hf_bin=_executable(text("hf_bin"), opt_label("hf_bin")),
        max_parallel_downloads=integer("max_parallel_downloads", 1, 64),
        download_stall_timeout=integer("download_stall_timeout", 1, 86400),
        runtime_port=runtime_port,
        log_level=log_level,
        allow_remote_code=switch("allow_remote_code"),
        allow_any_model_path=switch("allow_any_model_path"),
        max_connections=max_connections,
        body_timeout=integer("body_timeout", 1, 3600),
        secrets_on_command_line=on_command_line,
    )


OPTIONS_BY_NAME = {opt.name: opt for opt in OPTIONS}


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


def _secret(raw: dict[str, tuple[str, Any]], name: str, file_name: str, label: Any) -> str | None:
    """A credential from its flag/env, or read once from its file option (never both)."""
    value, file_value = raw[name][1], raw[file_name][1]
    if value not in (None, "") and file_value not in (None, ""):
        raise ConfigError(label(file_name), f"give either {label(name)} or {label(file_name)}, not both")
    if file_value in (None, ""):
        return _token(value, label(name))
    from vllm_use import fsafety  # no import cycle at module load: fsafety imports errors only

    path = Path(str(file_value)).expanduser().absolute()
    return _token(fsafety.read_secret_file(path, option=label(file_name)), label(file_name))


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


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

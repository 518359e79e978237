"""Typed `vllm serve` options: every bound in the schema, argv that can't be subverted.

The model is published as one pydantic model, so `/api/methods`, OpenAPI and
MCP `tools/list` show the same bounds the server enforces. `build_argv` writes
every valued flag as `--flag=value`, so no value can ever be read as another
flag.

`extra_args` is an allow-list (`EXTRA_FLAGS`, docs/runtime.md): performance,
scheduling and limit knobs whose values are numbers, byte sizes, names from a
fixed set or identifiers, each checked strictly by its kind, so no value can be
a path, a URL, JSON or a second flag. Everything else is refused, in particular
whatever loads code or files (`--*-plugin`, `--middleware`, `--chat-template`,
`--*-config`, `--hf-overrides`), writes prompts into `runtime.logs`
(`--enable-log-*`, `--log-*`), reads local files for a request
(`--allowed-local-media-path`), changes where or how vLLM listens (`--uds`,
`--ssl-*`, `--host`, `--port`) or sets its credentials (`--api-key`: vllm-use
gives each child its own key, see supervisor.py). `trust_remote_code` and a
model outside the models root are further gated by operator flags, checked in
abilities/runtime.py because they depend on the configuration.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from vllm_use.errors import InvalidArguments

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$"
IDENT_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
# A value: no control characters, no leading "-" (no value of an allowed flag is negative).
VALUE_PATTERN = r"^[^-\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$"
EXTRA_MAX, VALUES_MAX, VALUE_BYTES_MAX = 32, 1, 64

_INT = re.compile(r"[0-9]{1,19}")
_FLOAT = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
# vLLM's human-readable integers: 64M = 64·2^20, 1.5g = 1.5·10^9 (decimals only with decimal suffixes).
_BYTES = re.compile(
    r"(?P<int>[0-9]{1,15})(?P<bin>[KMGT]?)|(?P<num>[0-9]{1,12}(?:\.[0-9]{1,6})?)(?P<dec>[kmgt])"
)
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

Kind = Literal["switch", "int", "float", "bytes", "choice", "name"]


@dataclass(frozen=True)
class Flag:
    """How one allowed extra flag takes its value: a switch takes none, every other kind exactly one."""

    kind: Kind
    lo: float = 0
    hi: float = 0
    choices: tuple[str, ...] = ()

    def check(self, value: str) -> str | None:
        """None if `value` is valid for this kind, else why not (never echoing the value)."""
        if self.kind == "choice":
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}"
        if self.kind == "name":
            return None if _NAME.fullmatch(value) else "must be a name: a letter, then letters, digits or _"
        if self.kind == "int":
            if not _INT.fullmatch(value) or not self.lo <= int(value) <= self.hi:
                return f"must be an integer from {self.lo:g} to {self.hi:g}"
            return None
        if self.kind == "float":
            if not _FLOAT.fullmatch(value) or not self.lo <= float(value) <= self.hi:
                return f"must be a number from {self.lo:g} to {self.hi:g}"
            return None
        size = byte_size(value)
        if size is None or not self.lo <= size <= self.hi:
            return f"must be a byte size like 64M, 4G or 1500000000 (at least {self.lo:g}, at most 1P)"
        return None


def byte_size(value: str) -> int | None:
    """vLLM's human-readable integer (`64M`, `4G`, `1.5g`, `1000000`), or None if it isn't one."""
    match = _BYTES.fullmatch(value)
    if match is None:
        return None
    if match["int"] is not None:
        return int(match["int"]) * _BINARY[match["bin"]]
    return int(float(match["num"]) * _DECIMAL[match["dec"]])


def _switch(name: str, *, negatable: bool = True) -> dict[str, Flag]:
    flags = {name: Flag("switch")}
    if negatable:
        flags["--no-" + name[2:]] = Flag("switch")
    return flags


# The allowed extra flags (vLLM 0.32's `vllm serve --help=all`), and why each is harmless: it tunes
# memory, scheduling, limits or usage reporting of the model we serve, and its value is a number or
# a name from a fixed set. docs/runtime.md has the same table for people.
EXTRA_FLAGS: dict[str, Flag] = {
    # Switches.
    **_switch("--enforce-eager"),  # no CUDA graphs: slower, less memory
    **_switch("--disable-log-stats", negatable=False),  # fewer periodic stats lines
    **_switch("--disable-uvicorn-access-log"),  # fewer access-log lines
    **_switch("--enable-chunked-prefill"),
    **_switch("--async-scheduling"),
    **_switch("--enable-prompt-tokens-details"),  # more fields in `usage`
    **_switch("--enable-force-include-usage"),
    **_switch("--disable-sliding-window"),
    **_switch("--disable-hybrid-kv-cache-manager"),
    **_switch("--enable-expert-parallel"),
    **_switch("--disable-custom-all-reduce"),
    **_switch("--enable-sleep-mode"),  # its /sleep routes exist only in vLLM's dev mode, never set here
    **_switch("--long-prefill-token-threshold-adaptive"),
    **_switch("--return-tokens-as-token-ids"),
    # Integers.
    "--seed": Flag("int", 0, 2**32 - 1),
    "--block-size": Flag("int", 1, 4096),
    "--max-num-batched-tokens": Flag("int", 1, 10_000_000),
    "--max-num-active-seqs": Flag("int", 1, 65_536),
    "--max-num-queued-reqs": Flag("int", 1, 1_000_000),
    "--max-num-queued-tokens": Flag("int", 1, 100_000_000),
    "--long-prefill-token-threshold": Flag("int", 0, 10_000_000),
    "--max-logprobs": Flag("int", 0, 1024),  # vLLM's -1 (no cap) lets one request ask for the vocabulary
    "--stream-interval": Flag("int", 1, 1024),
    "--data-parallel-size": Flag("int", 1, 64),
    "--max-parallel-loading-workers": Flag("int", 1, 64),
    "--max-cudagraph-capture-size": Flag("int", 1, 65_536),
    "--renderer-num-workers": Flag("int", 1, 64),
    "--optimization-level": Flag("int", 0, 3),
    # Numbers and sizes.
    "--cpu-offload-gb": Flag("float", 0, 65_536),
    "--watermark": Flag("float", 0, 0.99),
    "--kv-cache-memory-bytes": Flag("bytes", 1, 2**50),
    # Names from a fixed set.
    "--kv-cache-dtype": Flag(
        "choice",
        choices=("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
    ),
    "--generation-config": Flag("choice", choices=("auto", "vllm")),  # a folder path is refused
    "--scheduling-policy": Flag("choice", choices=("fcfs", "priority")),
    # Built-in tokenizers only: the argument also takes registered names from plugins.
    "--tokenizer-mode": Flag("choice", choices=("auto", "hf", "mistral", "deepseek_v32", "deepseek_v4")),
    "--performance-mode": Flag("choice", choices=("balanced", "interactivity", "throughput")),
    # Identifiers: vLLM looks them up in its own registry (an enum member), never imports them.
    "--attention-backend": Flag("name"),
}

# The flags the typed fields and the supervisor own: named in the refusal so people find the field.
OWNED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--model",
        "--served-model-name",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--max-num-seqs",
        "--dtype",
        "--quantization",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--tool-call-parser",
        "--reasoning-parser",
        "--enable-auto-tool-choice",
        "--no-enable-auto-tool-choice",
        "--trust-remote-code",
        "--no-trust-remote-code",
        "--distributed-executor-backend",
        "--api-key",
    }
)

# Why a flag that is not allowed is refused, for the message; the first matching rule wins.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"--[a-z0-9-]*plugin[a-z0-9-]*"), "it loads Python code"),
    (
        re.compile(r"--(middleware|worker-cls|worker-extension-cls|scheduler-cls|logits-processors)"),
        "it imports Python code",
    ),
    (
        re.compile(
            r"--(enable-log-[a-z0-9-]+|no-enable-log-[a-z0-9-]+|log-[a-z0-9-]+|max-log-len|uvicorn-log-level)"
        ),
        "it writes prompts or logging setup into the runtime's logs",
    ),
    (
        re.compile(
            r"--(chat-template|allowed-local-media-path|download-dir|tokenizer|hf-config-path|[a-z0-9-]*-path|[a-z0-9-]*-file)"
        ),
        "it takes a path on this machine",
    ),
    (
        re.compile(
            r"--(ssl-[a-z0-9-]+|uds|root-path|allowed-origins|allowed-headers|allowed-methods|allow-credentials)"
        ),
        "it changes how vLLM listens",
    ),
    (
        re.compile(r"--([a-z0-9-]+-config|config|hf-overrides|[a-z0-9-]*-kwargs|[a-z0-9-]*-overrides)"),
        "it takes free-form configuration",
    ),
)


def refusal(name: str) -> str:
    """The message for an extra flag that isn't allowed."""
    if name in OWNED_FLAGS:
        return f"{name} is set by a typed option or by vllm-use"
    for pattern, why in _REFUSALS:
        if pattern.fullmatch(name):
            return f"{name} is refused: {why} (docs/runtime.md lists the allowed flags)"
    return f"{name} is not an allowed extra flag (docs/runtime.md lists them)"


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Ident = Annotated[str, StringConstraints(pattern=IDENT_PATTERN)]
Value = Annotated[
    str,
    StringConstraints(max_length=VALUE_BYTES_MAX, pattern=VALUE_PATTERN),
    Field(description="a number, a byte size like 64M, or a name; no spaces or control characters"),
]


class ExtraArg(BaseModel):
    """One more `vllm serve` flag from the allow-list: a switch, or a flag with exactly one value."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(
        max_length=64,
        description="an allowed vLLM flag, e.g. --kv-cache-memory-bytes (docs/runtime.md)",
        json_schema_extra={"enum": sorted(EXTRA_FLAGS)},
    )
    values: list[Value] = Field(
        default_factory=list, max_length=VALUES_MAX, description="none for a switch, else its one value"
    )

    @field_validator("name")
    @classmethod
    def _allowed(cls, name: str) -> str:
        if name not in EXTRA_FLAGS:
            raise ValueError(refusal(name))
        return name

    @field_validator("values")
    @classmethod
    def _of_its_kind(cls, values: list[str], info: ValidationInfo) -> list[str]:
        name = info.data.get("name")
        if name is None:
            return values  # the name was already refused
        flag = EXTRA_FLAGS[name]
        if flag.kind == "switch":
            if values:
                raise ValueError(f"{name} is a switch and takes no value")
            return values
        if len(values) != 1:
            raise ValueError(f"{name} takes exactly one value")
        why = flag.check(values[0])
        if why is not None:
            raise ValueError(f"{name} {why}")
        return values


class RuntimeOptions(BaseModel):
    """Options for `vllm serve`. Unset fields leave vLLM's own default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        pattern=r"^[^-\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
        description="runtime.start only: a model directory under the models root (a Hub id or another "
        "directory needs the operator's --allow-any-model-path); runtime.switch takes it from the registry",
    )
    served_model_name: Name | None = Field(default=None, description="the name clients use in `model`")
    port: int | None = Field(default=None, ge=1024, le=65535, description="vLLM's port on 127.0.0.1")
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    pipeline_parallel_size: int | None = Field(default=None, ge=1, le=64)
    gpu_ids: list[Annotated[int, Field(ge=0, le=255)]] | None = Field(
        default=None, min_length=1, max_length=64, description="CUDA_VISIBLE_DEVICES, distinct"
    )
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    max_model_len: int | None = Field(default=None, ge=1, le=10_000_000)
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536)
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    quantization: Ident | None = None
    enable_prefix_caching: bool | None = None
    tool_call_parser: Ident | None = Field(default=None, description="a built-in parser's name, e.g. hermes")
    reasoning_parser: Ident | None = Field(default=None, description="a built-in parser's name, e.g. qwen3")
    enable_auto_tool_choice: bool = False
    trust_remote_code: bool = Field(
        default=False,
        description="run Python code shipped with the model; needs the operator's --allow-remote-code",
    )
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        default=None, description="ray: run across several machines (docs/runtime.md)"
    )
    start_timeout_s: int = Field(
        default=900, ge=1, le=7200, description="fail the start if not healthy by then"
    )
    extra_args: list[ExtraArg] = Field(default_factory=list, max_length=EXTRA_MAX)

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("gpu_ids")
    @classmethod
    def _distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("GPU ids must be distinct")
        return value

    @model_validator(mode="after")
    def _each_flag_once(self) -> RuntimeOptions:
        seen: set[str] = set()
        for arg in self.extra_args:
            canonical = "--" + arg.name.removeprefix("--").removeprefix("no-")
            if canonical in seen:
                raise ValueError(f"extra_args: {canonical} is given twice")
            seen.add(canonical)
        return self


def _extra_value(options: RuntimeOptions, name: str) -> int | None:
    for arg in options.extra_args:
        if arg.name == name and arg.values and _INT.fullmatch(arg.values[0]):
            return int(arg.values[0])
    return None


def together_problems(options: RuntimeOptions) -> list[tuple[str, str]]:
    """Options that vLLM 0.32 accepts only together (its `validate_parsed_serve_args` and
    `SchedulerConfig` checks, docs/vllm-facts.md): `(field, why)` for each rule broken, checked
    where both values are given here (a value vLLM derives from the model is not known here)."""
    problems: list[tuple[str, str]] = []
    if options.enable_auto_tool_choice and not options.tool_call_parser:
        problems.append(
            (
                "enable_auto_tool_choice",
                "needs tool_call_parser (e.g. hermes): vLLM refuses --enable-auto-tool-choice without "
                "--tool-call-parser",
            )
        )
    seqs, length = options.max_num_seqs, options.max_model_len
    active = _extra_value(options, "--max-num-active-seqs")
    batched = _extra_value(options, "--max-num-batched-tokens")
    threshold = _extra_value(options, "--long-prefill-token-threshold")
    if seqs is not None and active is not None and active > seqs:
        problems.append(
            ("extra_args", f"--max-num-active-seqs ({active}) cannot be greater than max_num_seqs ({seqs})")
        )
    if seqs is not None and batched is not None and batched < seqs:
        problems.append(
            ("extra_args", f"--max-num-batched-tokens ({batched}) must be at least max_num_seqs ({seqs})")
        )
    if length is not None and threshold is not None and threshold > length:
        problems.append(
            (
                "extra_args",
                f"--long-prefill-token-threshold ({threshold}) cannot be greater than max_model_len ({length})",
            )
        )
    return problems


def check_together(options: RuntimeOptions) -> None:
    """InvalidArguments (400) naming each `options.<field>` whose partner is missing or disagrees,
    before anything is saved, stopped or spawned (docs/runtime.md, "Options that go together")."""
    problems = together_problems(options)
    if problems:
        field, why = problems[0]
        raise InvalidArguments(
            f"invalid arguments: options.{field}: {why}",
            errors=[{"loc": ["options", name], "msg": msg} for name, msg in problems],
        )


def build_argv(vllm_bin: str, model: str, options: RuntimeOptions, port: int) -> list[str]:
    """`vllm serve MODEL --flag=value …` on 127.0.0.1:port. `model` is validated by the caller;
    options that vLLM accepts only together are checked here, so no spawn gets past them."""
    if not model or model.startswith("-"):
        raise InvalidArguments("invalid arguments: model: must not start with '-'", loc=["model"])
    check_together(options)
    argv = [vllm_bin, "serve", model, "--host=127.0.0.1", f"--port={port}"]

    def valued(flag: str, value: object) -> None:
        if value is not None:
            argv.append(f"{flag}={value}")

    valued("--served-model-name", options.served_model_name)
    valued("--tensor-parallel-size", options.tensor_parallel_size)
    valued("--pipeline-parallel-size", options.pipeline_parallel_size)
    valued("--gpu-memory-utilization", options.gpu_memory_utilization)
    valued("--max-model-len", options.max_model_len)
    valued("--max-num-seqs", options.max_num_seqs)
    valued("--dtype", options.dtype)
    valued("--quantization", options.quantization)
    valued("--tool-call-parser", options.tool_call_parser)
    valued("--reasoning-parser", options.reasoning_parser)
    valued("--distributed-executor-backend", options.distributed_executor_backend)
    if options.enable_prefix_caching is not None:
        argv.append(
            "--enable-prefix-caching" if options.enable_prefix_caching else "--no-enable-prefix-caching"
        )
    if options.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if options.trust_remote_code:
        argv.append("--trust-remote-code")
    for arg in options.extra_args:
        # Re-checked here too: argv is built only from allowed flags with values of their kind.
        flag = EXTRA_FLAGS.get(arg.name)
        if flag is None or (flag.kind == "switch") != (not arg.values):
            raise InvalidArguments(f"invalid arguments: extra_args: {refusal(arg.name)}", loc=["extra_args"])
        argv.append(arg.name if not arg.values else f"{arg.name}={arg.values[0]}")
    return argv

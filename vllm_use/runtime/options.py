"""Typed `vllm serve` options (S4.3): every bound in the schema, argv that can't be subverted.

The model is published as one pydantic model, so `/api/methods`, OpenAPI and
MCP `tools/list` show the same bounds the server enforces. `build_argv` writes
every valued flag as `--flag=value`, so no value can ever be read as another
flag; values are also refused if they start with `-` (except negative numbers)
or hold control characters, and `extra_args` can't repeat a typed flag or one
the supervisor sets itself.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from vllm_use.errors import InvalidArguments

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$"
IDENT_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
FLAG_PATTERN = r"^--[a-z0-9][a-z0-9-]{0,62}$"
# A value: no control characters, not starting with "-" unless it is a negative number.
VALUE_PATTERN = r"^(?:-[0-9][0-9.eE+-]*|[^-\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*)?$"
EXTRA_MAX, VALUES_MAX, VALUE_BYTES_MAX, EXTRA_BYTES_MAX = 32, 16, 1024, 16 * 1024

# The flags the typed fields and the supervisor own; extra_args may not name them.
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
        "--trust-remote-code",
        "--no-trust-remote-code",
        "--distributed-executor-backend",
        "--api-key",
        "--config",
        "-tp",
        "-pp",
    }
)

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Ident = Annotated[str, StringConstraints(pattern=IDENT_PATTERN)]
Value = Annotated[
    str,
    StringConstraints(max_length=VALUE_BYTES_MAX, pattern=VALUE_PATTERN),
    Field(description="a value: no control characters, and not starting with '-' unless it is a number"),
]


class ExtraArg(BaseModel):
    """One more `vllm serve` flag: `--name` and its values (none for a switch)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=FLAG_PATTERN, description="a long flag, e.g. --kv-cache-memory-bytes")
    values: list[Value] = Field(default_factory=list, max_length=VALUES_MAX)


class RuntimeOptions(BaseModel):
    """Options for `vllm serve`. Unset fields leave vLLM's own default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        pattern=r"^[^-\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$",
        description="runtime.start only: a model directory or Hub id; runtime.switch takes it from the registry",
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
    tool_call_parser: Ident | None = None
    reasoning_parser: Ident | None = None
    enable_auto_tool_choice: bool = False
    trust_remote_code: bool = False
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
    def _extra_args_stay_extra(self) -> RuntimeOptions:
        seen: set[str] = set()
        size = 0
        for arg in self.extra_args:
            if arg.name in OWNED_FLAGS:
                raise ValueError(f"extra_args: {arg.name} is set by a typed option or by vllm-use")
            if arg.name in seen:
                raise ValueError(f"extra_args: {arg.name} is given twice")
            seen.add(arg.name)
            size += len(arg.name) + sum(len(v.encode()) for v in arg.values)
        if size > EXTRA_BYTES_MAX:
            raise ValueError(f"extra_args: more than {EXTRA_BYTES_MAX} bytes in all")
        return self


def build_argv(vllm_bin: str, model: str, options: RuntimeOptions, port: int) -> list[str]:
    """`vllm serve MODEL --flag=value …` on 127.0.0.1:port. `model` is validated by the caller."""
    if not model or model.startswith("-"):
        raise InvalidArguments("invalid arguments: model: must not start with '-'", loc=["model"])
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
        if not arg.values:
            argv.append(arg.name)
        elif len(arg.values) == 1:
            argv.append(f"{arg.name}={arg.values[0]}")
        else:  # nargs flags: the values follow; each was checked not to look like a flag
            argv += [arg.name, *arg.values]
    return argv

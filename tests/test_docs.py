"""Generated docs stay true: docs/api_methods.md must match the registry."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO
from vllm_use.config import OPTIONS

TARGET = REPO / "docs" / "api_methods.md"
GENERATOR = REPO / "tools" / "gen_api_docs.py"


def render() -> str:
    """What `make docs` writes, from the generator run as a script (tests import nothing from tools/)."""
    out = subprocess.run(
        [sys.executable, str(GENERATOR), "--stdout"], capture_output=True, check=True, cwd=REPO, timeout=120
    )
    return out.stdout.decode("utf-8")


def test_api_methods_doc_is_fresh() -> None:
    assert TARGET.read_text(encoding="utf-8") == render(), "docs/api_methods.md is stale: run `make docs`"


def test_readme_documents_every_option_with_its_env_var() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert opt.flag in readme, f"README lacks {opt.flag}"
        assert opt.env in readme, f"README lacks {opt.env}"

"""Generated docs stay true: docs/api_methods.md must match the registry."""

from __future__ import annotations

from pathlib import Path

from tools.gen_api_docs import TARGET, render
from vllm_use.config import OPTIONS

ROOT = Path(__file__).resolve().parent.parent


def test_api_methods_doc_is_fresh() -> None:
    assert TARGET.read_text(encoding="utf-8") == render(), "docs/api_methods.md is stale: run `make docs`"


def test_readme_documents_every_option_with_its_env_var() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        assert opt.flag in readme, f"README lacks {opt.flag}"
        assert opt.env in readme, f"README lacks {opt.env}"

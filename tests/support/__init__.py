"""What the tests share besides fixtures: `server.py` (a vllm-use to test, as a child or in this
process, and `eventually`), `real_vllm.py` (the installed CPU vLLM, its fixtures, a pytest plugin),
`stack.py` (a whole stack for the console), `browser.py` (Chromium through Playwright), `sse.py`
(a reader of the console's event streams)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/support/__init__.py → the repository

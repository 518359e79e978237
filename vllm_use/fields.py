"""Field rules written once, for the input models (pydantic: published in each method's JSON
Schema and enforced) and for the parsers of rows read back from SQLite (which re-check what they
load). docs/architecture.md, "Validation", says where each is used.

- Ids: a model id is 32 lowercase hex characters (the server makes it); a download task id is
  1–128 portable ASCII characters, alphanumeric first (a client may choose it); an API key id is
  24 letters and digits.
- Text people type (names, setting keys and values, option values): no control characters, C0
  (U+0000–U+001F), DEL (U+007F) or C1 (U+0080–U+009F).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

MODEL_ID = r"[0-9a-f]{32}"
TASK_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
KEY_ID = r"[A-Za-z0-9]{24}"
MODEL_ID_RE = re.compile(MODEL_ID)
TASK_ID_RE = re.compile(TASK_ID)
KEY_ID_RE = re.compile(KEY_ID)

ModelId = Annotated[str, StringConstraints(pattern=f"^{MODEL_ID}$")]
TaskId = Annotated[str, StringConstraints(pattern=f"^{TASK_ID}$")]
KeyId = Annotated[str, StringConstraints(pattern=f"^{KEY_ID}$")]

# The control characters, as a regex character range (C0, DEL, C1).
CONTROL = r"\x00-\x1f\x7f-\x9f"
# JSON Schema pattern for text without control characters.
NO_CONTROL = rf"^[^{CONTROL}]*$"


def has_control(text: str) -> bool:
    """Whether `text` holds a control character (C0, DEL or C1)."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)

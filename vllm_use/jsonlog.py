"""`--log-format json`: one JSON object per line, for journald and log shippers
(docs/observability.md, "Logs").

Every line has `time` (ISO-8601 UTC, milliseconds), `level`, `logger` and `message` (the text
line's message, formatted the same way); a line about a request or a method call adds, when known,
`request_id`, `method`, `path`, `status`, `key_id`, `surface`, `outcome` and `ms` (passed with
`extra={...}` by the executor's line and the access line, handlers/base.py `log_request`). Only
those names are taken from `extra`: nothing else a log call carries can reach the output. A
traceback is the string field `exc_info` (its newlines escaped by JSON), so a line is still one
line. The messages are the text format's, which never carry a secret (tests/test_logs_json.py).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

FIELDS = ("request_id", "method", "path", "status", "key_id", "surface", "outcome", "ms")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (no newline inside: `json.dumps` escapes them)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "time": moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)

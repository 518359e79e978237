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
import time
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


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The text line (`TEXT_FORMAT`), as `logging.Formatter` writes it, with the date and time
    formatted once per second instead of once per line: the access log writes a line per request
    (docs/performance.md)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._text, record.msecs)


def lighten_records() -> None:
    """Leave out of every log record what neither format writes: the caller's file and line (a walk
    up the stack per record), the thread and the process (the Logging HOWTO, "Optimization")."""
    logging._srcfile = None  # type: ignore[attr-defined]  # the HOWTO's documented switch
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False

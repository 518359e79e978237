"""`--log-format json` (docs/observability.md, "Logs"): a real `vllm-use serve` in front of the fake
vLLM upstream writes one JSON object per line, with the request's fields on the executor's line
and the access lines, and no secret (the json side of tests/test_keys.py's
`test_secret_is_never_logged_or_stored`)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import ADMIN_TOKEN, start_server
from vllm_use.jsonlog import TEXT_FORMAT, JsonFormatter, TextFormatter

UPSTREAM_KEY = "upstream-key-json-0123456789abcdef"
WRONG_SECRET = "vua_wrong-secret-never-logged-0123456789"
REQUEST_ID = "json-log-request-1"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running(api_key=UPSTREAM_KEY)


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> dict[str, Any]:
    """What a short session wrote: the parsed lines, and the secrets it used."""
    server = start_server(
        tmp_path_factory.mktemp("json-log") / "data",
        "--upstream",
        upstream.url,
        "--log-format",
        "json",
        env={"VLLM_USE_UPSTREAM_API_KEY": UPSTREAM_KEY},
    )
    try:
        key_id, secret = server.create_key("inference", "admin.read")
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {secret}", "X-Request-ID": REQUEST_ID}
        assert (
            server.fetch("/v1/chat/completions", "POST", json=chat, token=None, headers=auth).status_code
            == 200
        )
        assert server.fetch("/api/keys", token=secret).status_code == 200
        assert server.fetch("/api/keys", token=WRONG_SECRET).status_code == 401
        assert server.fetch("/api/deployments/missing").status_code == 404
    finally:
        assert server.stop() == 0
    text = server.log()
    return {"text": text, "parsed": [json.loads(line) for line in text.splitlines()], "key": (key_id, secret)}


def test_every_line_is_one_json_object_with_time_level_logger_and_message(lines: dict[str, Any]) -> None:
    parsed = lines["parsed"]
    assert len(parsed) >= 8  # start-up, the calls above, shutdown
    for line in parsed:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
        assert (
            line["time"].endswith("Z")
            and datetime.fromisoformat(line["time"]).utcoffset().total_seconds() == 0
        )
        assert line["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    assert any(line["message"].startswith("vllm-use listening on") for line in parsed)


def test_the_calls_carry_request_id_method_key_id_outcome_and_ms(lines: dict[str, Any]) -> None:
    parsed, (key_id, _) = lines["parsed"], lines["key"]
    access = [line for line in parsed if line["logger"] == "tornado.access"]
    relayed = [line for line in access if line.get("path") == "/v1/chat/completions"]
    assert len(relayed) == 1
    assert relayed[0]["request_id"] == REQUEST_ID and relayed[0]["key_id"] == key_id
    assert relayed[0]["method"] == "POST" and relayed[0]["status"] == 200 and relayed[0]["outcome"] == "ok"
    assert relayed[0]["ms"] > 0
    refused = [line for line in access if line.get("status") == 401]
    assert len(refused) == 1 and refused[0]["level"] == "WARNING" and "key_id" not in refused[0]
    assert refused[0]["outcome"] == "http_401"
    methods = [line for line in parsed if line["logger"] == "vllm_use.executor"]
    listed = [line for line in methods if line["method"] == "api_keys.list"]
    assert len(listed) == 1 and listed[0]["key_id"] == key_id and listed[0]["outcome"] == "ok"
    assert listed[0]["surface"] == "api" and listed[0]["ms"] >= 0
    missing = [line for line in methods if line["method"] == "deployments.get"]
    assert len(missing) == 1 and missing[0]["outcome"] == "not_found" and missing[0]["level"] == "WARNING"
    assert missing[0]["key_id"] == "admin-token"


def test_no_secret_reaches_the_json_log(lines: dict[str, Any]) -> None:
    text, (_, secret) = lines["text"], lines["key"]
    for leaked in (secret, secret[4:], WRONG_SECRET, ADMIN_TOKEN, UPSTREAM_KEY):
        assert leaked not in text


def test_a_traceback_stays_inside_its_one_line() -> None:
    try:
        raise ValueError("the cause\nover two lines")
    except ValueError:
        record = logging.LogRecord(
            "vllm_use.x", logging.ERROR, __file__, 1, "failed: %s", ("it",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed: it"
    assert (
        parsed["exc_info"].startswith("Traceback")
        and "ValueError: the cause\nover two lines" in parsed["exc_info"]
    )


def test_the_text_lines_are_what_logging_formatter_writes_with_the_time_made_once_a_second() -> None:
    """TextFormatter keeps the date and time of the last second: its lines are the plain
    `logging.Formatter`'s for the same records, across second boundaries and back in time."""
    plain, ours = logging.Formatter(TEXT_FORMAT), TextFormatter()
    for created in (
        1764000000.0,
        1764000000.9994,
        1764000001.0005,
        1764000001.5,
        1763999999.25,
        1764003600.0,
    ):
        record = logging.LogRecord("tornado.access", logging.INFO, __file__, 1, "200 POST %s", ("/v1",), None)
        record.created, record.msecs = created, (created - int(created)) * 1000 // 1
        assert ours.format(record) == plain.format(record)

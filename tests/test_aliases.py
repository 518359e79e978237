"""Model aliases (docs/gateway.md): only the top-level `model` value changes; every other byte is kept
as sent."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, running
from tests.support.server import Server, start_server
from vllm_use.errors import InvalidArguments
from vllm_use.gateway.aliases import MAX_DEPTH, WINDOW, prepare

ALIASES = {"fast": "tiny", "big": "llama-3-70b"}


def test_big_integers_and_long_decimals_keep_their_exact_text() -> None:
    body = b'{"seed": 12345678901234567890123, "model": "fast", "temperature": 0.1000000000000000055511151231257827}'
    out, sent = prepare(body, ALIASES)[:2]
    assert out == body.replace(b'"fast"', b'"tiny"')
    assert sent == "fast"


def test_spacing_key_order_and_other_values_are_kept() -> None:
    body = (
        b' {\r\n\t"z" :1 ,\n  "model"\t:\t  "big"   ,"a":[ 1,2 , {"b" : null}],"t":true,"f":false,'
        b'"e":-1.5E+10 }\n'
    )
    out, sent = prepare(body, ALIASES)[:2]
    assert out == body.replace(b'"big"', b'"llama-3-70b"')
    assert sent == "big"


def test_escapes_elsewhere_are_kept_byte_for_byte() -> None:
    body = (
        b'{"s":"a\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00 \xc3\xa9","model":"fast",'
        b'"nested":{"q":"}]\\"{["},"l":["\\u0022model\\u0022"]}'
    )
    out, sent = prepare(body, ALIASES)[:2]
    assert out == body.replace(b'"model":"fast"', b'"model":"tiny"')
    assert sent == "fast"


def test_an_escaped_key_or_value_is_read_as_a_json_parser_reads_it() -> None:
    # "mod\u0065l" is the key "model" and "f\u0061st" the value "fast" for the upstream's parser.
    out, sent = prepare(b'{"mod\\u0065l": "f\\u0061st"}', ALIASES)[:2]
    assert out == b'{"mod\\u0065l": "tiny"}'
    assert sent == "fast"


def test_nested_model_keys_are_untouched() -> None:
    body = b'{"messages":[{"role":"user","model":"fast"}],"metadata":{"model":"fast"},"model":"fast"}'
    out, _ = prepare(body, ALIASES)[:2]
    assert out == b'{"messages":[{"role":"user","model":"fast"}],"metadata":{"model":"fast"},"model":"tiny"}'


def test_a_model_that_is_not_a_string_is_left_alone() -> None:
    for body in (b'{"model":{"model":"fast"}}', b'{"model":["fast"]}', b'{"model":5}', b'{"model":null}'):
        assert prepare(body, ALIASES)[:2] == (body, None)


def test_duplicate_model_keys_are_each_rewritten_and_the_last_is_what_was_sent() -> None:
    out, sent = prepare(b'{"model":"other","model":"fast"}', ALIASES)[:2]
    assert (out, sent) == (b'{"model":"other","model":"tiny"}', "fast")
    out, sent = prepare(b'{"model":"fast", "x":1, "model":"other"}', ALIASES)[:2]
    assert (out, sent) == (b'{"model":"tiny", "x":1, "model":"other"}', "other")


def test_a_model_without_an_alias_is_unchanged_and_reported() -> None:
    body = '{"model": "模型-7b", "prompt": "hi"}'.encode()
    assert prepare(body, ALIASES)[:2] == (body, "模型-7b")
    assert prepare(b'{"model":"fast"}', {})[:2] == (b'{"model":"fast"}', "fast")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'[{"model":"fast"}]',
        b'"fast"',
        b"42",
        b"null",
        b"not json",
        b'{"model":"fast"',
        b'{"model":"fast"} trailing',
        b'{"model":"fast",}',
        b'{"model":"fast","x":"\xff"}',
        '{"model":"fast"}'.encode("utf-16"),
        b"{}",
        b"{ }",
    ],
)
def test_a_body_that_is_not_a_json_object_is_returned_unchanged(body: bytes) -> None:
    assert prepare(body, ALIASES)[:2] == (body, None)


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["str", "num", "lit", "list", "dict"] if depth < 6 else ["str", "num", "lit"])
    if kind == "str":
        alphabet = ["a", '"', "\\", "/", "\n", "\t", "\u0001", "é", "€", "😀", "{", "]", ",", ":", " "]
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
    if kind == "num":
        return rng.choice([0, -1, 12345678901234567890, 1.5, -2.5e-300, 1e300])
    if kind == "lit":
        return rng.choice([True, False, None])
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {_random_value(rng, 6): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}


def _spaced(text: str, rng: random.Random) -> str:
    """`text` with random JSON whitespace after each structural character outside strings."""
    out, in_string, escaped = [], False, False
    for char in text:
        out.append(char)
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            in_string = True
        elif char in ",:[]{}":
            out.append(rng.choice(["", "", " ", "\n\t", "\r\n  "]))
    return "".join(out)


def test_the_scan_reads_model_and_stream_as_json_loads_does_on_random_documents() -> None:
    rng = random.Random(20260728)
    for _ in range(400):
        document = {k: _random_value(rng, 1) for k in ("a", "messages", "z")[: rng.randrange(1, 4)]}
        for key in rng.sample(["model", "stream", "model"], rng.randrange(0, 3)):
            document[key] = rng.choice(["fast", "big", "other", 7, None, [], ["x"], {}, True, False, ""])
        items = list(document.items())
        rng.shuffle(items)
        text = _spaced(json.dumps(dict(items), ensure_ascii=rng.random() < 0.5), rng)
        body = text.encode()
        parsed = json.loads(body)
        out, sent, stream = prepare(body, ALIASES)[:3]
        model = parsed.get("model")
        assert sent == (model if isinstance(model, str) else None), text
        assert stream == bool(parsed.get("stream")), text
        aliased = isinstance(model, str) and model in ALIASES
        assert json.loads(out) == (dict(parsed, model=ALIASES[model]) if aliased else parsed), text
        if not aliased:
            assert out == body


def test_strings_crossing_the_scan_window_are_read_whole() -> None:
    # Long strings (escapes near the window edge included) are taken by scanstring, not the expression.
    filler = "x" * (WINDOW - 7) + '\\"]}{[' + "y" * WINDOW
    body = json.dumps({"messages": [{"content": filler}, [filler, {"k": filler}]], "model": "fast"}).encode()
    out, sent, _ = prepare(body, ALIASES)[:3]
    assert sent == "fast" and out == body.replace(b'"model": "fast"', b'"model": "tiny"')


def test_nesting_is_refused_past_the_depth_limit_whatever_the_top_level_value() -> None:
    def nested(levels: int) -> bytes:  # `levels` counts every container, the top-level object too
        inner = levels - 1
        return b'{"model":"fast","x":' + b"[" * inner + b"]" * inner + b"}"

    assert prepare(nested(MAX_DEPTH), ALIASES)[1] == "fast"
    for body in (
        nested(MAX_DEPTH + 1),
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        b'{"model":"fast","x":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b"[" * 100_000,  # not even well-formed: the depth is what is refused first
    ):
        with pytest.raises(InvalidArguments, match=f"deeper than {MAX_DEPTH} levels"):
            prepare(body, ALIASES)
    assert prepare(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, ALIASES)[:3] == (
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
        None,
        False,
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"fast","x":[1,2}',
        b'{"model":"fast","x":{"a":1]}',
        b'{"model":"fast","x":["a\\q"]}',  # an escape JSON does not have
        b'{"model":"fast","x":["a\x01"]}',  # a control character in a string
        b'{"model":"fast","x":[1]]}',
        b'{"model":"fast","x":\\[]}',
        b'{"model":"fast" "x":1}',
        b'{"model" "fast"}',
        b'{"model":fast}',
    ],
)
def test_a_malformed_body_is_passed_through_unchanged(body: bytes) -> None:
    assert prepare(body, ALIASES)[:3] == (body, None, False)


def python_lines(fn: Any, *args: Any) -> tuple[Any, int]:
    """`fn(*args)` and the number of Python lines it ran (C code, such as `re` and json's scanner,
    runs no Python line)."""
    lines = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return trace

    sys.settrace(trace)
    try:
        return fn(*args), lines
    finally:
        sys.settrace(None)


def test_rewriting_a_16_mib_prompt_does_not_walk_its_bytes_in_python() -> None:
    # It runs on the IOLoop, which nothing may hold for more than ~1 ms (docs/architecture.md): a 16 MiB
    # body (the /v1 limit, docs/gateway.md) must cost what parsing it in C costs, not a Python loop per
    # byte (which takes most of a second and stalls every other request). Counted in Python lines, not
    # seconds: the scan may turn once per WINDOW characters, never per byte.
    size = 16 * 1024 * 1024
    body = b'{"model":"fast","messages":[{"role":"user","content":"' + b"x" * (size - 64) + b'"}]}'
    (out, sent, *_), lines = python_lines(prepare, body, ALIASES)
    assert sent == "fast" and out[:20] == b'{"model":"tiny","mes'
    small = body[:60] + b'"}]}'
    _, baseline = python_lines(prepare, small, ALIASES)
    windows = size // WINDOW
    assert lines - baseline <= 10 * windows, f"{lines} Python lines for {size} bytes ({baseline} for 64)"


# --- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    yield from running()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("aliases") / "data"
    srv = start_server(Path(data), "--upstream", upstream.url, "--model-aliases", "fast=tiny")
    yield srv
    srv.stop()


def test_the_upstream_receives_the_exact_bytes_except_the_model(
    gateway: Server, upstream: FakeUpstream
) -> None:
    _, secret = gateway.create_key("inference")
    body = (
        b'{ "messages" : [{"role":"user","content":"caf\\u00e9 \xe2\x82\xac \\"q\\"","model":"fast"}],\n'
        b'\t"model":"fast", "seed":12345678901234567890123,"temperature":0.1000000000000000055511151231257827,'
        b'"logit_bias":{"50256":-100}}'
    )
    r = gateway.fetch(
        "/v1/chat/completions",
        "POST",
        token=secret,
        content=body,
        headers={"Content-Type": "application/json", "X-Request-ID": "alias-e2e"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"
    (received,) = upstream.received("alias-e2e")
    assert received.body == body.replace(b'\t"model":"fast"', b'\t"model":"tiny"')
    assert received.header("Content-Length") == str(len(received.body))

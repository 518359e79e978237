"""The chat page's attachments and parameters (docs/chat.md, "Attachments" and "Parameters") in a
real Chromium, against a real vllm-use whose two deployments run the fake vLLM
(tests/fakes/vllm.py), which writes each chat request body it receives to a file:

- "see": a model whose config.json has a `vision_config` and an `audio_config` (GET /v1/models
  lists it as taking text, image and audio), with a generation_config.json (its defaults);
- "text": a text-only model without a generation_config.json.

An image reaches "see" downscaled, as a data: URI; it is refused for "text", and a conversation
with one cannot be switched to "text"; a PDF's text reaches either; the 16 MiB cap holds at its
edge; attachments and parameters survive a reload and an export/import; the placeholders show the
model's own defaults, every field typed reaches the upstream, "Reset to model defaults" clears them.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, expect

from tests.fakes import fake_vllm_bin
from tests.support.browser import Watched, new_page, screenshot, settled, sign_in
from tests.support.deployments import START_TIMEOUT_S, create
from tests.support.server import Server, free_port, start_server
from tests.test_chat import ASSISTANT, USER, canonical, export_conversation, forgive_aborted

CHAT_PATH = "/v1/chat/completions"
ANSWER_TIMEOUT_MS = (START_TIMEOUT_S + 10) * 1000  # a first answer includes the deployment's load
CAP = 16 * 1024 * 1024  # the gateway's body cap (handlers/gateway.py BODY_LIMIT)
GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512, "do_sample": True}
# Every parameter field, a value in its bounds, and the request field it fills.
TYPED = {
    "Temperature": ("0.3", "temperature", 0.3),
    "Top p": ("0.5", "top_p", 0.5),
    "Top k": ("7", "top_k", 7),
    "Min p": ("0.05", "min_p", 0.05),
    "Presence penalty": ("0.4", "presence_penalty", 0.4),
    "Frequency penalty": ("-0.5", "frequency_penalty", -0.5),
    "Repetition penalty": ("1.1", "repetition_penalty", 1.1),
    "Seed": ("1234", "seed", 1234),
    "Max tokens": ("64", "max_tokens", 64),
}


# --- files made by hand -------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """An RGB PNG of `width` × `height` (stripes, so it is not one colour)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = bytes((x * 7) % 256 for x in range(width * 3))
    raw = b"".join(b"\0" + row for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def pdf(line: str) -> bytes:
    """A minimal valid PDF: one page with `line` in Helvetica, its xref offsets computed."""
    stream = f"BT /F1 18 Tf 40 100 Td ({line}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


# --- the stack ----------------------------------------------------------------------------------


def register(server: Server, name: str, files: dict[str, Any]) -> str:
    directory = server.data_dir / "models" / name
    directory.mkdir(parents=True)
    for file, content in files.items():
        (directory / file).write_text(json.dumps(content))
    r = server.fetch("/api/models/local", "POST", json={"name": name, "path": name})
    assert r.status_code == 201, r.text
    return r.json()["model"]["id"]


@pytest.fixture(scope="module")
def bodies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bodies") / "chat.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bodies: Path) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("chat-inputs")
    vllm = fake_vllm_bin(root / "bin", max_lifetime=600, bodies=bodies)
    first = free_port()
    server = start_server(root / "data", "--vllm-bin", str(vllm), "--runtime-ports", f"{first}-{first + 3}")
    try:
        vision = register(
            server,
            "vision",
            {
                "config.json": {"vision_config": {}, "audio_config": {}},
                "generation_config.json": GENERATION,
            },
        )
        plain = register(server, "plain", {"config.json": {}})
        options = {"start_timeout_s": START_TIMEOUT_S}
        for name, model in (("see", vision), ("text", plain)):
            r = create(server, {"name": name, "model_id": model, "options": options})
            assert r.status_code == 201, r.text
        yield server
    finally:
        server.stop()


def received(bodies: Path) -> list[dict[str, Any]]:
    """The chat bodies that reached the fake vLLM, in order."""
    if not bodies.exists():
        return []
    return [json.loads(line) for line in bodies.read_text().splitlines()]


def open_chat(browser: Browser, server: Server, model: str, **context: Any) -> Watched:
    watched = new_page(browser, server.base_url, **context)
    page = watched.page
    sign_in(watched, server.admin_token or "", "/chat")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
    page.get_by_label("Model", exact=True).select_option(model)
    return watched


def attach(page: Page, *files: Path) -> None:
    page.get_by_label("Attach files").set_input_files([str(f) for f in files])


def send(page: Page, text: str) -> None:
    """Send `text` (with what is attached) and wait for its answer."""
    before = page.locator(ASSISTANT).count()
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.locator(ASSISTANT)).to_have_count(before + 1)
    expect(page.locator(ASSISTANT).last).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)


def chat_posts(page: Page) -> list[Request]:
    posts: list[Request] = []
    page.on(
        "request", lambda r: posts.append(r) if r.method == "POST" and r.url.endswith(CHAT_PATH) else None
    )
    return posts


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("files")
    made = {"wide.png": png(3000, 1000), "note.pdf": pdf("Hello from a PDF"), "tiny.wav": b"RIF"}
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in made}


def last_parts(bodies: Path) -> list[dict[str, Any]]:
    content = received(bodies)[-1]["messages"][-1]["content"]
    assert isinstance(content, list), content
    return content


# --- attachments --------------------------------------------------------------------------------


def test_an_image_reaches_the_vision_deployment_downscaled_as_a_data_uri(
    browser: Browser, server: Server, bodies: Path, files: dict[str, Path]
) -> None:
    watched = open_chat(browser, server, "see")
    page = watched.page
    try:
        attach(page, files["wide.png"])
        expect(page.locator(".composer .attachment img")).to_have_attribute("alt", "wide.png")
        send(page, "what is in this picture?")
        parts = last_parts(bodies)
        assert parts[0] == {"type": "text", "text": "what is in this picture?"}
        assert parts[1]["type"] == "image_url" and len(parts) == 2, [p["type"] for p in parts]
        url = parts[1]["image_url"]["url"]
        prefix = "data:image/png;base64,"
        assert url.startswith(prefix), url[:40]
        # 3000 × 1000 downscaled so that its longer side is 2048 px, its shape kept.
        assert png_size(base64.b64decode(url[len(prefix) :])) == (2048, 683)
        # Shown with the prompt; the composer is empty again.
        expect(page.locator(f"{USER} .attachment img")).to_have_attribute("alt", "wide.png")
        expect(page.locator(".composer .attachment")).to_have_count(0)
        watched.assert_clean()
    finally:
        page.context.close()


def test_an_image_or_audio_is_refused_for_the_text_only_model_and_nothing_is_sent(
    browser: Browser, server: Server, bodies: Path, files: dict[str, Path]
) -> None:
    watched = open_chat(browser, server, "text")
    page = watched.page
    try:
        posts = chat_posts(page)
        before = len(received(bodies))
        attach(page, files["wide.png"])
        expect(page.locator(".composer .error-text")).to_contain_text("text does not take images")
        expect(page.locator(".composer .attachment")).to_have_count(0)
        attach(page, files["tiny.wav"])  # audio likewise
        expect(page.locator(".composer .error-text")).to_have_text(
            "tiny.wav: text does not take audio (GET /v1/models lists its inputs as text)."
        )
        expect(page.locator(".composer .attachment")).to_have_count(0)
        page.get_by_label("Message", exact=True).fill("and now?")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator(ASSISTANT)).to_have_count(1)
        expect(page.locator(ASSISTANT)).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        assert len(posts) == 1 and len(received(bodies)) == before + 1
        assert received(bodies)[-1]["messages"][-1]["content"] == "and now?"  # no image went with it
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_conversation_with_an_image_cannot_switch_to_the_text_only_model(
    browser: Browser, server: Server, bodies: Path, files: dict[str, Path]
) -> None:
    watched = open_chat(browser, server, "see")
    page = watched.page
    try:
        attach(page, files["wide.png"])
        send(page, "look")
        picker = page.get_by_label("Model", exact=True)
        picker.select_option("text")
        expect(picker).to_have_value("see")
        expect(page.locator(".model-refused")).to_contain_text(
            "This conversation has images attached: text does not take images"
        )
        compare = page.get_by_label("Compare with", exact=True)
        compare.select_option("text")
        expect(compare).to_have_value("")
        # An edit of the prompt is a new branch with the same image.
        page.locator(USER).get_by_role("button", name="Edit").click()
        page.get_by_label("Edit message").fill("look again")
        page.get_by_role("button", name="Save and send").click()
        expect(page.locator(".branch-index").first).to_have_text("2/2")
        expect(page.locator(ASSISTANT)).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        expect(page.locator(f"{USER} .attachment img")).to_have_attribute("alt", "wide.png")
        assert [p["type"] for p in last_parts(bodies)] == ["text", "image_url"]
        # A new chat has no image: any model will do.
        page.get_by_role("button", name="New chat").click()
        picker.select_option("text")
        expect(picker).to_have_value("text")
        expect(page.locator(".model-refused")).to_be_hidden()
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_pdfs_text_reaches_a_text_only_model(
    browser: Browser, server: Server, bodies: Path, files: dict[str, Path]
) -> None:
    watched = open_chat(browser, server, "text")
    page = watched.page
    try:
        workers: list[str] = []
        page.on("worker", lambda worker: workers.append(worker.url))
        attach(page, files["note.pdf"])
        expect(page.locator(".composer .attachment[data-kind=pdf]")).to_contain_text("note.pdf")
        send(page, "summarise it")
        assert last_parts(bodies) == [
            {"type": "text", "text": "summarise it"},
            {"type": "text", "text": "[PDF note.pdf]\nHello from a PDF"},
        ]
        expect(page.locator(ASSISTANT).last.locator(".message-body")).to_contain_text("Hello from a PDF")
        # pdf.js ran its own worker (not the "fake worker" it falls back to in the page), loaded
        # under the console's CSP: a refusal would show in the console (assert_clean).
        assert workers == [f"{server.base_url}/vendor/pdf.worker.js"], workers
        watched.assert_clean()
    finally:
        page.context.close()


def test_the_16_mib_cap_is_checked_in_the_page_at_its_edge(
    browser: Browser, server: Server, bodies: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    watched = open_chat(browser, server, "see")
    page = watched.page
    try:
        posts = chat_posts(page)
        # The size of a request around 3 bytes of audio (4 in base64): the rest is the same below.
        attach(page, files["tiny.wav"])
        send(page, "cap")
        overhead = len(posts[0].post_data_buffer or b"") - 4
        page.get_by_role("button", name="New chat").click()
        room = CAP - overhead
        audio = tmp_path / "big.wav"
        audio.write_bytes(b"RIFF" + b"\0" * (room // 4 * 3 - 4))  # base64: 4 characters per 3 bytes
        pad = room % 4  # the characters of text that make the request exactly CAP bytes
        attach(page, audio)
        expect(page.locator(".composer .attachment[data-kind=audio]")).to_contain_text("big.wav")
        message = page.get_by_label("Message", exact=True)
        message.fill("cap" + "y" * (pad + 1))  # one byte over
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator(".composer .error-text")).to_contain_text(
            f"This message would be a request of 16.00 MiB ({CAP + 1} bytes): the gateway takes at most 16 MiB"
        )
        assert len(posts) == 1 and page.locator(ASSISTANT).count() == 0
        expect(message).to_have_value("cap" + "y" * (pad + 1))  # kept, with its attachment
        message.fill("cap" + "y" * pad)  # exactly at the cap: sent, and taken by the gateway
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator(ASSISTANT)).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        assert len(posts) == 2 and len(posts[1].post_data_buffer or b"") == CAP
        part = last_parts(bodies)[1]
        assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
        assert len(part["input_audio"]["data"]) == room // 4 * 4
        watched.assert_clean()
    finally:
        page.context.close()


def test_attachments_survive_a_reload_and_an_export_then_import(
    browser: Browser, server: Server, files: dict[str, Path], tmp_path: Path
) -> None:
    watched = open_chat(browser, server, "see")
    page = watched.page
    try:
        attach(page, files["wide.png"], files["note.pdf"])
        expect(page.locator(".composer .attachment")).to_have_count(2)
        send(page, "keep these")
        page.reload()
        chips = page.locator(f"{USER} .attachment")
        expect(chips).to_have_count(2)
        expect(chips.first.locator("img")).to_have_attribute("alt", "wide.png")
        expect(chips.last).to_contain_text("note.pdf")
        _, exported, path = export_conversation(page, tmp_path)
        user = next(m for m in exported["messages"] if m["role"] == "user")
        assert [a["kind"] for a in user["attachments"]] == ["image", "pdf"]
        assert user["attachments"][0]["data"].startswith("data:image/png;base64,")
        assert user["attachments"][1]["text"] == "Hello from a PDF"
        page.get_by_label("Import conversation").set_input_files(str(path))
        expect(page.locator(".conversation-list > li")).to_have_count(2)
        expect(page.locator(f"{USER} .attachment")).to_have_count(2)
        _, again, _ = export_conversation(page, tmp_path)
        assert canonical(again) == canonical(exported)
        # An attachment of a kind the chat does not know is refused, in words.
        user["attachments"][0]["kind"] = "video"
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(exported))
        page.get_by_label("Import conversation").set_input_files(str(bad))
        expect(page.locator(".conversation-io .error-text")).to_contain_text(
            "messages[0].attachments[0].kind should be one of image, audio, pdf"
        )
        expect(page.locator(".conversation-list > li")).to_have_count(2)
        forgive_aborted(watched, "/v1/")  # the reload aborts the page's /v1 fetches in flight
        watched.assert_clean()
    finally:
        page.context.close()


# --- parameters ---------------------------------------------------------------------------------


def placeholder(page: Page, label: str) -> str | None:
    return page.get_by_label(label, exact=True).get_attribute("placeholder")


def test_parameters_show_the_models_defaults_and_reach_the_upstream(
    browser: Browser, server: Server, bodies: Path, tmp_path: Path
) -> None:
    watched = open_chat(browser, server, "see")
    page = watched.page
    try:
        page.locator("details.parameters > summary").click()
        shown = {label: placeholder(page, label) for label in TYPED}
        assert shown == {
            "Temperature": "model default 0.6",
            "Top p": "model default 0.95",
            "Top k": "model default 20",
            "Min p": "server default",
            "Presence penalty": "server default",
            "Frequency penalty": "server default",
            "Repetition penalty": "server default",
            "Seed": "server default",
            "Max tokens": "model default 512",
        }
        page.get_by_label("Model", exact=True).select_option("text")
        expect(page.get_by_label("Temperature", exact=True)).to_have_attribute(
            "placeholder", "server default"
        )
        page.get_by_label("Model", exact=True).select_option("see")
        for label, (typed, _, _) in TYPED.items():
            page.get_by_label(label, exact=True).fill(typed)
        send(page, "with parameters")
        sent = received(bodies)[-1]
        assert {field: sent.get(field) for _, field, _ in TYPED.values()} == {
            field: value for _, field, value in TYPED.values()
        }
        # Kept by the conversation: after a reload, and through an export and import.
        page.reload()
        page.locator("details.parameters > summary").click()  # (closed again after the reload)
        for label, (typed, _, _) in TYPED.items():
            expect(page.get_by_label(label, exact=True)).to_have_value(typed)
        _, exported, path = export_conversation(page, tmp_path)
        assert exported["conversation"]["params"]["seed"] == 1234
        page.get_by_label("Import conversation").set_input_files(str(path))
        expect(page.locator(".conversation-list > li")).to_have_count(2)
        for label, (typed, _, _) in TYPED.items():
            expect(page.get_by_label(label, exact=True)).to_have_value(typed)
        # Reset: every field empty, the model's defaults apply (nothing of them is sent).
        page.get_by_role("button", name="Reset to model defaults").click()
        for label in TYPED:
            expect(page.get_by_label(label, exact=True)).to_have_value("")
        send(page, "with defaults")
        sent = received(bodies)[-1]
        assert not {field for _, field, _ in TYPED.values()} & set(sent), sent.keys()
        forgive_aborted(watched, "/v1/")  # the reload aborts the page's /v1 fetches in flight
        watched.assert_clean()
    finally:
        page.context.close()


def test_a_parameter_out_of_its_bounds_is_refused_at_the_edge(browser: Browser, server: Server) -> None:
    watched = open_chat(browser, server, "text")
    page = watched.page
    try:
        page.locator("details.parameters > summary").click()
        top_k = page.get_by_label("Top k", exact=True)
        top_k.fill("-2")  # -1 is the lowest (none)
        page.get_by_label("Message", exact=True).fill("bounded")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator(".field-error")).to_have_text(
            "A whole number: -1 or 0 for none, else at least 1."
        )
        expect(page.locator(ASSISTANT)).to_have_count(0)
        top_k.fill("-1")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator(ASSISTANT)).to_have_attribute("data-status", "done", timeout=ANSWER_TIMEOUT_MS)
        watched.assert_clean()
    finally:
        page.context.close()


# --- screenshots --------------------------------------------------------------------------------


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_screenshot_of_attachments_in_both_themes(
    browser: Browser, server: Server, files: dict[str, Path], theme: str
) -> None:
    watched = open_chat(browser, server, "see", color_scheme=theme)
    page = watched.page
    try:
        attach(page, files["wide.png"], files["note.pdf"])
        expect(page.locator(".composer .attachment")).to_have_count(2)
        send(page, "What does this chart show?")
        attach(page, files["tiny.wav"])  # in the composer, not sent
        expect(page.locator(".composer .attachment")).to_have_count(1)
        expect(page.locator(f"{USER} .attachment")).to_have_count(2)
        settled(page)
        screenshot(page, f"chat-attachments-{theme}")
        watched.assert_clean()
    finally:
        page.context.close()

"""What `GET /v1/models` says of a model from its files (vllm_use/models/files.py `model_card`):
the sampling defaults of its generation_config.json, read as safely as its config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vllm_use.models.files import CARD_MAX_BYTES, model_card

QWEN_LIKE = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "min_p": 0,
    "repetition_penalty": 1.05,
    "max_new_tokens": 2048,
    "transformers_version": "4.51.0",
}


def model_dir(tmp_path: Path, generation: object = None, raw: bytes | None = None) -> Path:
    directory = tmp_path / "m"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"vision_config": {}, "max_position_embeddings": 4096}))
    if raw is not None:
        (directory / "generation_config.json").write_bytes(raw)
    elif generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def test_generation_defaults_are_the_keys_vllm_applies(tmp_path: Path) -> None:
    card = model_card(model_dir(tmp_path, QWEN_LIKE))
    assert card["generation_defaults"] == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0,
        "repetition_penalty": 1.05,
        "max_tokens": 2048,  # vLLM's name for max_new_tokens
    }
    # The rest of the card is still read from config.json.
    assert card["input_modalities"] == ["text", "image"] and card["max_model_len"] == 4096


def test_generation_defaults_drop_unknown_keys_and_values_out_of_range(tmp_path: Path) -> None:
    given = {
        "temperature": "0.7",  # not a number
        "top_p": 0,  # top_p must be more than 0
        "top_k": 1.5,  # not whole
        "min_p": True,  # a bool is no number
        "repetition_penalty": 2.0,  # the edge: kept
        "max_new_tokens": 0,  # at least 1
        "presence_penalty": 0.5,  # not applied by vLLM from this file
        "seed": 7,
    }
    assert model_card(model_dir(tmp_path, given))["generation_defaults"] == {"repetition_penalty": 2.0}


def test_missing_or_bad_generation_config_gives_no_defaults(tmp_path: Path) -> None:
    assert model_card(model_dir(tmp_path / "missing"))["generation_defaults"] == {}
    assert model_card(model_dir(tmp_path / "bad", raw=b"{not json"))["generation_defaults"] == {}
    assert model_card(model_dir(tmp_path / "list", [0.7]))["generation_defaults"] == {}


def test_a_generation_config_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(QWEN_LIKE))
    os.symlink(outside, directory / "generation_config.json")
    assert model_card(directory)["generation_defaults"] == {}


def test_a_generation_config_is_read_up_to_the_size_cap(tmp_path: Path) -> None:
    text = json.dumps({"temperature": 0.5})
    at_cap = (text[:-1] + " " * (CARD_MAX_BYTES - len(text)) + "}").encode()
    assert len(at_cap) == CARD_MAX_BYTES
    assert model_card(model_dir(tmp_path / "at", raw=at_cap))["generation_defaults"] == {"temperature": 0.5}
    over = at_cap[:-1] + b" }"
    assert model_card(model_dir(tmp_path / "over", raw=over))["generation_defaults"] == {}

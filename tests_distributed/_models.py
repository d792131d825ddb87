"""Tiny random models (built in-process, no network) and the transformers greedy reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from lp.models import cache_dir

REAL_MODEL = cache_dir() / "models" / "smollm2-135m"  # where `python -m lp.models fetch` puts it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
ARCHS = ("llama", "qwen2", "mistral")


def build_tiny(arch: str, out: Path, *, vocab: int, seed: int, init: float = 0.2) -> Path:
    """Save a 2-layer, hidden-64 random `arch` model with the real model's tokenizer files.

    Untied embeddings and a large init range keep greedy outputs varied (a small tied model
    only repeats its input token); a small vocab makes them revisit n-grams, so lookahead and
    verification drafts do get accepted. Token ids >= vocab must then not be fed (the API
    takes ids directly); use vocab=49152 for text prompts."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[arch]
    cfg = kind(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=init,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (REAL_MODEL / name).exists():
            shutil.copy(REAL_MODEL / name, Path(out) / name)
    return Path(out)


def load(path: str | Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding: the ids of the new tokens."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=model.generation_config.pad_token_id,
    )
    return out[0, len(prompt_ids) :].tolist()

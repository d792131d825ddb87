"""Helpers and fixtures for the unit tests (a plain module: tests import it without clashing
with tests_distributed/conftest.py; tests/conftest.py registers its fixtures).

Shared fixtures: tiny random causal LMs built in-process (no downloads) and a tiny model
directory with an offline word-level tokenizer, loadable by plain transformers and by lp."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent

TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=256,
    max_position_embeddings=512,
    # A little above the default 0.02: the greedy output of a random model is then less
    # degenerate (fewer 1- or 2-token loops) and its argmax margins are comfortably wide.
    initializer_range=0.05,
)

ARCHS = ("llama", "qwen2", "mistral")


def build_tiny(arch: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random causal LM of the given architecture, eval mode, sdpa attention, fp32."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **overrides}, attn_implementation="sdpa")
    model = model_cls(config).eval()
    # Reference generation must run to max_new_tokens unless a test asks for an EOS.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, torch.nn.Module]:
    """One tiny model per architecture (different seeds, so their outputs differ)."""
    return {arch: build_tiny(arch, seed=i + 1) for i, arch in enumerate(ARCHS)}


@torch.inference_mode()
def reference_greedy(
    model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos: list[int] | None = None
) -> list[int]:
    """Plain transformers greedy decoding: the ground truth lookahead decoding must equal
    (stopping at `eos` ids, like lp, where given)."""
    ids = torch.tensor([prompt], dtype=torch.long, device=next(model.parameters()).device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def off_greedy(model: torch.nn.Module, prompt: list[int], output: list[int], tol: float) -> int | None:
    """The first index of `output` whose token's logit, in one transformers forward over prompt +
    output, is more than `tol` below the best one (None: every token is greedy up to `tol`).

    On a GPU, forwards of different token counts round differently, so a random tiny model's
    near-ties can flip between two exact implementations; a wrong mask or cache slot shows
    as a token far from the best."""
    ids = torch.tensor([prompt + output], dtype=torch.long, device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = logits.gather(1, ids[0, len(prompt) :, None])[:, 0]
    bad = (logits.max(-1).values - chosen > tol).nonzero()
    return int(bad[0]) if len(bad) else None


# ---------------------------------------------------------------------------------------------
# A tiny model directory with a tokenizer, for the CLI and the Python API.

TOKENIZER_WORDS = 125  # "<unk>", "<s>", "</s>" and w0..w124: 128 ids
TINY_DIR_CONTEXT = 64  # max_position_embeddings of the saved tiny model


def _word_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(TOKENIZER_WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama (vocab 128, context 64) with a word-level tokenizer ("w0 w1 ...")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny_llama")
    tok = _word_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY, "vocab_size": len(tok), "max_position_embeddings": TINY_DIR_CONTEXT})
    model = LlamaForCausalLM(config)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def words(ids) -> str:
    """Text for the tiny tokenizer: word-level ids 3.. map to "w0".."w124"."""
    return " ".join(f"w{i - 3}" for i in ids)


@pytest.fixture(scope="session")
def cli_env() -> dict[str, str]:
    """Environment for CLI subprocesses: offline, single rank, one thread, cache in a tmp dir."""
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
    )
    return env


def tree_tensors(tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parents, depth, ancestors) of a DraftTree as greedy_accept takes them; the ancestor
    matrix is the last block of a step layout's mask, as the decoder reads it."""
    from lp.lookahead import step_layout

    n = tree.size
    mask = step_layout(1, 1, 2, range(0), tree.parents).mask
    return (
        torch.tensor(tree.parents, dtype=torch.long).reshape(n),
        torch.from_numpy(tree.depth),
        torch.from_numpy(mask[mask.shape[0] - n :, mask.shape[0] - n :].copy()),
    )


def tree_accept(y1: torch.Tensor, tree, preds: torch.Tensor, width: int):
    """greedy_accept on a DraftTree, `preds[i]` the model's argmax after node i."""
    from lp.verify import greedy_accept

    return greedy_accept(y1, torch.from_numpy(tree.tokens), *tree_tensors(tree), preds.reshape(-1), width)


def chain_accept(y1: torch.Tensor, drafts: torch.Tensor, preds: torch.Tensor):
    """greedy_accept on G unshared candidates `[G, L]`, `best` as a candidate index (the
    classic branch)."""
    from lp.verify import Acceptance

    G, L = drafts.shape
    acc = tree_accept(y1, chains(drafts.numpy()), preds.reshape(-1), L + 1)
    return Acceptance(torch.where(acc.best >= 0, acc.best // L, acc.best), acc.accepted, acc.tokens)


def chain_sample(p_x0: torch.Tensor, drafts: torch.Tensor, p_cand: torch.Tensor, u: torch.Tensor):
    """sample_accept on G unshared candidates `[G, N-1]` with p_cand `[G, N-1, V]`."""
    from sampling_helpers import sample_accept

    G, L = drafts.shape
    return sample_accept(p_x0, chains(drafts.numpy()), p_cand.reshape(G * L, p_cand.shape[-1]), u, L + 1)


def chain_continue(first_token: int, drafts: torch.Tensor, p_cand: torch.Tensor, u: torch.Tensor):
    """sample_continue on alive candidates `[A, N-1]` with p_cand `[A, N-1, V]`."""
    from lp.verify import sample_continue

    A, L = drafts.shape
    return sample_continue(first_token, chains(drafts.numpy()), p_cand.reshape(A * L, p_cand.shape[-1]), u, L + 1)


def chains(drafts: np.ndarray):
    """`[G, L]` drafts as a tree of G unshared chains (the classic verification branch)."""
    from lp.lookahead.tree import DraftTree, chain_parents

    G, L = drafts.shape
    return DraftTree(np.ascontiguousarray(drafts, dtype=np.int64).reshape(-1), chain_parents(G, L))

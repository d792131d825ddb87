"""Helpers of both test folders (tests/ and tests_distributed/), imported as `helpers`: the root
conftest.py puts tests/ on sys.path for pytest, and tests_distributed/_launch.py on the
PYTHONPATH of the rank processes it starts. tests/conftest.py registers the unit tests' fixtures
defined here.

- tiny random models built in-process (no downloads): `build_tiny`, `save_tiny`, `peaked_llama`
- the ground truth: transformers' greedy decoding (`reference_greedy`), and `off_greedy`
- a tiny model directory with an offline word-level tokenizer, for the CLI and the Python API
- verification on trees and chains (`tree_accept`, `chain_accept`, `sample_accept`, ...)
- the sampling tests' exact distributions and chi-square goodness of fit
- a packed step of two sequences (`two_segments`)"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lp.models import cache_dir
from lp.verify.distribution import warp

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent
REAL_MODEL = cache_dir() / "models" / "smollm2-135m"  # where `python -m lp.models fetch` puts it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# ---------------------------------------------------------------------------------------------
# Tiny random models.

ARCHS = ("llama", "qwen2", "mistral")

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

# What `save_tiny` changes: untied embeddings and a large init range keep greedy outputs varied
# (a small tied model only repeats its input token); EOS 2 as in a real model directory.
SAVED = dict(
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    initializer_range=0.2,
)


def build_tiny(arch: str = "llama", seed: int = 0, *, reference: bool = True, **overrides) -> torch.nn.Module:
    """A tiny random causal LM of the given architecture (llama, qwen2, mistral or gemma): the
    TINY settings with `overrides` (config fields), eval mode, sdpa attention, fp32.

    reference=True: its generation config has no EOS and pads with 0, so transformers' greedy
    reference runs to max_new_tokens unless a test asks for an EOS; False keeps the one the
    config implies (what a saved model directory carries)."""
    from transformers import (
        GemmaConfig,
        GemmaForCausalLM,
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
        "gemma": (GemmaConfig, GemmaForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **overrides}, attn_implementation="sdpa")
    model = model_cls(config).eval()
    if reference:
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return model


def save_tiny(arch: str, out: Path, *, vocab: int, seed: int, **overrides) -> Path:
    """Save a tiny random `arch` model (TINY with SAVED and `overrides`) with the real model's
    tokenizer files, for the API and CLI in other processes.

    A small vocab makes greedy outputs revisit n-grams, so lookahead and verification drafts do
    get accepted; token ids >= vocab must then not be fed (the API takes ids directly). Use
    vocab=49152 for text prompts."""
    model = build_tiny(arch, seed, reference=False, **{**SAVED, "vocab_size": vocab, **overrides})
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (REAL_MODEL / name).exists():
            shutil.copy(REAL_MODEL / name, Path(out) / name)
    return Path(out)


def load(path: str | Path) -> torch.nn.Module:
    """A saved model in fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def peaked_llama(
    seed: int = 3, vocab: int = 8, scale: float = 40.0, kv_heads: int = 1
) -> tuple[torch.nn.Module, list[int]]:
    """A tiny random Llama with peaked next-token distributions, and a prompt that is its own
    greedy rollout, so the n-gram pool holds drafts the model often samples. `kv_heads=2`
    makes every head count divide by 2 (tensor parallelism)."""
    model = build_tiny(
        "llama",
        seed,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        initializer_range=0.02,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    start = [1, 5]
    return model, start + reference_greedy(model, start, 14)


def make_prompt(seed: int = 1, length: int = 8, repeats: int = 3, vocab: int = 256) -> list[int]:
    """A prompt that repeats itself, so the pool seeded from it holds useful n-grams."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist() * repeats


def spec_bench_questions(n: int) -> list[str]:
    """The first turn of the first `n` Spec-Bench questions."""
    from lp.bench.datasets import SPEC_BENCH

    with SPEC_BENCH.open() as f:
        return [json.loads(line)["turns"][0] for line, _ in zip(f, range(n))]


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, torch.nn.Module]:
    """One tiny model per architecture (different seeds, so their outputs differ)."""
    return {arch: build_tiny(arch, seed=i + 1) for i, arch in enumerate(ARCHS)}


# ---------------------------------------------------------------------------------------------
# The ground truth: transformers' greedy decoding.


@torch.inference_mode()
def reference_greedy(
    model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos: list[int] | None = None
) -> list[int]:
    """Plain transformers greedy decoding, the new tokens' ids: the ground truth lookahead
    decoding must equal. It stops at the `eos` ids where given (like lp), else at the model's
    generation config's (none for `build_tiny` models)."""
    ids = torch.tensor([prompt], dtype=torch.long, device=next(model.parameters()).device)
    stop = {} if eos is None else {"eos_token_id": eos}
    pad = model.generation_config.pad_token_id
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0 if pad is None else pad,
        **stop,
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


def save_word_model(out: Path, *, context: int = TINY_DIR_CONTEXT, **overrides) -> Path:
    """Save a tiny random Llama (TINY with `overrides`, seed 0, vocab 128, `context` positions)
    with a word-level tokenizer ("w0 w1 ..." -> ids 3..), loadable by plain transformers and lp."""
    tok = _word_tokenizer()
    model = build_tiny("llama", 0, reference=False, vocab_size=len(tok), max_position_embeddings=context, **overrides)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama (vocab 128, context 64) with a word-level tokenizer ("w0 w1 ...")."""
    return save_word_model(tmp_path_factory.mktemp("tiny_llama"))


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


# ---------------------------------------------------------------------------------------------
# Verification on draft trees and on chains of unshared candidates.


def tree_tensors(tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parents, depth, ancestors) of a DraftTree as greedy_accept takes them; the ancestor
    matrix is the last block of a step layout's mask, as the decoder reads it."""
    from lp.lookahead.mask import step_layout

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


def alive_after(first_tokens: torch.Tensor, first):
    """Bool `[r]`: the roots that continue to level 2 after `first` (none if no draft was accepted)."""
    if not first.accepted:
        return torch.zeros_like(first_tokens, dtype=torch.bool)
    return first_tokens == first.token


def sample_accept(p_x0: torch.Tensor, tree, p_nodes: torch.Tensor, u: torch.Tensor, width: int | None = None):
    """One step's sampling verification on one rank, whole: `sample_first_level`, then, when a
    draft was accepted, `sample_continue` (what lp's SamplingVerifier does across ranks)."""
    from lp.verify.sampling import Sampled, sample_continue, sample_first_level, uniforms_needed

    depth = int(tree.depth.max()) if tree.size else 0
    width = width or depth + 1
    if p_nodes.shape[0] != tree.size or (tree.size and p_nodes.shape[1] != p_x0.shape[-1]):
        raise ValueError(
            f"sample_accept: p_nodes {tuple(p_nodes.shape)} does not match a tree of "
            f"{tree.size} nodes and p_x0 {tuple(p_x0.shape)}"
        )
    if u.numel() < uniforms_needed(depth):
        raise ValueError(f"sampling verification needs {uniforms_needed(depth)} uniforms, got {u.numel()}")
    first = sample_first_level(p_x0, torch.from_numpy(tree.tokens[tree.roots]), u)
    if not first.accepted:
        return Sampled(torch.tensor([first.token] + [-1] * (width - 1), dtype=torch.long, device=p_x0.device), 1, [])
    return sample_continue(first.token, tree, p_nodes, u, width)


def follow_first_drafts(first_token: int, tree, p_nodes: torch.Tensor, max_commit: int):
    """A wrong sampling rule for the distribution tests' controls (same signature as
    lp.verify.sample_continue): always accept the drafts, from the first root carrying
    `first_token` down each node's first child, then the most likely next token."""
    from lp.verify.sampling import Sampled

    node = next(int(r) for r in tree.roots if tree.tokens[r] == first_token)
    out, path = [first_token], [node]
    while True:
        kids = [i for i, p in enumerate(tree.parents) if p == node]
        if not kids:
            break
        node = kids[0]
        out.append(int(tree.tokens[node]))
        path.append(node)
    out.append(int(p_nodes[node].argmax()))
    return Sampled(torch.tensor(out + [-1] * (max_commit - len(out))), len(out), path)


# ---------------------------------------------------------------------------------------------
# Sampling distribution tests: settings, exact distributions, goodness of fit.

# The decode settings of the `peaked_llama` distribution tests (one rank and LP), and the
# changes for recycled drafts: drafts from the successor table alone (no pool, no text drafts),
# which start empty, so they appear from the second step on and three tokens reach them.
SAMPLING = dict(W=3, N=3, G=3, max_new_tokens=2, temperature=0.9, top_k=6)
RECYCLED = dict(G=0, tree_tokens=6, drafts="pool", max_new_tokens=3)


@torch.inference_mode()
def exact_distribution(
    model: torch.nn.Module, prompt: list[int], length: int, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) under the warped model, by enumerating every prefix."""
    dist = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, p in dist.items():
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            probs = warp(logits.double(), temperature, top_k, top_p).tolist()
            for t, q in enumerate(probs):
                if q > 0:
                    nxt[prefix + (t,)] = p * q
        dist = nxt
    return dist


def settings_distribution(model: torch.nn.Module, prompt: list[int], settings: dict) -> dict[tuple[int, ...], float]:
    """`exact_distribution` of the tokens decode settings (SAMPLING, with RECYCLED) sample."""
    return exact_distribution(
        model,
        prompt,
        settings["max_new_tokens"],
        settings["temperature"],
        settings.get("top_k", 0),
        settings.get("top_p", 1.0),
    )


def chi_square_pvalue(
    samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float], min_expected: float = 5.0
) -> float:
    """Goodness of fit of `samples` to `expected` probabilities; cells with an expected count
    below `min_expected` are pooled into one. A sample outside the support gives p = 0."""
    n = len(samples)
    counts = Counter(samples)
    if any(s not in expected for s in counts):
        return 0.0
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in expected.items():
        if p * n >= min_expected:
            cells.append((counts.get(key, 0), p * n))
        else:
            pooled_obs += counts.get(key, 0)
            pooled_exp += p * n
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


# the fields of every `python -m lp.generate` JSONL row (docs/design.md, contracts)
OUTPUT_FIELDS = (
    "id",
    "prompt_ids",
    "output_ids",
    "text",
    "new_tokens",
    "steps",
    "S",
    "seconds",
    "tokens_per_s",
    "world_size",
    "W",
    "N",
    "G",
    "mode",
)


# ---------------------------------------------------------------------------------------------
# Packed steps.


def two_segments(worker, prompts: list[list[int]]):
    """Two sequences of `worker` after their prompts and one packed step of both (lp/engine/packed.py):
    a lookahead step's layout for the first (a window and a tree), a prompt chunk of 5 tokens for
    the second (logits for its last); the step, the layout and the sequences' KV."""
    from lp.engine.packed import PackedStep, prompt_chunk, step_segment
    from lp.lookahead.mask import step_layout

    kvs = [worker.sequence(len(p) + 5, 64) for p in prompts]
    for kv, p in zip(kvs, prompts):
        worker.prefill(kv, p)
    layout = step_layout(2, 5, 3, range(1, 4), (-1, 0, 0, -1, 3, 4))
    ids = np.random.default_rng(0).integers(3, 200, layout.size)
    kvs[0].reserve(kvs[0].length + layout.size)
    kvs[1].reserve(kvs[1].length + 5)
    first = step_segment(kvs[0].owner, layout, ids, kvs[0].length + 1, kvs[0].length, kvs[0].table)
    chunk = prompt_chunk(kvs[1].owner, np.arange(5, 10), kvs[1].length, kvs[1].table)
    chunk.rows = np.array([4])
    return PackedStep([first, chunk]), layout, kvs

"""Shared fixtures: tiny random models, the transformers reference, and the batched API runs.

Launching ranks is the slow part, so one launch per world size runs every API case (all
architectures and (N, W, G) configurations, plus the rank-mismatch cases); the exactness,
collective-count and mismatch tests all read that launch's per-rank results.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import EOS_MODEL, MAX_NEW, PROMPTS, api_spec  # noqa: E402
from _launch import run_api_worker  # noqa: E402
from helpers import ARCHS, load, reference_greedy, save_tiny  # noqa: E402

# The server and the openai client come with `lp[test]`: where they are absent (a bare CUDA image
# running `pytest -m cuda`), the server's modules are not collected.
SERVE = ("fastapi", "uvicorn", "openai")
collect_ignore = (
    [] if all(map(importlib.util.find_spec, SERVE)) else ["test_serve.py", "test_serve_ranks.py", "test_serve_real.py"]
)

API_TIMEOUT_S = 150  # hard limit for one API launch (its whole batch of cases)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Llama, Qwen2 and Mistral, vocab 256 (token ids go through the API directly), and
    `llama_eos`: llama's weights with a second EOS id, a token that llama's greedy output on
    prompt 0 first produces after 10+ tokens (so decoding stops early, mid-window)."""
    root = tmp_path_factory.mktemp("tiny")
    models = {arch: save_tiny(arch, root / arch, vocab=256, seed=seed) for seed, arch in enumerate(ARCHS)}
    out = reference_greedy(load(models["llama"]), PROMPTS[0], MAX_NEW)
    stop = next(t for i, t in enumerate(out) if i >= 10 and t not in out[:i] and t != 2)
    eos_dir = root / EOS_MODEL
    shutil.copytree(models["llama"], eos_dir)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((eos_dir / name).read_text())
        cfg["eos_token_id"] = [2, stop]
        (eos_dir / name).write_text(json.dumps(cfg))
    models[EOS_MODEL] = eos_dir
    return models


@pytest.fixture(scope="session")
def tiny_text_model(tmp_path_factory) -> Path:
    """A tiny Llama with the real 49152-token vocab and tokenizer, for text prompts (CLI)."""
    return save_tiny("llama", tmp_path_factory.mktemp("tiny_text") / "llama", vocab=49152, seed=7)


@pytest.fixture(scope="session")
def references(tiny_models) -> dict[tuple[str, int], list[int]]:
    """transformers `generate(do_sample=False)` for every (arch, prompt)."""
    refs = {}
    for arch, path in tiny_models.items():
        model = load(path)
        for p, prompt in enumerate(PROMPTS):
            refs[arch, p] = reference_greedy(model, prompt, MAX_NEW)
    return refs


@pytest.fixture(scope="session")
def api_run(tiny_models, tmp_path_factory):
    """`api_run(P)`: launch (once per P, cached) the batched API cases on P ranks; returns
    (launch, [rank documents])."""
    cache: dict[int, tuple] = {}

    def get(world_size: int):
        if world_size not in cache:
            tmp = tmp_path_factory.mktemp(f"api_p{world_size}")
            cache[world_size] = run_api_worker(
                api_spec(tiny_models, world_size), world_size, timeout=API_TIMEOUT_S, tmp=tmp
            )
        return cache[world_size]

    return get

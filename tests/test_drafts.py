"""The text index and a step's drafts (lp/lookahead/text.py, lp/lookahead/drafts.py) against
plain list-and-dict references (tests/reference_drafts.py): random sequences over a few tokens
(long, overlapping matches; ties), pools with evictions and refreshes, every order of the pool's
candidates, draft memories of earlier texts."""

from __future__ import annotations

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.lookahead.drafts import step_drafts
from lp.lookahead.memory import DraftMemory
from lp.lookahead.pool import NGramPool
from lp.lookahead.text import TextIndex
from lp.lookahead.window import JacobiWindow
from tests.reference_drafts import DictPool, ListMemory, ListTextIndex, listed_chains


@pytest.mark.parametrize("seed", range(30))
def test_text_index_equals_the_list_index(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(1, 5))
    indexed, lone = bool(seed % 7), bool(seed % 3)
    index, ref = TextIndex((), indexed, lone), ListTextIndex((), indexed, lone)
    while len(ref.tokens) < 300:  # past the arrays' first sizes
        new = rng.integers(0, vocab, int(rng.integers(0, 12))).tolist()
        index.extend(new if seed % 2 else np.array(new))
        ref.extend(new)
        assert index.tokens.tolist() == ref.tokens
        length, count = int(rng.integers(0, 12)), int(rng.integers(0, 9))
        assert index.drafts(length, count) == ref.drafts(length, count)
        assert index.lone_drafts(length, count) == ref.lone_drafts(length, count)


def step_config(rng: np.random.Generator) -> DecodeConfig:
    return DecodeConfig(
        W=int(rng.integers(1, 6)),
        N=int(rng.integers(2, 6)),
        G=int(rng.integers(1, 8)),
        drafts=str(rng.choice(["pool", "pool+text"])),
        pool_order=str(rng.choice(["recent", "frequent", "context"])),
        draft_len=int(rng.integers(1, 12)),
        text_drafts=int(rng.integers(1, 9)),
        lone_matches=bool(rng.integers(2)),
        memory=bool(rng.integers(2)),
    )


@pytest.mark.parametrize("seed", range(30))
def test_step_drafts_equal_the_listed_ones(seed):
    """A decode's sources fed the same tokens and window n-grams: each step's drafts, best first by
    kind, and their sources (the window's row last) equal the references'."""
    rng = np.random.default_rng(seed)
    cfg = step_config(rng)
    vocab = int(rng.integers(2, 6))
    prompt = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
    pool, ref_pool = NGramPool(cfg.N, cfg.pool_capacity), DictPool(cfg.N, cfg.pool_capacity)
    lone = cfg.lone_matches
    text, ref_text = TextIndex(prompt, lone=lone), ListTextIndex(prompt, lone=lone)
    pool.add_sequence(prompt)
    ref_pool.add_sequence(prompt)
    budget = int(rng.integers(20, 200))
    memory, ref_memory = DraftMemory(budget), ListMemory(budget)
    window = JacobiWindow(max(cfg.W, 2), cfg.N, prompt, seed)
    for _ in range(40):
        if rng.random() < 0.3:  # an earlier decode ends
            earlier = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
            memory.add(earlier[:5], earlier[5:])
            ref_memory.add(earlier[:5], earlier[5:])
        guesses = cfg.max_draft if window.ready else 0
        count = cfg.text_drafts if cfg.drafts == "pool+text" else 0
        remembered = cfg.text_drafts if cfg.memory else 0
        context, frequent = cfg.pool_order == "context" and cfg.N > 2, cfg.pool_order == "frequent"
        chains = step_drafts(
            text, pool, window, memory, cfg.draft_len, count, context, frequent, guesses, remembered, cfg.max_draft
        )
        row = window.rows[0, 1 : guesses + 1].tolist()
        drafts, sources = listed_chains(cfg, ref_pool, ref_text, row, ref_memory)
        assert chains.drafts == drafts and chains.sources.tolist() == sources
        grams = rng.integers(0, vocab, size=(int(rng.integers(0, 8)), cfg.N))
        pool.add_rows(grams)
        ref_pool.add_rows(grams)
        window.update(rng.integers(0, vocab, window.rows.shape[1]))
        new = rng.integers(0, vocab, int(rng.integers(1, 5))).tolist()
        text.extend(new)
        ref_text.extend(new)
        tail = ref_text.tokens[-(len(new) + cfg.N - 1) :]
        pool.add_sequence(tail)
        ref_pool.add_sequence(tail)

"""The text index and a step's drafts (lp/lookahead/drafts.py, lp/decode/policy.py) against
plain list-and-dict references (tests/reference_drafts.py): random sequences over a few tokens
(long, overlapping matches; ties), pools with evictions and refreshes, every order of the pool's
candidates."""

from __future__ import annotations

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.decode.policy import draft_chains, ranked_drafts, source_drafts
from lp.lookahead import JacobiWindow, NGramPool
from lp.lookahead.drafts import TextIndex, as_tuples
from tests.reference_drafts import DictPool, ListTextIndex, listed_chains, listed_drafts


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
        order=str(rng.choice(["recent", "frequent", "context"])),
        draft_len=int(rng.integers(1, 12)),
        text_drafts=int(rng.integers(1, 9)),
        text_match=int(rng.choice([1, 2])),
    )


@pytest.mark.parametrize("seed", range(30))
def test_step_drafts_equal_the_listed_ones(seed):
    """A decode's sources fed the same tokens and window n-grams: each step's drafts by kind,
    ranked, and as chains with their sources (the window's row last) equal the references'."""
    rng = np.random.default_rng(seed)
    cfg = step_config(rng)
    vocab = int(rng.integers(2, 6))
    prompt = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
    pool, ref_pool = NGramPool(cfg.N, cfg.pool_capacity), DictPool(cfg.N, cfg.pool_capacity)
    lone = cfg.text_match == 1
    text, ref_text = TextIndex(prompt, lone=lone), ListTextIndex(prompt, lone=lone)
    pool.add_sequence(prompt)
    ref_pool.add_sequence(prompt)
    window = JacobiWindow(max(cfg.W, 2), cfg.N, prompt, seed)
    for _ in range(40):
        want = listed_drafts(cfg, ref_pool, ref_text)
        assert source_drafts(cfg, pool, text) == want
        assert ranked_drafts(cfg, pool, text) == list(dict.fromkeys(d for kind in want for d in kind))
        chains = draft_chains(cfg, pool, text, window)
        row = window.rows[0, 1 : cfg.max_draft + 1].tolist() if window.ready else ()
        drafts, sources = listed_chains(cfg, ref_pool, ref_text, row)
        assert as_tuples(chains.tokens, chains.starts) == drafts and chains.sources.tolist() == sources
        grams = rng.integers(0, vocab, size=(int(rng.integers(0, 8)), cfg.N))
        pool.add_rows(grams)
        ref_pool.add_rows(grams)
        window.update(rng.integers(0, vocab, window.W))
        new = rng.integers(0, vocab, int(rng.integers(1, 5))).tolist()
        text.extend(new)
        ref_text.extend(new)
        tail = ref_text.tokens[-(len(new) + cfg.N - 1) :]
        pool.add_sequence(tail)
        ref_pool.add_sequence(tail)

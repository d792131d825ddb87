"""The draft memory (lp/lookahead/memory.py): the texts of finished decodes, bounded in two
generations, drafting what followed the text's suffix in them (checked against a brute-force
listing), saved and loaded with the model it was learned from; and a decode that draws on it:
greedy output unchanged, fewer steps where earlier texts repeat."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import build_tiny, make_prompt, reference_greedy
from reference_drafts import ListMemory

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder
from lp.errors import LPError
from lp.lookahead.chains import new_chains
from lp.lookahead.memory import DraftMemory, identity, memory_drafts
from lp.lookahead.text import TextIndex
from lp.worker import Worker


def _drafts(memory: DraftMemory, seq: list[int], length: int, count: int, source: int = 0):
    chains = new_chains(count, count * length)
    memory_drafts(memory, TextIndex(seq), length, count, chains, source)
    return chains.drafts, chains.sources.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_drafts_are_the_brute_force_listing(seed):
    """Random texts of a small vocabulary (many repeats, texts aging out of both generations):
    every query's drafts are the brute-force listing's, in its order."""
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(40, 400))
    memory, listed = DraftMemory(budget), ListMemory(budget)
    for _ in range(30):
        prompt = rng.integers(0, 6, int(rng.integers(1, 20))).tolist()
        output = rng.integers(0, 6, int(rng.integers(0, 60))).tolist()
        memory.add(prompt, output)
        listed.add(prompt, output)
        assert [t.tolist() for t in memory.texts()] == [listed.older, listed.newer]
        for _ in range(3):
            seq = rng.integers(0, 6, int(rng.integers(1, 14))).tolist()
            length, count = int(rng.integers(1, 9)), int(rng.integers(1, 7))
            drafts, sources = _drafts(memory, seq, length, count)
            assert list(zip(drafts, sources)) == listed.drafts(seq, length, count), (seq, length, count)


def test_longest_match_newest_first_and_sources():
    memory = DraftMemory(1000)
    memory.add([], [5, 2, 3, 4, 5])  # matches "2 3" (2 tokens)
    memory.add([], [9, 1, 2, 3, 7, 8])  # matches "1 2 3" (3 tokens)
    memory.add([], [2, 3, 6])  # matches "2 3", newer
    drafts, sources = _drafts(memory, [0, 1, 2, 3], 4, 5, source=10)
    assert drafts == [(7, 8), (6,), (4, 5)]  # none runs past its text's end
    assert sources == [11, 12, 12]  # by the match: 3 tokens, 2


def test_budget_honoured_and_oldest_aged_out():
    memory = DraftMemory(64)
    memory.add([], [1, 2, 3, 4])
    assert _drafts(memory, [1, 2], 2, 1)[0] == [(3, 4)]
    for i in range(20):
        memory.add([], [100 + i] * 10)
        assert memory.tokens <= 64
    assert _drafts(memory, [1, 2], 2, 1)[0] == []  # two generations later: gone
    assert _drafts(memory, [119, 119], 2, 2)[0] == [(119,), (119, 119)]  # the newest first


def test_off_and_bad_budgets():
    memory = DraftMemory(0)
    memory.add([1, 2], [1, 2, 3])
    assert memory.tokens == 0 and memory.digest == 0
    assert _drafts(memory, [1, 2], 3, 2)[0] == []
    for bad in (-1, 1.5, True, "64"):
        with pytest.raises(LPError, match="draft_memory"):
            DraftMemory(bad)


def test_the_digest_tells_budgets_and_text_ends_apart():
    """Ranks of other budgets, or fed the same tokens cut into other texts, hold other memories."""
    a, b = DraftMemory(64), DraftMemory(64)
    assert a.digest == b.digest != DraftMemory(128).digest
    a.add([], [1, 2])
    a.add([], [3])
    b.add([], [1])
    b.add([], [2, 3])
    assert a.digest != b.digest


def test_clear_empties_the_memory_in_place():
    memory = DraftMemory(64)
    empty, rates, held = memory.digest, memory.rates, memory
    memory.add([1, 2], [3, 4, 5])
    memory.clear()
    assert held.tokens == 0 and held.digest == empty and np.array_equal(held.rates, rates)
    assert _drafts(held, [3, 4], 2, 1)[0] == []


def test_a_memory_file_outside_a_folder_is_refused_before_the_run(tiny_model_dir, tmp_path):
    from lp import LP
    from lp.lookahead.memory import check_file

    for bad in (tmp_path, tmp_path / "missing" / "memory.lp", "", 3):
        with pytest.raises(LPError, match="draft_memory_file"):
            check_file(bad)
    check_file(None)
    check_file(tmp_path / "memory.lp")
    with pytest.raises(LPError, match="draft_memory_file"):
        LP(str(tiny_model_dir), draft_memory_file=str(tmp_path / "missing" / "memory.lp"))


def _identity(seed: int = 0, vocab: dict | None = None) -> dict:
    """What `identity` says of a tiny model's embedding and a vocabulary."""
    model = build_tiny(seed=seed, reference=False)
    tokenizer = type("Tok", (), {"get_vocab": lambda self: vocab or {"a": 0, "b": 1}})()
    return identity(model, tokenizer)


def test_save_load_round_trip_and_refusals(tmp_path):
    memory = DraftMemory(200)
    rng = np.random.default_rng(0)
    for _ in range(12):
        memory.add(rng.integers(0, 9, 12).tolist(), rng.integers(0, 9, 30).tolist())
    me = _identity()
    path = tmp_path / "memory.lp"
    memory.save(path, me)
    assert path.exists() and not (tmp_path / "memory.lp.partial").exists()
    loaded = DraftMemory.load(path, 200, me)
    assert [t.tolist() for t in loaded.texts()] == [t.tolist() for t in memory.texts()]
    assert loaded.digest == memory.digest
    for seq in ([1, 2], [3, 4, 5], rng.integers(0, 9, 9).tolist()):
        assert _drafts(loaded, seq, 6, 4) == _drafts(memory, seq, 6, 4)
    smaller = DraftMemory.load(path, 40, me)  # the newest texts that fit
    assert 0 < smaller.tokens <= 40
    assert smaller.texts()[1].tolist() == memory.texts()[1].tolist()[-len(smaller.texts()[1]) :]

    with pytest.raises(LPError, match="another model"):
        DraftMemory.load(path, 200, _identity(seed=1))
    with pytest.raises(LPError, match="another tokenizer"):
        DraftMemory.load(path, 200, _identity(vocab={"a": 1, "b": 0}))
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a memory")
    with pytest.raises(LPError, match="not a draft memory"):
        DraftMemory.load(garbage, 200, me)
    with pytest.raises(LPError, match="not a draft memory"):
        DraftMemory.load(tmp_path / "missing", 200, me)


def test_identity_ignores_dtype():
    model = build_tiny(reference=False)
    tokenizer = type("Tok", (), {"get_vocab": lambda self: {"a": 0}})()
    assert identity(model, tokenizer) == identity(model.to(dtype=torch.bfloat16), tokenizer)


def test_decode_draws_on_memory_output_unchanged(tiny_models):
    """A prompt decoded after a decode of the same prompt: the same greedy output in far fewer
    steps with the memory, as many without; `memory=False` neither draws on it nor teaches it."""
    model = tiny_models["llama"]
    memory = DraftMemory(4096)
    dec = Decoder(Worker(model), Collective(), set(), 512, memory=memory)
    prompt = make_prompt(3, 12, 1)
    cfg = DecodeConfig(W=3, N=3, G=15, step_tokens=64, max_new_tokens=40, successors=0, pool_from_prompt=False)
    expected = reference_greedy(model, prompt, 40)
    off = dec.generate(prompt, replace(cfg, memory=False))
    assert memory.tokens == 0
    first = dec.generate(prompt, cfg)
    assert memory.tokens > 0
    second = dec.generate(prompt, cfg)
    for g in (off, first, second):
        assert g.output_ids == expected
    assert first.steps == off.steps
    assert second.steps < first.steps / 2


def test_lp_saves_at_close_loads_at_start_or_later_and_refuses_another_model(tiny_model_dir, tmp_path):
    """LP(draft_memory_file=...): saved by `close`, loaded by the next LP of the same model (its
    decodes draw on it at once) or by `load_memory` between decodes, refused by an LP of another
    model."""
    from helpers import save_word_model

    from lp import LP

    path, prompt = tmp_path / "memory.lp", [5, 6, 7, 8, 5, 6]
    settings = dict(W=3, N=3, G=15, step_tokens=64, max_new_tokens=24, successors=0)
    lm = LP(str(tiny_model_dir), draft_memory_file=str(path))
    fresh = lm.generate(prompt, **settings)
    lm.close()
    assert path.exists()
    lm = LP(str(tiny_model_dir), draft_memory_file=str(path))
    assert lm.memory.tokens > 0
    again = lm.generate(prompt, **settings)
    assert again.output_ids == fresh.output_ids and again.steps < fresh.steps
    lm.clear_memory()
    assert lm.memory.tokens == 0 and lm.generate(prompt, **settings).steps == fresh.steps
    lm.load_memory(path)  # between decodes: the saved memory back, whatever was learned since
    assert lm.generate(prompt, **settings).steps == again.steps
    lm.comm.close()
    other = save_word_model(tmp_path / "other", num_hidden_layers=3)
    with pytest.raises(LPError, match="another model"):
        LP(str(other), draft_memory_file=str(path))


def test_the_memory_learns_its_rates_across_decodes():
    """A decode's counts of the memory's drafts go to the memory at its end; the next decode's
    memory rates start from them (worth a few offers), and a saved memory keeps them."""
    from lp.lookahead.drafts import MEMORY_SOURCE, SOURCES
    from lp.lookahead.memory import MEMORY_SOURCES, SEED, learn, seed
    from lp.lookahead.rates import DraftRates

    depth, memory = 4, DraftMemory(100)
    rates = DraftRates(SOURCES, depth)
    written = seed(memory, rates, MEMORY_SOURCE, depth)
    assert np.allclose(rates.chances[MEMORY_SOURCE : MEMORY_SOURCE + MEMORY_SOURCES], 0.5)
    # three steps offer a memory draft of 2-token matches (source 2) at depth 1: never right
    labels = np.array([(MEMORY_SOURCE + 2) * depth])
    for _ in range(3):
        rates.observe(np.array([9]), np.array([-1]), labels, [])
    learn(memory, rates, MEMORY_SOURCE, depth, written)
    assert memory.rates[2, 0] == pytest.approx(1 / 5) and memory.rates[0, 0] == 0.5
    later = DraftRates(SOURCES, depth)
    seed(memory, later, MEMORY_SOURCE, depth)
    assert later.chances[MEMORY_SOURCE + 2, 0] == pytest.approx(1 / 5)
    assert later.offered[(MEMORY_SOURCE + 2) * depth] == SEED


def test_saved_rates_come_back(tmp_path):
    from lp.lookahead.drafts import MEMORY_SOURCE, SOURCES
    from lp.lookahead.memory import learn, seed
    from lp.lookahead.rates import DraftRates

    memory, depth = DraftMemory(100), 3
    rates = DraftRates(SOURCES, depth)
    written = seed(memory, rates, MEMORY_SOURCE, depth)
    rates.observe(
        np.array([9, 8]), np.array([-1, 0]), np.array([MEMORY_SOURCE * depth, MEMORY_SOURCE * depth + 1]), [9]
    )
    learn(memory, rates, MEMORY_SOURCE, depth, written)
    me = _identity()
    memory.save(tmp_path / "m", me)
    assert np.array_equal(DraftMemory.load(tmp_path / "m", 100, me).rates, memory.rates)
    assert memory.rates[0, 0] > 0.5 > memory.rates[0, 1]

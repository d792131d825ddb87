"""The draft memory (lp/lookahead/memory.py): the texts of finished decodes, bounded in two
generations, drafting what followed the text's suffix in them (checked against a brute-force
listing), saved and loaded with the model it was learned from; and a decode that draws on it:
greedy output unchanged, fewer steps where earlier texts repeat."""

from __future__ import annotations

import json
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
from lp.lookahead.successors import SuccessorTable
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
    """A decode's counts of every source go to the memory at its end; the next decode's counts start
    from them (worth what the memory counted, a few offers at most). An empty memory starts a
    decode where no memory does: the blind prior."""
    from lp.lookahead.memory import SEED, learn, seed
    from lp.lookahead.rates import PRIOR_OFFERED, DraftRates
    from lp.lookahead.sources import MEMORY_SOURCE, SOURCES

    depth, memory = 4, DraftMemory(100)
    rates, blind = DraftRates(SOURCES, depth), DraftRates(SOURCES, depth)
    written = seed(memory, rates, SuccessorTable(2, 16))
    assert np.array_equal(rates.chances, blind.chances) and np.array_equal(rates.offered, blind.offered)
    # three steps offer a memory draft of 2-token matches (source + 2) at depth 1: never right;
    # and a text draft (source 0) right at depth 1 and 2
    labels = np.array([(MEMORY_SOURCE + 2) * depth])
    for _ in range(3):
        rates.observe(np.array([9]), np.array([-1]), labels, [])
        rates.observe(np.array([5, 6]), np.array([-1, 0]), np.array([0, 1]), [5, 6])
    learn(memory, rates, SuccessorTable(2, 16), written)
    assert memory.rates[MEMORY_SOURCE + 2, 0] == pytest.approx(1 / 5) and memory.rates[0, 1] == pytest.approx(4 / 5)
    assert memory.rates[MEMORY_SOURCE, 0] == 0.5
    later = DraftRates(SOURCES, depth)
    seed(memory, later, SuccessorTable(2, 16))
    assert later.chances[MEMORY_SOURCE + 2, 0] == pytest.approx(1 / 5) and later.chances[0, 1] == pytest.approx(4 / 5)
    assert later.offered[(MEMORY_SOURCE + 2) * depth] == SEED > 5 - PRIOR_OFFERED  # at most SEED offers
    assert later.offered[MEMORY_SOURCE * depth] == PRIOR_OFFERED  # a source never counted: the blind prior
    for _ in range(12):  # texts that age the counts out, twice and more: the prior does not age
        memory.add([], list(range(30)))
    aged = DraftRates(SOURCES, depth)
    seed(memory, aged, SuccessorTable(2, 16))
    assert aged.offered[MEMORY_SOURCE * depth] == PRIOR_OFFERED and aged.hits[MEMORY_SOURCE * depth] == 1
    assert 1 / 5 < aged.chances[MEMORY_SOURCE + 2, 0] < 1 / 2  # the counts halved, not the prior


def _table_counting(ranks: list[int], k: int = 2) -> SuccessorTable:
    """A table whose committed tokens were these ranks of their predecessor's row (k: none)."""
    table = SuccessorTable(k, 16)
    table.update(np.array([[t, 10, 11] for t in range(8)]), np.full(8, -1), -1)  # after token t: 10, 11
    for r in ranks:
        table.observe([0, 1, 10 + r])  # 10 + k: neither successor
    return table


def test_a_new_table_starts_from_the_ranks_the_memory_counted():
    """The successor table's rank counts go to the memory too; a new table starts in the shares
    the memory counted (its own prior's weight, one count a rank and one for none)."""
    from lp.lookahead.memory import learn, seed
    from lp.lookahead.rates import DraftRates
    from lp.lookahead.sources import SOURCES

    memory, rates = DraftMemory(100), DraftRates(SOURCES, 2)
    fresh, wide = SuccessorTable(2, 16), SuccessorTable(8, 16)
    written = seed(memory, rates, fresh)
    seed(memory, rates, wide)
    assert fresh.hits.tolist() == [1] * 3 and wide.hits.tolist() == [1] * 9  # an empty memory: the table's own prior
    table = _table_counting([0] * 6 + [1] * 2 + [2] * 1)
    learn(memory, rates, table, (written[0], np.ones(3)))
    assert np.array_equal(memory.ranks[:, :2], [[6, 2], [9, 3]])
    later = SuccessorTable(2, 16)
    seed(memory, rates, later)
    assert np.allclose(later.hits, [3 * 7 / 12, 3 * 3 / 12, 3 * 2 / 12])
    wider = SuccessorTable(3, 16)  # a rank the memory never counted shares what the others leave
    seed(memory, rates, wider)
    assert np.allclose(wider.hits, [28 / 13, 12 / 13, 6 / 13, 6 / 13])  # what ranks 0 and 1 leave, split evenly


def test_saved_rates_come_back(tmp_path):
    from lp.lookahead.memory import learn, seed
    from lp.lookahead.rates import DraftRates
    from lp.lookahead.sources import MEMORY_SOURCE, SOURCES

    memory, depth = DraftMemory(100), 3
    rates, table = DraftRates(SOURCES, depth), SuccessorTable(2, 16)
    written = seed(memory, rates, table)
    rates.observe(
        np.array([9, 8]), np.array([-1, 0]), np.array([MEMORY_SOURCE * depth, MEMORY_SOURCE * depth + 1]), [9]
    )
    learn(memory, rates, _table_counting([0, 0, 1]), (written[0], np.ones(3)))
    me = _identity()
    memory.save(tmp_path / "m", me)
    loaded = DraftMemory.load(tmp_path / "m", 100, me)
    assert np.array_equal(loaded.rates, memory.rates) and np.array_equal(loaded.ranks, memory.ranks)
    assert memory.rates[MEMORY_SOURCE, 0] > 0.5 > memory.rates[MEMORY_SOURCE, 1] and memory.ranks[0, 0] == 2


def test_a_file_of_another_version_is_refused(tmp_path):
    memory, me = DraftMemory(100), _identity()
    memory.save(tmp_path / "m", me)
    with np.load(tmp_path / "m") as f:
        arrays = {key: f[key] for key in f.files if key != "ranks"}
    meta = json.loads(str(arrays["meta"]))
    arrays["meta"] = np.asarray(json.dumps({**meta, "version": meta["version"] - 1}))
    with open(tmp_path / "old", "wb") as f:
        np.savez_compressed(f, **arrays)
    with pytest.raises(LPError, match="^draft_memory_file=.*: version 1, lp reads version 2$"):
        DraftMemory.load(tmp_path / "old", 100, me)


def test_ranks_check_the_counts_as_well_as_the_texts():
    """Two memories of the same texts but other counts (files learned apart) would draw other trees
    on the ranks: their fingerprints differ; memories fed alike match."""
    from lp.lookahead.memory import learn, seed
    from lp.lookahead.rates import DraftRates
    from lp.lookahead.sources import SOURCES

    a, b, c = DraftMemory(100), DraftMemory(100), DraftMemory(100)
    for m in (a, b, c):
        m.add([1, 2], [3, 4, 5])
    assert a.digest == b.digest == c.digest and a.fingerprint == b.fingerprint == c.fingerprint
    for m in (a, b):
        rates = DraftRates(SOURCES, 2)
        written = seed(m, rates, SuccessorTable(2, 16))
        rates.observe(np.array([9]), np.array([-1]), np.array([0]), [9])
        learn(m, rates, SuccessorTable(2, 16), written)
    assert a.digest == c.digest and a.fingerprint == b.fingerprint != c.fingerprint

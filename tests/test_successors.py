"""The successor table (recycled drafts): last row wins, hit rates, best-first growth of a tree."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from lp.config import DecodeConfig
from lp.decode.drafter import Drafter
from lp.lookahead.successors import SuccessorTable, apply, pair_key, rates, reserve, stage
from lp.lookahead.tree import build_tree
from tests.reference_grow import Grown, lp_grow


def rows(*r: tuple[int, ...]) -> np.ndarray:
    return np.asarray(r, dtype=np.int64)


def known(table: SuccessorTable, vocab: int = 10) -> dict[int, list[int]]:
    """The one-token rows the table has."""
    return {t: table.row(-1, t) for t in range(vocab) if table.row(-1, t) is not None}


def test_update_keeps_each_tokens_last_row():
    table = SuccessorTable(2, 10)
    table.update(rows((3, 1, 2), (6, 1, 1), (3, 4, 5)))
    table.update(rows((6, 7, 8)))
    assert known(table) == {3: [4, 5], 6: [7, 8]}


def test_update_matches_applying_every_row_in_order():
    """Random batches (tokens repeating, growing past the scratch's size, empty) against the
    definition: each row in turn overwrites its token's."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        table, model = SuccessorTable(3, 80), {}
        for _ in range(4):
            batch = rng.integers(0, rng.integers(1, 80), size=(rng.integers(0, 30), 4))
            table.update(batch)
            model.update((r[0], r[1:]) for r in batch.tolist())
            assert known(table, 80) == model


def test_observe_counts_the_rank_each_token_had():
    table = SuccessorTable(3, 10)
    table.update(rows((1, 2, 3, 4), (2, 5, 6, 7)))
    table.observe([0, 1, 3, 0])  # 3 was rank 1 after 1; 0 follows unseen 3: not counted
    table.observe([0, 2, 9])  # 9 is none of 2's successors
    assert table.hits.tolist() == [1, 2, 1, 2]
    q = rates(table)
    assert (np.diff(q) <= 0).all() and q[0] == pytest.approx(1 / 6)  # made non-increasing


def test_rows_with_the_token_before_them_are_preferred():
    """A row whose input's predecessor is known goes to `pairs` too; tree growth and the hit
    counts read it where the two tokens match, the one-token row elsewhere."""
    table = SuccessorTable(2, 10)
    table.update(rows((3, 1, 2), (3, 4, 5)), first=pair_key(7, 3))
    assert known(table) == {3: [4, 5]} and table.n_pairs == 1
    assert table.row(7, 3) == [1, 2] and table.row(6, 3) == [4, 5] and table.row(7, 1) is None
    table.observe([7, 3, 2, 6, 3, 4])  # 2: rank 1 after (7, 3); 4: rank 0 after 3
    assert table.hits.tolist() == [2, 2, 1]
    assert paths(lp_grow(2, [7, 3], 1, table=table)) == [(1,), (2,)]


def test_pair_rows_survive_the_table_growing():
    """Thousands of pair rows (the hash table doubles many times): each key finds its last row."""
    rng = np.random.default_rng(1)
    table, model = SuccessorTable(2, 50), {}
    for _ in range(40):
        batch = np.concatenate([rng.integers(0, 50, (100, 1)), rng.integers(0, 50, (100, 2))], axis=1)
        keys = rng.integers(0, 50, 100) << 32 | batch[:, 0]
        table.update(batch, keys)
        model.update(zip(keys.tolist(), batch[:, 1:].tolist()))
    assert table.n_pairs == len(model) > 1000
    assert all(table.row(key >> 32, key & 0xFFFFFFFF) == row for key, row in model.items())


@pytest.mark.parametrize("seed", range(20))
def test_staged_rows_read_as_written(seed):
    """Rows staged (as a step's compiled observe stages them) read as `update` would leave the
    table, for every (before, token), in a growth and in the hit counts, until `apply` writes
    them: the same table."""
    rng = np.random.default_rng(seed)
    vocab, k = int(rng.integers(3, 12)), int(rng.integers(1, 4))
    written, staged = SuccessorTable(k, vocab), SuccessorTable(k, vocab)

    def batch() -> tuple[np.ndarray, np.ndarray, int]:
        n = int(rng.integers(0, 12))
        rows_ = rng.integers(0, vocab, (n, 1 + k))
        m = int(rng.integers(0, n + 1))
        keys = rng.integers(0, vocab, m) << 32 | rows_[n - m :, 0]
        first = pair_key(int(rng.integers(vocab)), int(rows_[0, 0]) if n else 0) if rng.integers(2) else -1
        return rows_, keys, first

    for _ in range(4):
        rows_, keys, first = batch()
        for table in (written, staged):
            table.update(rows_, keys, first)
        rows_, keys, first = batch()
        written.update(rows_, keys, first)
        reserve(staged, len(rows_))
        stage(staged, np.ascontiguousarray(rows_, np.int64), np.asarray(keys, np.int64), first)
        pairs = [(b, t) for b in range(-1, vocab) for t in range(vocab)]
        assert [staged.row(b, t) for b, t in pairs] == [written.row(b, t) for b, t in pairs]
        for x0 in range(vocab):
            for text in ([x0], [0, x0], [x0, x0]):
                assert paths(lp_grow(12, text, 3, table=staged)) == paths(lp_grow(12, text, 3, table=written))
        tokens = rng.integers(0, vocab, 8)
        staged.observe(tokens)
        written.observe(tokens)
        assert np.array_equal(staged.hits, written.hits)
        apply(staged)
        for got, want in zip(_arrays(staged), _arrays(written)):
            assert np.array_equal(got, want)
        assert staged.n_pairs == written.n_pairs and (_stage(staged) == -1).all() and not _staged(staged)


@njit
def _arrays(table: SuccessorTable) -> tuple[np.ndarray, np.ndarray]:
    return table.table.copy(), table.pairs[: table.n_pairs].copy()


@njit
def _stage(table: SuccessorTable) -> np.ndarray:
    return table.stage.copy()


@njit
def _staged(table: SuccessorTable) -> int:
    return len(table.staged)


def paths(grown: Grown) -> list[tuple[int, ...]]:
    """Each node's token path from x0, in the order the nodes were grown."""
    tree, made = grown.tree, np.argsort(grown.order)
    out: dict[int, tuple[int, ...]] = {}
    for v in made.tolist():
        p = tree.parents[v]
        out[v] = (out[p] if p >= 0 else ()) + (int(tree.tokens[v]),)
    return [out[v] for v in made.tolist()]


def test_growth_takes_the_likeliest_paths_best_first():
    table = SuccessorTable(2, 10)
    table.update(rows((1, 2, 3), (2, 4, 5), (3, 6, 7), (4, 8, 9)))
    table.hits[:] = [6, 3, 1]  # rates 0.6 and 0.3
    # chances: (2) .6, (2,4) .36, (3) .3, (2,4,8) .216, then (2,5) and (3,6) .18
    assert paths(lp_grow(4, [1], 3, table=table)) == [(2,), (2, 4), (3,), (2, 4, 8)]
    assert paths(lp_grow(3, [1], 1, table=table)) == [(2,), (3,)]  # depth 1: only x0's successors
    assert lp_grow(5, [7], 3, table=table).tree.size == 0  # 7 was never an input row


def random_successors(seed: int, vocab: int = 50, k: int = 4) -> np.ndarray:
    """Each token's k successors: distinct, as a top-k is."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(vocab)[:k] for _ in range(vocab)])


def random_table(seed: int, vocab: int = 50, k: int = 4) -> SuccessorTable:
    table = SuccessorTable(k, vocab)
    table.update(np.concatenate([np.arange(vocab)[:, None], random_successors(seed, vocab, k)], axis=1))
    table.hits[:] = np.random.default_rng(seed + 100).integers(1, 20, k + 1)
    return table


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [7, 30])
def test_growth_is_best_first_among_all_paths(seed, budget):
    """The grown nodes are the `budget` likeliest paths of at most `depth` tokens (a brute-force
    enumeration), and the tree is the one inserting their paths in that order gives."""
    table = random_table(seed)
    q, depth = rates(table), 3
    chances: dict[tuple[int, ...], float] = {}

    def walk(path: tuple[int, ...], token: int, chance: float) -> None:
        for r, nxt in enumerate(table.row(-1, token)):
            chances[path + (nxt,)] = chance * q[r]
            if len(path) + 1 < depth:
                walk(path + (nxt,), nxt, chance * q[r])

    walk((), 3, 1.0)
    grown = lp_grow(budget, [3], depth, table=table)
    got = paths(grown)
    assert len(got) == budget == len(set(got))
    assert min(chances[p] for p in got) >= sorted(chances.values(), reverse=True)[budget - 1]
    want = build_tree(got, budget)
    tree = grown.tree
    assert tree.tokens.tolist() == want.tokens.tolist() and tree.parents == want.parents


@pytest.mark.parametrize("seed", range(4))
def test_unshared_trees_take_the_recycled_leaf_paths_as_chains(seed):
    """Without sharing, the budget's likeliest recycled nodes come as the chains of their paths
    to the leaves, after the drafts (a path that is a prefix of another is no chain of its own)."""
    table, budget = random_table(seed), 12
    nodes = paths(lp_grow(budget, [5, 3], 4, table=table))
    leaves = [p for p in nodes if not any(q[: len(p)] == p and q != p for q in nodes)]
    cfg = DecodeConfig(N=3, G=1, tree=False, draft_len=4, tree_tokens=budget, successors=4)
    drafter = Drafter(cfg, [5, 3], vocab=50)
    drafter.table.update(np.concatenate([np.arange(50)[:, None], random_successors(seed)], axis=1))
    drafter.table.hits[:] = table.hits
    drafter.pool.add(3, (7, 8))
    got = drafter._unshared_tree(np.asarray([3]))
    want = build_tree([(7, 8), *leaves], budget, share=False)
    assert got.tokens.tolist() == want.tokens.tolist() and got.parents == want.parents


def test_rows_of_tokens_outside_the_vocabulary_are_refused():
    table = SuccessorTable(2, 10)
    for token in (10, -1):
        with pytest.raises(ValueError, match="vocabulary"):
            table.update(rows((3, 1, 2), (token, 4, 5)))
    assert table.row(-1, -1) is None and table.row(-1, 10) is None


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="successors"):
        SuccessorTable(0, 10)

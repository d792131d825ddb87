"""The successor table (recycled drafts): last row wins, hit rates, best-first growth of a tree."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import TreeBuilder, build_tree, pair_key


def rows(*r: tuple[int, ...]) -> np.ndarray:
    return np.asarray(r, dtype=np.int64)


def test_update_keeps_each_tokens_last_row():
    table = SuccessorTable(2)
    table.update(rows((3, 1, 2), (6, 1, 1), (3, 4, 5)))
    table.update(rows((6, 7, 8)))
    assert table.next == {3: [4, 5], 6: [7, 8]}


def test_update_matches_applying_every_row_in_order():
    """Random batches (tokens repeating, growing past the scratch's size, empty) against the
    definition: each row in turn overwrites its token's."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        table, model = SuccessorTable(3), {}
        for _ in range(4):
            batch = rng.integers(0, rng.integers(1, 80), size=(rng.integers(0, 30), 4))
            table.update(batch)
            model.update((r[0], r[1:]) for r in batch.tolist())
            assert table.next == model


def test_observe_counts_the_rank_each_token_had():
    table = SuccessorTable(3)
    table.update(rows((1, 2, 3, 4), (2, 5, 6, 7)))
    table.observe([0, 1, 3, 0])  # 3 was rank 1 after 1; 0 follows unseen 3: not counted
    table.observe([0, 2, 9])  # 9 is none of 2's successors
    assert table.hits == [1, 2, 1, 2]
    q = table.rates()
    assert (np.diff(q) <= 0).all() and q[0] == pytest.approx(1 / 6)  # made non-increasing


def test_rows_with_the_token_before_them_are_preferred():
    """A row whose input's predecessor is known goes to `pairs` too; tree growth and the hit
    counts read it where the two tokens match, the one-token row elsewhere."""
    table = SuccessorTable(2)
    table.update(rows((3, 1, 2), (3, 4, 5)), first=pair_key(7, 3))
    assert table.next == {3: [4, 5]} and table.pairs == {pair_key(7, 3): [1, 2]}
    assert table.row(7, 3) == [1, 2] and table.row(6, 3) == [4, 5] and table.row(7, 1) is None
    table.observe([7, 3, 2, 6, 3, 4])  # 2: rank 1 after (7, 3); 4: rank 0 after 3
    assert table.hits == [2, 2, 1]
    builder = TreeBuilder(2)
    table.grow(builder, 3, 1, before=7)
    assert builder.tokens == [1, 2]


def grown(table: SuccessorTable, x0: int, budget: int, depth: int, drafts=()) -> TreeBuilder:
    """A builder holding `drafts`, then grown from x0 through the table."""
    builder = TreeBuilder(budget)
    for draft in drafts:
        builder.add(draft)
    table.grow(builder, x0, depth)
    return builder


def paths(builder: TreeBuilder) -> list[tuple[int, ...]]:
    """Each node's token path from x0, in insertion order."""
    out: list[tuple[int, ...]] = []
    for p, tok in zip(builder.parents, builder.tokens):
        out.append((out[p] if p >= 0 else ()) + (tok,))
    return out


def test_growth_takes_the_likeliest_paths_best_first():
    table = SuccessorTable(2)
    table.update(rows((1, 2, 3), (2, 4, 5), (3, 6, 7), (4, 8, 9)))
    table.hits[:] = [6, 3, 1]  # rates 0.6 and 0.3
    # chances: (2) .6, (2,4) .36, (3) .3, (2,4,8) .216, then (2,5) and (3,6) .18
    assert paths(grown(table, 1, 4, depth=3)) == [(2,), (2, 4), (3,), (2, 4, 8)]
    assert paths(grown(table, 1, 3, depth=1)) == [(2,), (3,)]  # depth 1: only x0's successors
    assert grown(table, 7, 5, depth=3).size == 0  # 7 was never an input row
    # a node the drafts made is free, and grown on
    assert paths(grown(table, 1, 3, depth=3, drafts=[(2, 4)])) == [(2,), (2, 4), (3,)]


def random_table(seed: int, vocab: int = 50, k: int = 4) -> SuccessorTable:
    rng = np.random.default_rng(seed)
    table = SuccessorTable(k)
    successors = np.stack([rng.permutation(vocab)[:k] for _ in range(vocab)])  # distinct, as a top-k is
    table.update(np.concatenate([np.arange(vocab)[:, None], successors], axis=1))
    table.hits[:] = rng.integers(1, 20, k + 1).tolist()
    return table


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [7, 30])
def test_growth_is_best_first_among_all_paths(seed, budget):
    """The grown nodes are the `budget` likeliest paths of at most `depth` tokens (a brute-force
    enumeration), and the tree is the one inserting their paths in that order gives."""
    table = random_table(seed)
    q, depth = table.rates(), 3
    chances: dict[tuple[int, ...], float] = {}

    def walk(path: tuple[int, ...], token: int, chance: float) -> None:
        for r, nxt in enumerate(table.next[token]):
            chances[path + (nxt,)] = chance * q[r]
            if len(path) + 1 < depth:
                walk(path + (nxt,), nxt, chance * q[r])

    walk((), 3, 1.0)
    builder = grown(table, 3, budget, depth)
    got = paths(builder)
    assert len(got) == budget == len(set(got))
    assert min(chances[p] for p in got) >= sorted(chances.values(), reverse=True)[budget - 1]
    want = build_tree(got, budget)
    tree = builder.tree()
    assert tree.tokens.tolist() == want.tokens.tolist() and tree.parents == want.parents


def reference_growth(builder: TreeBuilder, x0: int, table: SuccessorTable, depth: int) -> list[tuple[int, ...]]:
    """The token paths `grow` adds, from one heap keyed (-chance, arrival): equal chances in the
    order their paths were offered, a taken path offering its next sibling, then its first child."""
    q, have = table.rates(), set(paths(builder))
    heap, order, added = [(-q[0], 0, (), 0)], 1, []
    while heap and x0 in table.next:
        neg, _, above, r = heapq.heappop(heap)
        path = above + (table.next[above[-1] if above else x0][r],)
        if path not in have:
            if builder.size + len(added) >= builder.budget:
                break
            added.append(path)
        if r + 1 < table.k:
            heapq.heappush(heap, (neg / q[r] * q[r + 1], order, above, r + 1))
            order += 1
        if len(path) < depth and path[-1] in table.next:
            heapq.heappush(heap, (neg * q[0], order, path, 0))
            order += 1
    return added


@pytest.mark.parametrize("seed", range(40))
def test_growth_orders_equal_chances_by_arrival(seed):
    """Tied rates (the pseudo-counts' start, a decode's plateaus), tokens without a row, drafts
    grown on: the nodes come exactly as one (-chance, arrival) heap takes them."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    vocab = int(rng.integers(k, 30))
    table = SuccessorTable(k)
    known = np.flatnonzero(rng.random(vocab) < 0.8)  # the others have no row
    table.update(np.array([[t, *rng.permutation(vocab)[:k]] for t in known], dtype=np.int64).reshape(-1, k + 1))
    table.hits[:] = rng.choice([1, 1, 2, 3, 5], k + 1).tolist()
    builder = TreeBuilder(int(rng.integers(0, 120)))
    for _ in range(int(rng.integers(0, 5))):
        builder.add(rng.integers(0, vocab, int(rng.integers(1, 5))).tolist())
    x0, depth = int(rng.integers(vocab)), int(rng.integers(1, 6))
    before = paths(builder)
    want = reference_growth(builder, x0, table, depth)
    table.grow(builder, x0, depth)
    assert paths(builder) == before + want


def test_drafts_come_before_growth_and_growth_once():
    table = random_table(0)
    builder = grown(table, 3, 10, 3)
    with pytest.raises(ValueError, match="before the tree is grown"):
        builder.add([1, 2])
    with pytest.raises(ValueError, match="grown once"):
        table.grow(builder, 3, 3)


@pytest.mark.parametrize("seed", range(4))
def test_unshared_trees_take_the_recycled_leaf_paths_as_chains(seed):
    """Without sharing, the budget's likeliest recycled nodes come as the chains of their paths
    to the leaves, after the drafts (a path that is a prefix of another is no chain of its own)."""
    from lp.config import DecodeConfig
    from lp.decode.policy import step_builder
    from lp.lookahead.drafts import TextIndex
    from lp.lookahead.pool import NGramPool

    table, budget = random_table(seed), 12
    pool = NGramPool(3, 4)
    pool.add(3, (7, 8))
    nodes = paths(grown(table, 3, budget, depth=4))
    leaves = [p for p in nodes if not any(q[: len(p)] == p and q != p for q in nodes)]
    got = step_builder(DecodeConfig(N=3, G=1, tree=False, draft_len=4), budget, pool, TextIndex([5, 3]), table).tree()
    want = build_tree([(7, 8), *leaves], budget, share=False)
    assert got.tokens.tolist() == want.tokens.tolist() and got.parents == want.parents


def test_growth_needs_sharing():
    table = random_table(0)
    assert grown(table, 3, 10, 3).size == 10
    builder = TreeBuilder(10, share=False)
    table.grow(builder, 3, 3)
    assert builder.size == 0


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="successors"):
        SuccessorTable(0)

"""The successor table (recycled drafts): last row wins, hit rates, best-first paths."""
from __future__ import annotations

import numpy as np
import pytest

from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import build_tree


def rows(*r: tuple[int, ...]) -> np.ndarray:
    return np.asarray(r, dtype=np.int64)


def test_update_keeps_each_tokens_last_row_and_skips_padding():
    table = SuccessorTable(10, 2)
    table.update(rows((3, 1, 2), (-1, -1, -1), (3, 4, 5), (6, 7, 8)))
    assert table.next[3].tolist() == [4, 5] and table.next[6].tolist() == [7, 8]
    assert table.next[1].tolist() == [-1, -1]


def test_observe_counts_the_rank_each_token_had():
    table = SuccessorTable(10, 3)
    table.update(rows((1, 2, 3, 4), (2, 5, 6, 7)))
    table.observe(np.asarray([1, 3, 0]))  # 3 was rank 1 after 1; 0 follows unseen 3: not counted
    table.observe(np.asarray([2, 9]))  # 9 is none of 2's successors
    assert table.hits.tolist() == [1, 2, 1, 2]
    q = table.rates()
    assert (np.diff(q) <= 0).all() and q[0] == pytest.approx(1 / 6)  # made non-increasing


def paths(nodes: tuple[list[int], list[int]]) -> list[tuple[int, ...]]:
    """Each node's token path from x0."""
    out: list[tuple[int, ...]] = []
    for p, tok in zip(*nodes):
        out.append((out[p] if p >= 0 else ()) + (tok,))
    return out


def test_drafts_are_the_likeliest_paths_best_first():
    table = SuccessorTable(20, 2)
    table.update(rows((1, 2, 3), (2, 4, 5), (3, 6, 7), (4, 8, 9)))
    table.hits[:] = [6, 3, 1]  # rates 0.6 and 0.3
    # chances: (2) .6, (2,4) .36, (3) .3, (2,4,8) .216, then (2,5) and (3,6) .18
    assert table.drafts(1, 4, depth=3) == ([-1, 0, -1, 1], [2, 4, 3, 8])
    assert paths(table.drafts(1, 3, depth=1)) == [(2,), (3,)]  # depth 1: only x0's successors
    assert table.drafts(7, 5, depth=3) == ([], [])  # 7 was never an input row


def random_table(seed: int, vocab: int = 50, k: int = 4) -> SuccessorTable:
    rng = np.random.default_rng(seed)
    table = SuccessorTable(vocab, k)
    successors = np.stack([rng.permutation(vocab)[:k] for _ in range(vocab)])  # distinct, as a top-k is
    table.update(np.concatenate([np.arange(vocab)[:, None], successors], axis=1))
    table.hits[:] = rng.integers(1, 20, k + 1)
    return table


def test_drafts_make_a_tree_of_one_node_each():
    nodes = random_table(0).drafts(0, 40, depth=6)
    assert len(nodes[0]) == 40 and all(p < i for i, p in enumerate(nodes[0]))
    assert max(map(len, paths(nodes))) <= 6
    assert build_tree([], 40, grafts=nodes).size == 40


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [7, 30])
def test_grafting_nodes_is_inserting_their_paths(seed, budget):
    """build_tree's grafts give the tree that inserting each node's path after the drafts
    gives, on the trees' shared prefixes and at the budget's cut."""
    table = random_table(seed)
    nodes = table.drafts(3, budget, depth=5)
    drafts = [paths(table.drafts(3, 6, depth=3))[-1], (7, 8, 9)]
    want = build_tree(drafts + paths(nodes), budget)
    got = build_tree(drafts, budget, grafts=nodes)
    assert got.tokens.tolist() == want.tokens.tolist() and got.parents == want.parents
    # without sharing, the grafts' leaves become chains of their own
    leaves = [p for p in paths(nodes) if not any(q[:len(p)] == p and q != p for q in paths(nodes))]
    chains = build_tree(drafts + leaves, budget, share=False)
    unshared = build_tree(drafts, budget, share=False, grafts=nodes)
    assert unshared.tokens.tolist() == chains.tokens.tolist() and unshared.parents == chains.parents


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="successors"):
        SuccessorTable(10, 0)

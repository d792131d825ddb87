"""The verification tree (lp/lookahead/tree.py) and the text drafts (lp/lookahead/drafts.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import chains

from lp.lookahead.text import MAX_MATCH, MIN_MATCH, TextIndex
from lp.lookahead.tree import TreeBuilder, build_tree


def paths(tree) -> set[tuple[int, ...]]:
    """Every root-to-node token path of a tree."""
    out = set()
    for i in range(tree.size):
        path, j = [], i
        while j >= 0:
            path.append(int(tree.tokens[j]))
            j = tree.parents[j]
        out.add(tuple(reversed(path)))
    return out


def test_trie_shares_prefixes_and_keeps_every_draft():
    drafts = [(1, 2, 3), (1, 2, 4), (5, 6), (1, 7), (5, 6, 8)]
    tree = build_tree(drafts, budget=100)
    assert tree.size == 8  # 1 2 3 4 7 | 5 6 8
    assert all(d in paths(tree) for d in drafts)
    assert all(p < i for i, p in enumerate(tree.parents))
    assert tree.groups() == (5, 3)  # root subtrees, first-seen order
    assert tree.depth.tolist() == [1, 2, 3, 3, 2, 1, 2, 3]


def test_unshared_chains_and_groups_by_first_token():
    drafts = [(1, 2), (5, 6), (1, 3)]
    tree = build_tree(drafts, budget=100, share=False)
    assert tree.size == 6
    assert tree.tokens[tree.roots].tolist() == [1, 1, 5]  # same first token: adjacent
    assert tree.groups() == (4, 2)


def test_budget_takes_drafts_in_rank_order_and_truncates_the_last():
    drafts = [(1, 2, 3), (4, 5, 6), (1, 2, 9)]
    tree = build_tree(drafts, budget=5)
    assert paths(tree) == {(1,), (1, 2), (1, 2, 3), (4,), (4, 5)}
    # the shared prefix costs nothing: the third draft's new node fits where a chain would not
    tree = build_tree([(1, 2, 3), (1, 2, 9), (4, 5, 6)], budget=5)
    assert paths(tree) == {(1,), (1, 2), (1, 2, 3), (1, 2, 9), (4,)}
    assert build_tree(drafts, budget=0).size == 0


def test_slice_keeps_whole_subtrees_only():
    tree = build_tree([(1, 2, 3), (4, 5), (6,)], budget=100)
    part = tree.slice(3, 5)
    assert part.tokens.tolist() == [4, 5] and part.parents == (-1, 0)
    with pytest.raises(ValueError):
        tree.slice(1, 4)


def test_chains_layout():
    tree = chains(np.array([[1, 2], [3, 4]]))
    assert tree.parents == (-1, 0, -1, 2) and tree.tokens.tolist() == [1, 2, 3, 4]


def text_drafts(tokens, length: int, count: int) -> list[tuple[int, ...]]:
    return TextIndex(tokens).drafts(length, count)


def test_text_drafts_continue_the_longest_suffix_match():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    text = [7, 1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    # suffix (1, 2, 3) occurred at 1..3 (then 4, 9, ...); (2, 3) also at 6..7 (then 5, 6)
    got = text_drafts(text, length=3, count=4)
    assert got[0] == (4, 9, 2) and got[1] == (5, 6, 1)
    assert text_drafts(text, length=3, count=1) == [(4, 9, 2)]
    # a lone token match (x0 only) is a source of its own (prompt lookup's fallback), from a `lone` index
    assert text_drafts([3, 8, 4, 3], length=2, count=4) == []
    assert TextIndex([3, 8, 4, 3]).lone_drafts(2, 4) == []
    assert TextIndex([3, 8, 4, 3], lone=True).lone_drafts(2, 4) == [(8, 4)]
    index = TextIndex([3, 8, 5, 8, 3, 8], lone=True)
    assert index.drafts(1, 4) == [(5,)] and index.lone_drafts(1, 4) == [(3,)]  # (3, 8) at 0..1; 8 alone at 3
    assert text_drafts([5], length=2, count=4) == []
    assert TextIndex(text, indexed=False).drafts(3, 4) == []


def scanned_drafts(tokens: list[int], length: int, count: int, lone: bool = False) -> list[tuple[int, ...]]:
    """The definition, by brute force: every earlier position that ends a match of at least
    MIN_MATCH suffix tokens (`lone`: of exactly one), by longest match (capped at MAX_MATCH),
    then most recent."""
    n = len(tokens)

    def match(e: int) -> int:
        m = 0
        while m < min(MAX_MATCH, e + 1) and tokens[e - m] == tokens[n - 1 - m]:
            m += 1
        return m

    ends = sorted(
        (e for e in range(n - 1) if (match(e) == 1 if lone else match(e) >= MIN_MATCH)), key=lambda e: (-match(e), -e)
    )
    out = dict.fromkeys(tuple(tokens[e + 1 : e + 1 + length]) for e in ends)
    return list(out)[:count]


@pytest.mark.parametrize("lone", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_text_index_extended_step_by_step_equals_a_scan(seed, lone):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))  # few tokens: long, overlapping matches
    tokens = rng.integers(0, vocab, int(rng.integers(1, 60))).tolist()
    index = TextIndex(tokens[:5], lone=lone)
    for end in range(5, len(tokens) + 1):
        index.extend(tokens[len(index.tokens) : end])
        length, count = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        assert index.drafts(length, count) == scanned_drafts(tokens[:end], length, count)
        assert index.lone_drafts(length, count) == (scanned_drafts(tokens[:end], length, count, True) if lone else [])


def test_builder_insertion_order_within_subtrees():
    builder = TreeBuilder(100)
    for draft in [(1, 2, 3), (4,), (1, 5), (4, 6)]:
        builder.add(draft)
    tree = builder.tree()
    # root 1's subtree first (its nodes in insertion order: 1, 2, 3, 5), then root 4's
    assert tree.tokens.tolist() == [1, 2, 3, 5, 4, 6] and tree.parents == (-1, 0, 1, 0, -1, 4)


@pytest.mark.parametrize("share", [True, False])
def test_builder_groups_are_runs_of_root_subtrees_with_one_first_token(share):
    """The groups a tree reports (handed over by the builder when sharing) are the node counts
    of the runs of adjacent root subtrees that start with the same token."""
    rng = np.random.default_rng(0)
    drafts = [tuple(rng.integers(0, 4, rng.integers(1, 5)).tolist()) for _ in range(30)]
    tree = build_tree(drafts, budget=40, share=share)
    assert all(p < i for i, p in enumerate(tree.parents))
    runs: list[list[int]] = []  # [first token, nodes] per run, counted by walking the nodes
    for i, p in enumerate(tree.parents):
        if p < 0 and (not runs or runs[-1][0] != tree.tokens[i]):
            runs.append([int(tree.tokens[i]), 0])
        runs[-1][1] += 1
    assert tree.groups() == tuple(n for _, n in runs)
    assert len({t for t, _ in runs}) == len(runs)  # one run per first token: they are adjacent

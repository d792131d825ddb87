"""Shares that fill their buckets (lp/decode/shares.py, lp/partition.py `search_split`): a greedy
step's tree cut anywhere in pre-order over P ranks, each rank feeding its first node's ancestors
again, against plain references (tests/reference_plan.py) and brute force; the tree cut to its
first-grown nodes where P shares of the cap cannot hold it."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import reference_plan

from lp.config import DecodeConfig
from lp.decode.plan import Split, StepPlan, lay_out_step, plan_step
from lp.decode.shares import (
    TREE_ROOM,
    first_grown,
    fitted,
    fitted_size,
    preorder,
    rank_nodes,
    reordered,
    share_cap,
    window_share,
)
from lp.lookahead.tree import DraftTree
from lp.partition import search_split


def random_tree(rng: random.Random, n: int) -> tuple[int, ...]:
    """Parents of a random tree of n nodes (each parent before its child), often deep and narrow."""
    return tuple(-1 if v == 0 or not rng.randrange(6) else rng.randrange(max(0, v - 3), v) for v in range(n))


def brute_force(W: int, N: int, depth: list[int], P: int) -> int:
    """The least largest share over every way to cut columns, then nodes, into P runs."""
    n, best = len(depth), None
    for col_cuts in itertools.combinations_with_replacement(range(W + 1), P - 1):
        cols = (0, *col_cuts, W)
        for node_cuts in itertools.combinations_with_replacement(range(n + 1), P - 1):
            nodes = (0, *node_cuts, n)
            shares = [(cols[r], cols[r + 1], nodes[r], nodes[r + 1]) for r in range(P)]
            worst = max(reference_plan.split_cost(W, N, depth, x) for x in shares)
            best = worst if best is None else min(best, worst)
    return best


def test_preorder_and_depths_equal_the_reference():
    rng = random.Random(0)
    for _ in range(300):
        parents = random_tree(rng, rng.randrange(0, 40))
        order = preorder(np.asarray(parents, np.int64))
        assert order.tolist() == reference_plan.preorder(parents)
        ordered, depth = reordered(np.asarray(parents, np.int64), order)
        assert (ordered.tolist(), depth.tolist()) == tuple(map(list, reference_plan.in_order(parents, list(order))))


def test_split_search_covers_everything_once_and_balances():
    """Every column and node on one rank, in order; the largest share is the least limit the plain
    fill meets, and never far above the brute-force optimum (the fill is greedy)."""
    rng = random.Random(1)
    above = 0
    for _ in range(400):
        W, N, P = rng.choice([0, 1, 3]), rng.choice([2, 3]), rng.randint(2, 3)
        parents = random_tree(rng, rng.randrange(0, 9))
        depth = reference_plan.in_order(parents, reference_plan.preorder(parents))[1]
        bounds = search_split(W, N, np.asarray(depth, np.int64), P, 10**6).tolist()
        assert [j for a, b, _, _ in bounds for j in range(a, b)] == list(range(W))
        assert [v for _, _, c, d in bounds for v in range(c, d)] == list(range(len(depth)))
        worst = max(reference_plan.split_cost(W, N, depth, x) for x in bounds)
        least = next(L for L in range(1, 100) if reference_plan.split_fill(W, N, depth, P, L) is not None)
        assert worst == least and reference_plan.split_fill(W, N, depth, P, least) == [tuple(x) for x in bounds]
        optimum = brute_force(W, N, depth, P)
        assert optimum <= worst <= optimum + 2
        above += worst > optimum
    assert above < 40  # the greedy fill is the optimum nearly always


def test_a_cap_the_fill_meets_bounds_the_shares():
    rng = random.Random(2)
    for _ in range(200):
        parents = random_tree(rng, rng.randrange(10, 60))
        depth = reference_plan.in_order(parents, reference_plan.preorder(parents))[1]
        cap = rng.randrange(max(depth) + 4, 40)
        bounds = search_split(3, 3, np.asarray(depth, np.int64), 4, cap).tolist()
        if reference_plan.split_fill(3, 3, depth, 4, cap) is not None:
            assert max(reference_plan.split_cost(3, 3, depth, x) for x in bounds) <= cap


def test_a_rank_feeds_its_run_after_its_first_nodes_ancestors():
    rng = random.Random(3)
    for _ in range(200):
        parents = random_tree(rng, rng.randrange(1, 50))
        order = reference_plan.preorder(parents)
        ordered, depth = reference_plan.in_order(parents, order)
        c = rng.randrange(len(parents))
        d = rng.randrange(c, len(parents) + 1)
        nodes, local = rank_nodes(np.asarray(ordered, np.int64), np.asarray(depth, np.int64), c, d)
        ancestors, up = [], ordered[c] if d > c else -1
        while up >= 0:
            ancestors.insert(0, up)
            up = ordered[up]
        assert nodes.tolist() == ancestors + list(range(c, d))
        for i, q in enumerate(nodes.tolist()):  # each node's parent, among the rank's nodes
            assert (nodes[local[i]] if local[i] >= 0 else -1) == ordered[q]


def random_growth(rng: random.Random, parents: tuple[int, ...]) -> list[int]:
    """Each node's place in a random growth that takes a parent before its children."""
    ready, place, children = [v for v, p in enumerate(parents) if p < 0], {}, {}
    for v, p in enumerate(parents):
        children.setdefault(p, []).append(v)
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        place[v] = len(place)
        ready += children.get(v, [])
    return [place[v] for v in range(len(parents))]


def test_a_tree_is_cut_to_its_first_grown_nodes_that_fit():
    rng = random.Random(4)
    cut = 0
    for _ in range(150):
        parents = random_tree(rng, rng.randrange(1, 80))
        growth = random_growth(rng, parents)
        P, cap = rng.randint(2, 4), rng.randrange(12, 40)
        size = fitted_size(3, 3, P, cap, np.asarray(parents, np.int64), np.asarray(growth, np.int64))
        assert size == reference_plan.fitted_size(3, 3, P, cap, parents, growth)
        nodes, kept = first_grown(np.asarray(parents, np.int64), np.asarray(growth, np.int64), size)
        want_nodes, want_kept = reference_plan.first_grown(parents, growth, size)
        assert nodes.tolist() == want_nodes and tuple(kept.tolist()) == want_kept
        depth = reference_plan.in_order(want_kept, reference_plan.preorder(want_kept))[1]
        assert reference_plan.split_fill(3, 3, depth, P, cap) is not None
        cut += size < len(parents)
    assert cut > 30


def test_fitted_returns_the_tree_where_it_fits_and_groups_of_the_cut_one():
    tokens = np.arange(10, 20, dtype=np.int64)
    parents = np.array([-1, 0, 1, 2, 3, -1, 5, 6, 7, 8], np.int64)
    labels, growth = np.arange(10, dtype=np.int64), np.array([0, 2, 4, 6, 8, 1, 3, 5, 7, 9], np.int64)
    groups = np.array([5, 5], np.int64)
    same = fitted(Split(1, 2, 2, 0, 64), 1, tokens, parents, labels, growth, groups)
    assert same[0] is tokens and same[3] is groups
    t, p, lab, g = fitted(Split(1, 2, 2, 0, 4), 1, tokens, parents, labels, growth, groups)
    assert 0 < len(t) < 10 and lab.tolist() == (t - 10).tolist() and g.sum() == len(t)
    assert all(growth[t - 10] < len(t)) and DraftTree(t, p).groups() == tuple(g.tolist())


@pytest.mark.parametrize(
    "cfg,P,cap",
    [
        (DecodeConfig(W=3, N=3, G=15, step_tokens=1024), 8, 128),
        (DecodeConfig(W=3, N=3, G=15, step_tokens=128), 2, 64),
        (DecodeConfig(W=3, N=3, G=15, step_tokens=128), 1, 0),
        (DecodeConfig(W=3, N=3, G=15, step_tokens=128, temperature=0.7), 2, 0),
        (DecodeConfig(W=1, N=2, G=15, step_tokens=11, tree_tokens=9), 2, 15),
        (DecodeConfig(mode="ar"), 4, 0),
        # wide windows: each rank feeds its columns' row-0 prefix again, so an even share's bucket
        # (64 at W60 N5 G60 over 8 ranks) would leave the tree no room: the next bucket is the cap
        (DecodeConfig(W=60, N=5, G=60), 8, 128),
        (DecodeConfig(W=15, N=5, G=15), 4, 64),
        (DecodeConfig(W=3, N=3, G=15, step_tokens=128), 8, 16),
    ],
)
def test_the_share_cap_is_the_bucket_of_an_even_share(cfg, P, cap):
    assert share_cap(cfg, P) == cap
    if cap:
        W, N, _, _ = cfg.step_shape
        assert window_share(W, N, P, 1) + TREE_ROOM * cfg.tree_limit / P <= cap


def test_the_window_share_is_the_partitioners():
    """A rank of 8 splitting W60 N5 feeds its columns' 4 rows, the row-0 prefix before them and
    the pending tokens; the partitioner balances them, so the first ranks take more columns."""
    assert window_share(60, 5, 1, 1) == 1 + 59 + 3 * 60
    assert window_share(60, 5, 8, 5) < window_share(60, 5, 4, 5) < window_share(60, 5, 2, 5)
    assert window_share(0, 2, 4, 3) == 3


def test_plans_of_a_real_shaped_tree_fill_the_cap():
    """A tree hanging almost all its nodes below one root (as 1,024-token trees do) splits into
    shares of the cap once cut to fit, where whole root subtrees would leave one rank most."""
    rng = random.Random(5)
    parents, depth = [-1], [1]
    for v in range(1, 1000):  # at most 12 deep, as drafts are
        p = rng.randrange(max(0, v - 12), v)
        p = p if depth[p] < 12 else rng.randrange(0, 8)
        parents.append(p)
        depth.append(depth[p] + 1)
    parents += [-1, 1000, -1]
    tree = DraftTree(np.arange(len(parents), dtype=np.int64), parents)
    whole = [plan_step([7], None, tree, Split(3, 3, 8, r)).layout.size for r in range(8)]
    assert max(whole) > 900
    t, p, _, _ = fitted(
        Split(3, 3, 8, 0, 128),
        1,
        tree.tokens,
        tree.parent_array,
        tree.tokens,
        np.arange(len(parents)),
        np.zeros(0, np.int64),
    )
    cut = DraftTree(t, p)
    sizes = [plan_step([7], None, cut, Split(3, 3, 8, r, 128)).layout.size for r in range(8)]
    assert max(sizes) <= 128 and sum(sizes) > 8 * 120 and cut.size > 0.9 * tree.size


@pytest.mark.parametrize("share", [0, 16])
def test_a_steps_whole_size_is_one_ranks_and_the_same_on_every_rank(share):
    """`StepPlan.whole` (what W=auto's tuner learns from) is what one rank would feed, whichever
    rank and split computes it: a rank's own share would teach each rank a different slope."""
    rng = random.Random(11)
    for n in (0, 1, 7, 40):
        parents = np.asarray(random_tree(rng, n), np.int64)
        ordered, _ = reordered(parents, preorder(parents))  # root subtrees in runs, as the search takes them
        tree = DraftTree(np.arange(n, dtype=np.int64), ordered.tolist())
        for W, N, pending in ((3, 3, [5]), (4, 2, [5, 6]), (2, 4, [5, 6, 7])):
            one = plan_step(pending, None, tree, Split(W, N, 1, 0)).layout.size
            for P in (2, 3):
                plans = [plan_step(pending, None, tree, Split(W, N, P, r, share)) for r in range(P)]
                assert {p.whole for p in plans} == {one}, (n, W, N, P)
                assert max(p.layout.size for p in plans) < one or n == 0
    # a step the budget gave no node: the pending tokens alone (no window), on every rank
    rows, none = np.zeros((2, 3), np.int64), np.zeros(0, np.int64)
    splits = [Split(3, 3, 2, r) for r in range(2)]
    bare = [StepPlan(lay_out_step(s, np.array([5, 6]), rows, none, none, none, False), 2, s) for s in splits]
    assert [p.whole for p in bare] == [p.layout.size for p in bare] == [2, 2]

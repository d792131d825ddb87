"""The Lookahead Parallelism partitioner: coverage, contiguity and optimal balance."""

from __future__ import annotations

import itertools
from functools import cache

import pytest

from lp.partition import RankPlan, partition


def tokens_of(cols: list[int], cands: list[int], N: int, pending: int = 1) -> int:
    """Independent cost of a rank: pending tokens, row-0 prefix r0[1..max column], N-2 levels
    per column, N-1 tokens per candidate (docs/design.md sections 2 and 4)."""
    prefix = max(cols) if cols else 0
    return pending + prefix + (N - 2) * len(cols) + (N - 1) * len(cands)


def items(W: int, G: int, groups=None) -> list[tuple]:
    """Columns one by one, then candidates one by one (or whole groups of candidates)."""
    cands = [("cand", c) for c in range(G)]
    if groups is not None:
        cands, start = [], 0
        for size in groups:
            cands.append(("cand", *range(start, start + size)))
            start += size
    return [("col", j) for j in range(W)] + cands


def part_cost(part, N) -> int:
    cols = [item[1] for item in part if item[0] == "col"]
    cands = [c for item in part if item[0] == "cand" for c in item[1:]]
    return tokens_of(cols, cands, N)


def brute_force_optimum(W: int, N: int, G: int, P: int, groups=None) -> int:
    """Min over ALL contiguous splits of [columns..., candidates...] into P (possibly empty)
    parts of the largest part's cost (with `groups`: no cut inside a group)."""
    seq = items(W, G, groups)
    n, best = len(seq), None
    for cuts in itertools.combinations_with_replacement(range(n + 1), P - 1):
        bounds = (0, *cuts, n)
        worst = max(part_cost(seq[a:b], N) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def dp_optimum(W: int, N: int, G: int, P: int) -> int:
    """The same optimum by dynamic programming (for sizes too large to enumerate)."""
    seq = items(W, G)
    n = len(seq)

    @cache
    def f(p: int, i: int) -> int:  # best max cost splitting seq[i:] into p parts
        if p == 1:
            return part_cost(seq[i:], N)
        return min(max(part_cost(seq[i:k], N), f(p - 1, k)) for k in range(i, n + 1))

    return f(P, 0)


def check_coverage(plans, W: int, G: int, P: int) -> None:
    assert len(plans) == P
    cols = [j for p in plans for j in p.columns]
    cands = [c for p in plans for c in p.candidates]
    assert cols == list(range(W)), "every column exactly once, in rank order"
    assert cands == list(range(G)), "every candidate exactly once, in rank order"
    for p in plans:
        assert isinstance(p.columns, range) and p.columns.step == 1
        assert isinstance(p.candidates, range) and p.candidates.step == 1


def max_cost(plans, N) -> int:
    return max(p.cost(N) for p in plans)


SMALL = [
    (W, N, G, P)
    for W in range(0, 7)
    for N in (2, 3, 5)
    for G in range(0, 5)
    for P in (1, 2, 3, 4)
    if W + G <= 9 or P <= 3
]


@pytest.mark.parametrize("N", [2, 3, 5])
def test_small_cases_coverage_and_optimal_balance(N):
    for W, _, G, P in (s for s in SMALL if s[1] == N):
        plans = partition(W, N, G, P)
        check_coverage(plans, W, G, P)
        assert max_cost(plans, N) == brute_force_optimum(W, N, G, P), (W, N, G, P, plans)


@pytest.mark.parametrize(
    "W,N,G,P",
    [
        (7, 5, 7, 2),
        (15, 5, 15, 4),
        (20, 7, 20, 8),
        (30, 4, 10, 3),
        (10, 3, 40, 5),
        (5, 3, 20, 2),
        (64, 2, 0, 7),
        (0, 4, 33, 6),
    ],
)
def test_larger_cases_optimal(W, N, G, P):
    plans = partition(W, N, G, P)
    check_coverage(plans, W, G, P)
    got = max_cost(plans, N)
    # Every rank feeds at least its pending token; the rank holding column W-1 feeds the whole
    # row-0 prefix; so the costs sum to at least this, and the largest is at least the mean.
    total = P + (max(W - 1, 0)) + (N - 2) * W + (N - 1) * G
    assert got >= -(-total // P)
    assert got == dp_optimum(W, N, G, P)


GROUPED = [
    (W, N, groups, P)
    for W in (0, 1, 3, 5)
    for N in (2, 3, 5)
    for groups in [(1,), (2,), (3, 1), (1, 3), (2, 2, 1), (1, 1, 4), (4, 2)]
    for P in (1, 2, 3)
]


@pytest.mark.parametrize("N", [2, 3, 5])
def test_groups_stay_together_and_balance_is_optimal(N):
    """Candidates sharing a first draft token (a group) stay on one rank; among the splits that
    respect that, the largest rank cost is optimal."""
    for W, _, groups, P in (s for s in GROUPED if s[1] == N):
        G = sum(groups)
        plans = partition(W, N, G, P, groups)
        check_coverage(plans, W, G, P)
        owner = {c: r for r, p in enumerate(plans) for c in p.candidates}
        start = 0
        for size in groups:
            assert len({owner[c] for c in range(start, start + size)}) == 1, (W, N, groups, P, plans)
            start += size
        assert max_cost(plans, N) == brute_force_optimum(W, N, G, P, groups), (W, N, groups, P, plans)


@pytest.mark.parametrize("P", [1, 2])
@pytest.mark.parametrize("groups", [(1, 1), (0, 3), (2, -1, 2), (4,)])
def test_bad_groups_raise(groups, P):
    with pytest.raises(ValueError):
        partition(3, 3, 3, P, groups)


def test_rank_plan_cost_matches_independent_count():
    for W, N, G in itertools.product(range(0, 6), (2, 3, 4), range(0, 3)):
        for a in range(W + 1):
            for b in range(a, W + 1):
                plan = RankPlan(range(a, b), range(G))
                for pending in (1, 3):
                    assert plan.cost(N, pending) == tokens_of(list(range(a, b)), list(range(G)), N, pending)


def test_one_rank_gets_everything():
    for W, N, G in [(5, 3, 5), (1, 2, 0), (15, 5, 15), (0, 2, 0)]:
        (plan,) = partition(W, N, G, 1)
        assert plan.columns == range(W) and plan.candidates == range(G)


def test_more_ranks_than_work_leaves_ranks_empty():
    plans = partition(1, 3, 0, 4)
    check_coverage(plans, 1, 0, 4)
    busy = [p for p in plans if len(p.columns) or len(p.candidates)]
    assert len(busy) == 1
    assert max_cost(plans, 3) == 1 + 1  # x0 and the single level-1 token of column 0
    plans = partition(2, 2, 1, 6)
    check_coverage(plans, 2, 1, 6)
    assert sum(1 for p in plans if not len(p.columns) and not len(p.candidates)) >= 3


def test_ar_mode_shape():
    """mode=ar decodes with W=0, N=2, G=0: every rank gets an empty plan."""
    plans = partition(0, 2, 0, 3)
    assert all(len(p.columns) == 0 and len(p.candidates) == 0 for p in plans)


def test_more_ranks_never_cost_more():
    for W, N, G in [(7, 5, 7), (15, 5, 15), (5, 3, 5), (20, 4, 3)]:
        costs = [max_cost(partition(W, N, G, P), N) for P in range(1, 9)]
        assert costs == sorted(costs, reverse=True), (W, N, G, costs)
        assert costs[1] < costs[0]


def test_deterministic():
    assert partition(9, 4, 6, 3) == partition(9, 4, 6, 3)
    partition.cache_clear()
    first = partition(9, 4, 6, 3)
    partition.cache_clear()
    assert partition(9, 4, 6, 3) == first


@pytest.mark.parametrize("args", [(-1, 3, 2, 2), (3, 1, 2, 2), (3, 3, -1, 2), (3, 3, 2, 0), (3, 3, 2, -2)])
def test_bad_arguments_raise(args):
    with pytest.raises(ValueError):
        partition(*args)


def test_no_fill_meets_a_limit_below_the_floor():
    """The search skips limits under `_floor` without filling: no fill may meet one."""
    import random

    import numpy as np

    from lp.partition import _floor, _greedy

    rng = random.Random(0)
    tight = 0
    for _ in range(300):
        W, N, P = rng.choice([0, 1, 3, 15, 60]), rng.randint(2, 6), rng.randint(2, 8)
        groups = tuple(rng.randint(1, 12) for _ in range(rng.randint(0, 12)))
        width = rng.choice([1, N - 1])
        ends = np.cumsum(groups, dtype=np.int64)
        floor, out = _floor(W, N, P, ends, width), np.empty((P, 4), dtype=np.int64)
        assert all(not _greedy(W, N, ends, P, limit, width, out) for limit in range(1, floor))
        tight += _greedy(W, N, ends, P, floor, width, out)
    assert tight > 30  # the floor is often the answer itself: it is not a vacuous bound


def test_plans_equal_the_reference_search():
    """The compiled search gives the plans of the plain-Python one (tests/reference_plan.py) on
    random groups, widths and rank counts, trees' shapes included (many small root subtrees)."""
    import random

    import reference_plan

    rng = random.Random(1)
    for _ in range(3000):
        W, N, P = rng.choice([0, 1, 2, 3, 7, 15, 60]), rng.randint(2, 7), rng.randint(1, 9)
        groups = tuple(rng.choice([1, 1, 1, 2, 3, rng.randint(1, 40)]) for _ in range(rng.randint(0, 60)))
        width = rng.choice([1, N - 1])
        plans = partition(W, N, sum(groups), P, groups, width)
        got = [(p.columns.start, p.columns.stop, p.candidates.start, p.candidates.stop) for p in plans]
        assert got == reference_plan.partition(W, N, P, groups, width), (W, N, P, groups, width)

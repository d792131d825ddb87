"""Lookahead Parallelism's partitioner: which window columns and verification n-grams each
rank runs. Pure and deterministic, so every rank computes the same plan without talking.

Candidates are counted in units of `candidate_tokens` tokens: N-1 for G unshared n-grams, 1 for the nodes
of a verification tree (lp/lookahead/tree.py), whose root subtrees come as `groups`.

Column j needs the row-0 prefix rows[0, 1..j], so a rank holding columns [a, b) also feeds
rows[0, 1..b-1] (duplicating what lower ranks feed). Cost is counted in step tokens, the
quantity a rank's forward time grows with.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of a step: contiguous window columns and candidate indices."""

    columns: range
    candidates: range

    def cost(self, N: int, pending: int = 1, candidate_tokens: int | None = None) -> int:
        """Tokens this rank feeds: pending tokens, the row-0 prefix, its levels, its candidates
        (`candidate_tokens` tokens each, default N-1)."""
        return _tokens(
            self.columns.start,
            self.columns.stop,
            len(self.candidates),
            N,
            pending=pending,
            candidate_tokens=N - 1 if candidate_tokens is None else candidate_tokens,
        )


def _tokens(first_col: int, stop_col: int, candidates: int, N: int, pending: int, candidate_tokens: int) -> int:
    """A rank's step tokens (RankPlan.cost), from plain integers: the partitioner's inner loop."""
    prefix = stop_col - 1 if stop_col > first_col else 0
    return pending + prefix + (N - 2) * (stop_col - first_col) + candidate_tokens * candidates


def _greedy(
    W: int, N: int, ends: tuple[int, ...], P: int, limit: int, candidate_tokens: int
) -> list[tuple[int, int, int, int]] | None:
    """Fill ranks in order up to `limit` tokens each: columns first, then whole candidate
    groups (`ends` are the groups' exclusive end indices). Both fills are closed forms: columns
    [a, b) cost `_tokens` = (N-1)b - (N-2)a tokens (b > a), so b is that solved for the limit, and
    the groups that fit are a bisection of `ends`. Each rank's share as (first column, column stop, first
    candidate, candidate stop)."""
    plans, col, g, n = [], 0, 0, len(ends)
    for rank in range(P):
        start_col, start_cand = col, ends[g - 1] if g else 0
        if col == W and g == n:  # all placed: the other ranks are empty
            return plans + [(W, W, start_cand, start_cand)] * (P - rank)
        col = max(start_col, min(W, (limit + (N - 2) * start_col) // (N - 1)))
        # `_tokens(start_col, col, 0, N, 1, candidate_tokens)`, inlined: the search runs this loop most
        used = 1 + (col - 1 + (N - 2) * (col - start_col) if col > start_col else 0)
        g = bisect_right(ends, start_cand + (limit - used) // candidate_tokens, lo=g)
        plans.append((start_col, col, start_cand, ends[g - 1] if g else 0))
    return plans if col == W and g == n else None


def _floor(W: int, N: int, P: int, groups: tuple[int, ...], candidate_tokens: int) -> int:
    """A limit below which no fill succeeds, so the search needs no fill there. A fill keeps
    every rank within the limit, so the limit is at least the mean of the ranks' tokens (each
    feeds x0; the columns' levels, the prefix rows[0, 1..W-1] and the candidates are fed once at
    least), the tokens of the rank with the last column, and those of the rank with the largest
    group."""
    spread = -(-(P + max(W - 1, 0) + (N - 2) * W + candidate_tokens * sum(groups)) // P)
    return max(
        spread,
        _tokens(max(W - 1, 0), W, 0, N, pending=1, candidate_tokens=candidate_tokens),
        _tokens(0, 0, max(groups, default=0), N, pending=1, candidate_tokens=candidate_tokens),
    )


@lru_cache(maxsize=4096)
def partition(
    W: int, N: int, G: int, P: int, groups: tuple[int, ...] | None = None, candidate_tokens: int | None = None
) -> tuple[RankPlan, ...]:
    """Split W columns and G candidates over P ranks, minimising the largest rank's cost.

    Columns are taken in order (so a rank's prefix is shared by its columns), then candidates;
    a binary search finds a per-rank token limit the greedy fill can meet (the smallest one,
    except in rare cases where the fill meets a limit but not the next: it is not monotone).
    `groups` (sizes summing to G) keeps
    consecutive candidates together on one rank: a tree's root subtrees, or the candidates
    that share their first draft token, as sampling needs. `candidate_tokens`: tokens per candidate
    (default N-1). Ranks may end up empty (they still compute the next token and
    keep their cache in step).
    """
    groups = groups if groups is not None else (1,) * G
    candidate_tokens = N - 1 if candidate_tokens is None else candidate_tokens
    if W < 0 or N < 2 or G < 0 or P < 1 or sum(groups) != G or min(groups, default=1) < 1 or candidate_tokens < 1:
        raise ValueError(
            f"bad partition request W={W} N={N} G={G} P={P} groups={groups} candidate_tokens={candidate_tokens}"
        )
    if P == 1:
        return (RankPlan(range(W), range(G)),)
    ends = tuple(itertools.accumulate(groups))
    # The floor first: no limit below it is feasible, so where the fill meets it (about 2 steps
    # in 5 of a real decode at W60 N5 G60 P8) it is the best limit, found in one fill. Else a
    # binary search above it (the fill is not monotone in the limit: it may land on a feasible
    # limit that is not the least).
    floor = _floor(W, N, P, groups, candidate_tokens=candidate_tokens)
    plans = _greedy(W, N, ends, P, limit=floor, candidate_tokens=candidate_tokens)
    lo, hi = floor + 1, RankPlan(range(W), range(G)).cost(N, 1, candidate_tokens)
    at_hi = None  # the fill at `hi`, once a probe has made it
    while plans is None and lo < hi:
        mid = (lo + hi) // 2
        fill = _greedy(W, N, ends, P, limit=mid, candidate_tokens=candidate_tokens)
        if fill is None:
            lo = mid + 1
        else:
            hi, at_hi = mid, fill
    plans = plans or at_hi or _greedy(W, N, ends, P, limit=lo, candidate_tokens=candidate_tokens)
    assert plans is not None
    return tuple(RankPlan(range(a, b), range(c, d)) for a, b, c, d in plans)

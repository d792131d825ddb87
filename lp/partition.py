"""Lookahead Parallelism's partitioner: which window columns and verification n-grams each
rank runs. Pure and deterministic, so every rank computes the same plan without talking.

Candidates are counted in units of `candidate_tokens` tokens: N-1 for G unshared n-grams, 1 for the nodes
of a verification tree (lp/lookahead/tree.py), whose root subtrees come as `groups`.

Column j needs the row-0 prefix rows[0, 1..j], so a rank holding columns [a, b) also feeds
rows[0, 1..b-1] (duplicating what lower ranks feed). Cost is counted in step tokens, the
quantity a rank's forward time grows with.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from lp.jit import compiled


class Split(NamedTuple):
    """How a step is split: W window columns of n-gram size N over P ranks, this rank's share.
    `share` > 0 (greedy steps over P > 1 ranks): the tree is cut anywhere in pre-order, each
    share within `share` tokens where the tree fits (lp/decode/shares.py); 0: root subtrees whole."""

    W: int
    N: int
    P: int
    rank: int
    share: int = 0


class RankPlan(NamedTuple):
    """One rank's share of a step: contiguous window columns and candidate indices. (A named
    tuple: a step makes P of them after its message is read, and a frozen dataclass costs
    several times more to make.)"""

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


@compiled
def _greedy(W: int, N: int, ends: np.ndarray, P: int, limit: int, candidate_tokens: int, out: np.ndarray) -> bool:
    """Fill ranks in order up to `limit` tokens each: columns first, then whole candidate
    groups (`ends` are the groups' exclusive end indices). Both fills are closed forms: columns
    [a, b) cost `_tokens` = (N-1)b - (N-2)a tokens (b > a), so b is that solved for the limit, and
    the groups that fit are a bisection of `ends`. Writes each rank's share to `out[rank]` as
    (first column, column stop, first candidate, candidate stop); whether every column and
    group found a rank."""
    col, g, n = 0, 0, ends.shape[0]
    for rank in range(P):
        start_col, start_cand = col, ends[g - 1] if g else 0
        if col < W or g < n:
            col = max(start_col, min(W, (limit + (N - 2) * start_col) // (N - 1)))
            # `_tokens(start_col, col, 0, N, 1, candidate_tokens)`, inlined
            used = 1 + (col - 1 + (N - 2) * (col - start_col) if col > start_col else 0)
            # bisect_right(ends, start_cand + (limit - used) // candidate_tokens, lo=g)
            bound, hi = start_cand + (limit - used) // candidate_tokens, n
            while g < hi:
                mid = (g + hi) // 2
                if ends[mid] <= bound:
                    g = mid + 1
                else:
                    hi = mid
        out[rank, 0], out[rank, 1], out[rank, 2] = start_col, col, start_cand
        out[rank, 3] = ends[g - 1] if g else 0  # a rank after all were placed: an empty share
    return col == W and g == n


@compiled
def _floor(W: int, N: int, P: int, ends: np.ndarray, candidate_tokens: int) -> int:
    """A limit below which no fill succeeds, so the search needs no fill there. A fill keeps
    every rank within the limit, so the limit is at least the mean of the ranks' tokens (each
    feeds x0; the columns' levels, the prefix rows[0, 1..W-1] and the candidates are fed once at
    least), the tokens of the rank with the last column, and those of the rank with the largest
    group (`ends`: the groups' exclusive end indices)."""
    largest, start = 0, 0
    for end in ends:
        largest, start = max(largest, end - start), end
    spread = -(-(P + max(W - 1, 0) + (N - 2) * W + candidate_tokens * start) // P)
    return max(spread, W + N - 2 if W else 1, 1 + candidate_tokens * largest)


@compiled
def search(W: int, N: int, sizes: np.ndarray, P: int, candidate_tokens: int, G: int) -> np.ndarray:
    """The ranks' shares `[P, 4]` (`_greedy`'s rows) for groups of `sizes` candidates (none, `[0,
    4]`, unless each is at least 1 and they sum to G) at the least limit the fill meets: the floor
    first, as no limit below it is feasible, so where the fill meets it (about 2 steps in 5 of a
    real decode at W60 N5 G60 P8) it is the best limit, found in one fill; else a binary search
    above it (the fill is not monotone in the limit: it may land on a feasible limit that is not
    the least). Compiled: the search fills about log2(the limits' range) times (at W60 N5 G60
    P8, eight or nine), each fill a loop over the ranks with a bisection each: tens of
    microseconds in Python, on the host's path between the message read and the next forward."""
    ends = np.cumsum(sizes)
    if (len(sizes) and sizes.min() < 1) or (ends[-1] if len(ends) else 0) != G:
        return np.empty((0, 4), np.int64)
    out = np.empty((P, 4), np.int64)
    floor = _floor(W, N, P, ends, candidate_tokens)
    if _greedy(W, N, ends, P, floor, candidate_tokens, out):
        return out
    lo, hi = floor + 1, 1 + max(W - 1, 0) + (N - 2) * W + candidate_tokens * G
    at_hi = np.empty((0, 4), np.int64)  # the fill at `hi`, once a probe has made it
    probe = np.empty((P, 4), np.int64)
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy(W, N, ends, P, mid, candidate_tokens, probe):
            hi = mid
            at_hi = probe.copy()
        else:
            lo = mid + 1
    if at_hi.shape[0]:
        return at_hi
    _greedy(W, N, ends, P, lo, candidate_tokens, out)
    return out


@compiled
def fill_split(W: int, N: int, depth: np.ndarray, P: int, limit: int, out: np.ndarray) -> bool:
    """`_greedy` for a tree in pre-order (`depth`: each node's depth, 1 for x0's children) that
    ranks may cut anywhere: each rank takes the next columns, then the next nodes, and also feeds
    its first node's ancestors again (depth - 1 of them: in pre-order they are the only ones
    outside a rank's run of nodes), within `limit` tokens; whether every column and node found
    a rank."""
    col, v, n = 0, 0, len(depth)
    for rank in range(P):
        start_col, start = col, v
        if col < W or v < n:
            col = max(start_col, min(W, (limit + (N - 2) * start_col) // (N - 1)))
            used = 1 + (col - 1 + (N - 2) * (col - start_col) if col > start_col else 0)
            if v < n:
                v = min(n, v + max(0, limit - used - (depth[v] - 1)))
        out[rank, 0], out[rank, 1], out[rank, 2], out[rank, 3] = start_col, col, start, v
    return col == W and v == n


@compiled
def search_split(W: int, N: int, depth: np.ndarray, P: int, most: int) -> np.ndarray:
    """The ranks' shares `[P, 4]` of W columns and a tree in pre-order (`depth`) that ranks may
    cut anywhere (`fill_split`), at the least limit the fill meets: from the floor (the mean
    of the ranks' tokens, the window's last column, a deepest node and its ancestors), by
    binary search up to `most` where the fill meets it (a share cap), else up to one rank's
    whole step. One pending token a rank: a caller with m subtracts m - 1 from `most`."""
    n = len(depth)
    top = 1 + max(W - 1, 0) + (N - 2) * W + n
    deepest = 0
    for v in range(n):
        deepest = max(deepest, depth[v])
    lo = max(-(-(P + top - 1) // P), W + N - 2 if W else 1, 1 + deepest)
    out = np.empty((P, 4), np.int64)
    hi, best = top, np.empty((0, 4), np.int64)
    if lo <= most < top and fill_split(W, N, depth, P, most, out):
        hi, best = most, out.copy()
    while lo < hi:
        mid = (lo + hi) // 2
        if fill_split(W, N, depth, P, mid, out):
            hi, best = mid, out.copy()
        else:
            lo = mid + 1
    if best.shape[0]:
        return best
    fill_split(W, N, depth, P, hi, out)
    return out


def plans_of(bounds: np.ndarray) -> tuple[RankPlan, ...]:
    """The ranks' plans from `search`'s rows (first column, column stop, first candidate,
    candidate stop)."""
    return tuple(RankPlan(range(a, b), range(c, d)) for a, b, c, d in bounds.tolist())


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
    if min(W, G, P - 1, N - 2, candidate_tokens - 1) >= 0:
        if P == 1:  # one rank takes the whole step: no search
            if sum(groups) == G and min(groups, default=1) >= 1:
                return (RankPlan(range(W), range(G)),)
        else:
            sizes = np.fromiter(groups, dtype=np.int64, count=len(groups))
            bounds = search(W, N, sizes, P, candidate_tokens, G)
            if len(bounds):  # else the groups are not each at least 1, or do not sum to G
                return plans_of(bounds)
    raise ValueError(
        f"bad partition request W={W} N={N} G={G} P={P} groups={groups} candidate_tokens={candidate_tokens}"
    )

"""Plain-Python references for the compiled step planning (lp/lookahead/mask.py, lp/partition.py,
lp/message.py): the same layouts, plans and merges, computed the straightforward way, so the
randomized tests can demand equal results, array for array."""

from __future__ import annotations

import itertools
from bisect import bisect_right

import numpy as np

from lp.message import HEADER
from lp.partition import RankPlan


def layout_arrays(m: int, W: int, N: int, columns: range, tree: tuple[int, ...]) -> dict[str, np.ndarray | int]:
    """`step_layout`'s prefix, gather, depth, mask and logit rows, built with array ops per part
    and a Python bitset per tree node (ValueError on a bad tree)."""
    x0, L, nc, n = m - 1, N - 2, len(columns), len(tree)
    prefix = columns[-1] if nc else 0
    base = m + prefix
    first = base + nc * L
    pending = np.arange(m)
    gather, depth, last = [pending], [pending - x0], pending[:0]
    T = first + n
    mask = np.zeros((T, T), dtype=bool)
    mask[:m, :m] = np.tri(m, dtype=bool)
    mask[m:, :m] = True
    if nc:
        cols = np.arange(columns.start, columns.stop)
        lvl = np.tile(np.arange(1, L + 1), nc)
        col = np.repeat(cols, L)
        i = np.arange(1, prefix + 1)
        gather += [m + i, m + lvl * W + col]
        depth += [i, lvl + col]
        mask[m:base, m:base] = np.tri(prefix, dtype=bool)
        mask[base:first, m:base] = i[None, :] <= col[:, None]
        mask[base:first, base:first] = (col[:, None] == col[None, :]) & (lvl[None, :] <= lvl[:, None])
        last = m - 1 + cols if N == 2 else base + np.arange(nc) * L + L - 1
    bits: list[int] = []
    tree_depth: list[int] = []
    for q, p in enumerate(tree):
        if p == -1:
            bits.append(1 << q)
            tree_depth.append(1)
        elif 0 <= p < q:
            bits.append(bits[p] | 1 << q)
            tree_depth.append(tree_depth[p] + 1)
        else:
            raise ValueError(f"bad tree: node {q}'s parent {p}")
    for q, b in enumerate(bits):
        mask[first + q, first:] = [(b >> j) & 1 for j in range(n)]
    return {
        "prefix": prefix,
        "gather": np.concatenate(gather + [m + (N - 1) * W + np.arange(n)]),
        "depth": np.concatenate(depth + [np.asarray(tree_depth, dtype=np.int64)]),
        "mask": mask,
        "logit_rows": np.concatenate([[m - 1], last, np.arange(first, T)]),
    }


def _fill(W: int, N: int, ends: tuple[int, ...], P: int, limit: int, width: int) -> list | None:
    """Ranks filled in order up to `limit` tokens each, columns then whole groups (None: some
    column or group found no rank)."""
    plans, col, g, n = [], 0, 0, len(ends)
    for _ in range(P):
        start_col, start_cand = col, ends[g - 1] if g else 0
        if col < W or g < n:
            col = max(start_col, min(W, (limit + (N - 2) * start_col) // (N - 1)))
            used = 1 + (col - 1 + (N - 2) * (col - start_col) if col > start_col else 0)
            g = bisect_right(ends, start_cand + (limit - used) // width, lo=g)
        plans.append((start_col, col, start_cand, ends[g - 1] if g else 0))
    return plans if col == W and g == n else None


def floor(W: int, N: int, P: int, groups: tuple[int, ...], width: int) -> int:
    """The search's lower bound: the mean rank, the last column's rank, the largest group's."""
    spread = -(-(P + max(W - 1, 0) + (N - 2) * W + width * sum(groups)) // P)
    return max(spread, W + N - 2 if W else 1, 1 + width * max(groups, default=0))


def partition(W: int, N: int, P: int, groups: tuple[int, ...], width: int) -> list[tuple[int, int, int, int]]:
    """`lp.partition.partition`'s plans as (first column, column stop, first candidate,
    candidate stop): the fill at the floor, else at the least limit a binary search above it
    finds."""
    if P == 1:
        return [(0, W, 0, sum(groups))]
    ends = tuple(itertools.accumulate(groups))
    low = floor(W, N, P, groups, width)
    plans = _fill(W, N, ends, P, low, width)
    lo, hi = low + 1, RankPlan(range(W), range(sum(groups))).cost(N, 1, width)
    at_hi = None
    while plans is None and lo < hi:
        mid = (lo + hi) // 2
        fill = _fill(W, N, ends, P, mid, width)
        if fill is None:
            lo = mid + 1
        else:
            hi, at_hi = mid, fill
    return plans or at_hi or _fill(W, N, ends, P, lo, width)


def preorder(parents: tuple[int, ...]) -> list[int]:
    """The nodes in pre-order: each node, then its children's subtrees in index order."""
    children: dict[int, list[int]] = {}
    for v, p in enumerate(parents):
        children.setdefault(p, []).append(v)
    out: list[int] = []

    def visit(v: int) -> None:
        out.append(v)
        for c in children.get(v, []):
            visit(c)

    for root in children.get(-1, []):
        visit(root)
    return out


def in_order(parents: tuple[int, ...], order: list[int]) -> tuple[list[int], list[int]]:
    """The parents and depths of the nodes taken in `order`."""
    place = {v: q for q, v in enumerate(order)}
    ordered = [place[parents[v]] if parents[v] >= 0 else -1 for v in order]
    depth: list[int] = []
    for p in ordered:
        depth.append(1 if p < 0 else depth[p] + 1)
    return ordered, depth


def split_cost(W: int, N: int, depth: list[int], share: tuple[int, int, int, int]) -> int:
    """A rank's tokens with one pending: its columns, its nodes c..d-1 of a tree in pre-order and
    node c's ancestors fed again."""
    a, b, c, d = share
    return RankPlan(range(a, b), range(c, d)).cost(N, 1, 1) + (depth[c] - 1 if d > c else 0)


def split_fill(W: int, N: int, depth: list[int], P: int, limit: int) -> list | None:
    """Ranks filled in order up to `limit` tokens each: columns, then as many nodes as fit with
    the first one's ancestors (None: some column or node found no rank)."""
    plans, col, v, n = [], 0, 0, len(depth)
    for _ in range(P):
        start_col, start = col, v
        if col < W or v < n:
            while col < W and split_cost(W, N, depth, (start_col, col + 1, v, v)) <= limit:
                col += 1
            while v < n and split_cost(W, N, depth, (start_col, col, start, v + 1)) <= limit:
                v += 1
        plans.append((start_col, col, start, v))
    return plans if col == W and v == n else None


def fitted_size(W: int, N: int, P: int, cap: int, parents: tuple[int, ...], growth: list[int]) -> int:
    """The most nodes, first grown first, that P shares of `cap` tokens hold (a binary search
    over the count, as lp/decode/shares.py's)."""
    lo, hi = 0, len(parents)
    while lo < hi:
        size = (lo + hi + 1) // 2
        kept = first_grown(parents, growth, size)[1]
        if split_fill(W, N, in_order(kept, preorder(kept))[1], P, cap) is not None:
            lo = size
        else:
            hi = size - 1
    return lo


def first_grown(parents: tuple[int, ...], growth: list[int], size: int) -> tuple[list[int], tuple[int, ...]]:
    """The nodes grown before place `size`, in the tree's order, and their parents among them."""
    nodes = [v for v in range(len(parents)) if growth[v] < size]
    place = {v: i for i, v in enumerate(nodes)}
    return nodes, tuple(place[parents[v]] if parents[v] >= 0 else -1 for v in nodes)


def merge(
    gathered: np.ndarray, plans: tuple[RankPlan, ...], max_commit: int, k: int, order: list[int] | None = None
) -> tuple:
    """`lp.message.merge`'s outcome as (tokens, new, accepted, successors): the longest accepted
    path among the ranks agreeing with rank 0's y1 (ties to the lowest candidate), the columns'
    new tokens in rank order, and the successor rows x0, columns, nodes last to first (the ranks'
    nodes a tree's in `order`: by their place in the tree)."""
    head = gathered[:, :HEADER].tolist()
    y1 = head[0][0]
    if any(h[3:5] != head[0][3:5] for h in head):
        raise ValueError("ranks diverged")
    best = min(((-h[2], h[1], r) for r, h in enumerate(head) if h[0] == y1 and h[1] >= 0), default=None)
    tokens, accepted = [y1], 0
    if best is not None:
        accepted = -best[0]
        tokens = gathered[best[2], HEADER : HEADER + accepted + 1].tolist()
    start = HEADER + max_commit
    new = np.concatenate([gathered[r, start : start + len(p.columns)] for r, p in enumerate(plans)])
    if not k:
        return tokens, new, accepted, np.zeros((0, 1), dtype=np.int64)
    rows = gathered[:, start + len(new) :].reshape(len(plans), -1, 1 + k)
    cols = [1 + len(p.columns) for p in plans]
    nodes = [rows[r, c : c + len(p.candidates)] for r, (c, p) in enumerate(zip(cols, plans))]
    if order:  # rows of the nodes in pre-order, rank after rank: put back in the tree's order
        by_place = np.concatenate(nodes)
        place = {v: q for q, v in enumerate(order)}
        nodes = [by_place[[place[v] for v in range(len(order))]]]
    rows = [rows[0, :1]] + [rows[r, 1:c] for r, c in enumerate(cols)] + [n[::-1] for n in nodes[::-1]]
    return tokens, new, accepted, np.concatenate(rows)

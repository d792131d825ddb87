"""Shares that fill their buckets: a greedy step split over P > 1 ranks (docs/design.md section 4).

A step's tree is grown best first, so its root subtrees are as uneven as the drafts' chances: on
Spec-Bench a 1,024-token step often hangs nearly all its nodes below one root. Ranks that must
take whole root subtrees then get shares of hundreds of tokens beside empty ones. So a greedy
step's tree is laid out in pre-order (each subtree a run of nodes) and the ranks cut it anywhere
(lp/partition.py `search_split`): a rank feeds its run of nodes and, again, the ancestors of its
first node (in pre-order the only ones outside the run), which its nodes attend to. A rank
verifies only its own nodes, so every node is verified once, on one rank.

Each rank's forward is padded to a fixed-shape bucket (lp/engine/packed.py). A step of T
tokens over P ranks fills buckets of T / P tokens (`share_cap`); the pending tokens every rank
feeds and the ancestors fed again would push the largest share into the next bucket, which costs
far more than the few nodes it adds. So the tree is cut to the likeliest nodes that fit P shares
of the cap (`fitted_size`): the last ones its growth took, whose chance is the least. A wide
window is fed partly again on every rank (each feeds its columns' row-0 prefix), so where the
window alone would leave a rank's bucket little room for its share of the tree, the cap is the
next bucket (`TREE_ROOM`): the cut drops a tree's least likely nodes, never most of it.

Sampling (paper Algorithm 4) walks below the roots that share the accepted first token on one
rank, so sampled steps keep root subtrees whole (`Split.share` 0) and are not cut."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lp.engine.packed import bucket
from lp.jit import compiled
from lp.partition import Split, fill_split, partition

# The share of a step's tree every rank's bucket must leave room for, at least, beside the window's
# tokens: a cap that left less would cut most of the tree, not its least likely nodes.
TREE_ROOM = 0.75

if TYPE_CHECKING:
    from lp.config import DecodeConfig


def share_cap(cfg: DecodeConfig, P: int) -> int:
    """The most tokens one of P ranks feeds in a step of `cfg`: the bucket of an even share of its
    largest step, or the least larger one where the window alone leaves a rank less than
    `TREE_ROOM` of an even share of the tree (`window_share` with one pending token: a wide
    window's row-0 prefix is fed again on every rank); less one where N = 2 (its window reads a
    logits row more than it feeds tokens). 0: no cap (one rank takes the whole step, sampling
    keeps root subtrees whole, no tree)."""
    W, N, _, tree = cfg.step_shape
    if P < 2 or cfg.temperature > 0 or not tree:
        return 0
    room = math.ceil(TREE_ROOM * cfg.tree_limit / P)
    even = max(math.ceil(cfg.largest_step / P), window_share(W, N, P, 1) + room)
    return bucket(even) - (N == 2 and W > 0)


def window_share(W: int, N: int, P: int, pending: int) -> int:
    """The most tokens one of P ranks feeds for the window alone, its W columns split as the
    partitioner splits them (each rank also feeding its columns' row-0 prefix and `pending`)."""
    if W == 0:
        return pending
    return max(plan.cost(N, pending) for plan in partition(W, N, 0, P, (), candidate_tokens=1))


def largest_share(cfg: DecodeConfig, P: int) -> int:
    """The most rows one of P ranks' forward reads in a step of `cfg` (what its buckets are sized
    by): the largest step, or the share cap where P such shares hold the window; one more where
    N = 2 (its window reads a logits row more than it feeds tokens)."""
    W, N, _, _ = cfg.step_shape
    most, share = cfg.largest_step, share_cap(cfg, P)
    if share and cfg.fixed_tokens + P - 1 <= P * share:
        most = min(most, share)
    return most + (N == 2 and W > 0)


@compiled
def preorder(parents: np.ndarray) -> np.ndarray:
    """The nodes in pre-order (each subtree a run: a node, then its children's subtrees in index
    order), roots in index order, of a tree whose parents precede their children (-1: x0)."""
    n = len(parents)
    first, after, last = np.full(n + 1, -1, np.int64), np.full(n, -1, np.int64), np.full(n + 1, -1, np.int64)
    for v in range(n):  # children lists in index order; x0's at slot n
        p = parents[v] if parents[v] >= 0 else n
        if last[p] < 0:
            first[p] = v
        else:
            after[last[p]] = v
        last[p] = v
    order, stack, top = np.empty(n, np.int64), np.empty(n + 1, np.int64), 0
    at, i = first[n], 0
    while at >= 0 or top:
        if at < 0:
            top -= 1
            at = after[stack[top]]
            continue
        order[i], i = at, i + 1
        stack[top], top = at, top + 1
        at = first[at]
    return order


@compiled
def reordered(parents: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The parents and depths (1: x0's children) of a tree's nodes taken in `order`, where every
    parent comes before its children."""
    n = len(order)
    place = np.empty(n, np.int64)
    for q in range(n):
        place[order[q]] = q
    out, depth = np.empty(n, np.int64), np.empty(n, np.int64)
    for q in range(n):
        p = parents[order[q]]
        out[q] = place[p] if p >= 0 else -1
        depth[q] = depth[out[q]] + 1 if p >= 0 else 1
    return out, depth


@compiled
def rank_nodes(parents: np.ndarray, depth: np.ndarray, c: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """A rank's nodes c..d-1 of a tree in pre-order, after the ancestors of node c that it feeds
    again: their indices in the tree, and their parents as a tree of their own."""
    k = depth[c] - 1 if d > c else 0
    nodes, local = np.empty(k + d - c, np.int64), np.empty(k + d - c, np.int64)
    up = parents[c] if d > c else -1
    for j in range(k - 1, -1, -1):  # the ancestors, root first: each one's parent is the one before
        nodes[j], local[j], up = up, j - 1, parents[up]
    for q in range(c, d):
        p = parents[q]
        nodes[k + q - c] = q
        local[k + q - c] = k + p - c if p >= c else -1 if p < 0 else depth[p] - 1
    return nodes, local


@compiled
def fitted_size(W: int, N: int, P: int, cap: int, parents: np.ndarray, growth: np.ndarray) -> int:
    """How many of a tree's nodes, taken in the order its growth took them (`growth`: each node's
    place), P ranks of `cap` tokens each (one pending token included, as `search_split` counts)
    hold with the tree split in pre-order: all of them, or the most that fit (a binary search;
    the window alone is assumed to fit)."""
    out = np.empty((P, 4), np.int64)
    if fill_split(W, N, reordered(parents, preorder(parents))[1], P, cap, out):
        return len(parents)  # most steps: the whole tree fits
    lo, hi = 0, len(parents) - 1
    while lo < hi:
        size = (lo + hi + 1) // 2
        kept = first_grown(parents, growth, size)[1]
        if fill_split(W, N, reordered(kept, preorder(kept))[1], P, cap, out):
            lo = size
        else:
            hi = size - 1
    return lo


@compiled
def first_grown(parents: np.ndarray, growth: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The tree's first `size` nodes of its growth, in the tree's order, and their parents as a
    tree of their own (a parent was grown before its children, so each one's parent is kept)."""
    where, kept = np.full(len(parents), -1, np.int64), 0
    for v in range(len(parents)):
        if growth[v] < size:
            where[v], kept = kept, kept + 1
    nodes, out = np.empty(kept, np.int64), np.empty(kept, np.int64)
    for v in range(len(parents)):
        if growth[v] < size:
            nodes[where[v]] = v
            out[where[v]] = where[parents[v]] if parents[v] >= 0 else -1
    return nodes, out


@compiled
def fitted(
    split: Split,
    pending: int,
    tokens: np.ndarray,
    parents: np.ndarray,
    labels: np.ndarray,
    growth: np.ndarray,
    groups: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A step's tree cut to what its ranks' share cap holds (`Split.share`, lp/decode/shares.py):
    the nodes its growth took first (`growth`: each one's place), as tokens, parents, labels and
    the runs of root subtrees that share a first token; the tree itself where it fits."""
    W, N, P, _, share = split
    if P < 2 or share <= 0:
        return tokens, parents, labels, groups
    size = fitted_size(W, N, P, share - (pending - 1), parents, growth)
    if size >= len(parents):
        return tokens, parents, labels, groups
    nodes, kept = first_grown(parents, growth, size)
    tokens = tokens[nodes]
    starts = np.zeros(size + 1, np.int64)  # where each run of roots with one first token starts
    runs, last = 0, -1
    for v in range(size):
        if kept[v] < 0 and (runs == 0 or tokens[v] != last):
            starts[runs], runs, last = v, runs + 1, tokens[v]
    starts[runs] = size
    return tokens, kept, labels[nodes], starts[1 : runs + 1] - starts[:runs]


__all__ = [
    "first_grown",
    "fitted",
    "fitted_size",
    "largest_share",
    "preorder",
    "rank_nodes",
    "reordered",
    "share_cap",
    "window_share",
]

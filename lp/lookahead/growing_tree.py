"""The tree being grown best first (lp/lookahead/grow.py): its nodes so far, and the entries
waiting to make more, in a heap by chance (ties: the entry offered first)."""

from __future__ import annotations

import numpy as np
from numba.experimental import structref

from lp.jit import State, compiled


@structref.register
class GrowingTreeType(State):
    pass


class GrowingTree(structref.StructRefProxy):
    """A tree being grown: its nodes (token, parent, root, label, chance made at, first child and
    next sibling: `first_child[p + 1]`, x0's at 0) and the entries waiting to make more (each
    (parent, kind, row or chain or text position, position i in it, depth) in `entry`, in the
    order offered; a heap of their indices `waiting[:heap]` keyed by negated chance `keys`)."""


structref.define_proxy(
    GrowingTree,
    GrowingTreeType,
    [
        "tokens", "parents", "roots", "labels", "made", "first_child", "sibling", "size",
        "entry", "offered", "keys", "waiting", "heap",
    ],
)  # fmt: skip


@compiled
def new_growing_tree(budget: int, entries: int) -> GrowingTree:
    return GrowingTree(
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.float64),
        np.full(budget + 1, -1, np.int64),
        np.full(budget, -1, np.int64),
        0,
        np.empty((entries, 5), np.int64),
        0,
        np.empty(entries, np.float64),
        np.empty(entries, np.int64),
        0,
    )


@compiled
def offer(g: GrowingTree, key: float, parent: int, kind: int, seq: int, i: int, d: int) -> None:
    """Offer an entry of negated chance `key`: it waits in the heap (an entry leaves before another
    if likelier, or as likely and offered first)."""
    e = g.offered
    g.entry[e, 0], g.entry[e, 1], g.entry[e, 2], g.entry[e, 3], g.entry[e, 4] = parent, kind, seq, i, d
    g.offered += 1
    keys, waiting = g.keys, g.waiting
    j = g.heap
    while j > 0:  # a hole moves up from the end until its parent leaves first
        p = (j - 1) >> 1
        if keys[p] < key or (keys[p] == key and waiting[p] < e):
            break
        keys[j], waiting[j] = keys[p], waiting[p]
        j = p
    keys[j], waiting[j] = key, e
    g.heap += 1


@compiled
def take(g: GrowingTree) -> int:
    """The likeliest waiting entry, taken from the heap: the last one's hole moves down from the top."""
    keys, waiting = g.keys, g.waiting
    top = waiting[0]
    g.heap -= 1
    h = g.heap
    key, e = keys[h], waiting[h]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= h:
            break
        if c + 1 < h and (keys[c + 1] < keys[c] or (keys[c + 1] == keys[c] and waiting[c + 1] < waiting[c])):
            c += 1
        if not (keys[c] < key or (keys[c] == key and waiting[c] < e)):
            break
        keys[j], waiting[j] = keys[c], waiting[c]
        j = c
    keys[j], waiting[j] = key, e
    return top


@compiled
def waits_first(g: GrowingTree, key: float) -> bool:
    """Whether a waiting entry is at least as likely as one of negated chance `key`."""
    return g.heap > 0 and g.keys[0] <= key


@compiled
def child_of(g: GrowingTree, parent: int, token: int) -> int:
    """Node `parent`'s child of `token`, or -1."""
    node = g.first_child[parent + 1]
    while node >= 0 and g.tokens[node] != token:
        node = g.sibling[node]
    return node


@compiled
def add_node(g: GrowingTree, parent: int, token: int, label: int, key: float) -> int:
    """A new node of `token` below `parent`, made at negated chance `key`."""
    node = g.size
    g.size += 1
    g.tokens[node], g.parents[node], g.labels[node], g.made[node] = token, parent, label, key
    g.roots[node] = node if parent < 0 else g.roots[parent]
    g.sibling[node] = g.first_child[parent + 1]
    g.first_child[parent + 1] = node
    return node


@compiled
def in_subtree_order(
    g: GrowingTree,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The nodes in subtree order (grouped by their root, roots by index, each group in growth
    order, lp/lookahead/tree.py): tokens, parents, labels, each one's place in the growth, the
    node counts of the root subtrees; and each node's chance in growth order (non-increasing:
    the growth takes the likeliest first, and a child is never likelier than its parent)."""
    size, roots = g.size, g.roots
    count = np.zeros(size, np.int64)
    for v in range(size):
        count[roots[v]] += 1
    offset = np.zeros(size, np.int64)
    total = groups = 0
    for r in range(size):
        offset[r] = total
        total += count[r]
        groups += count[r] > 0
    order = np.empty(size, np.int64)
    for v in range(size):
        order[offset[roots[v]]] = v
        offset[roots[v]] += 1
    where = np.empty(size, np.int64)
    for j in range(size):
        where[order[j]] = j
    tokens, parents, labels = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
    for j in range(size):
        v = order[j]
        tokens[j], labels[j] = g.tokens[v], g.labels[v]
        parents[j] = where[g.parents[v]] if g.parents[v] >= 0 else -1
    sizes = np.empty(groups, np.int64)
    j = 0
    for r in range(size):
        if count[r]:
            sizes[j] = count[r]
            j += 1
    return tokens, parents, labels, order, sizes, -g.made[:size]


__all__ = [
    "GrowingTree",
    "add_node",
    "child_of",
    "in_subtree_order",
    "new_growing_tree",
    "offer",
    "take",
    "waits_first",
]

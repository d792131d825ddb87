"""The verification branch as a token tree: candidates that start alike share their first
tokens, so a step verifies each distinct prefix once (a trie of the drafts under x0).

A tree is a flat list of nodes in subtree order: every node follows its parent, and each
subtree of the root (a node whose parent is x0, -1) is contiguous, so a rank can take whole
subtrees as one index range (lp/partition.py). Subtrees that start with the same token are
adjacent (sampling needs them on one rank). Without sharing (`share=False`) every draft is
its own chain: the classic verification branch of G n-grams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(eq=False)  # not frozen: made after every message read, and a frozen one costs 4x to make
class DraftTree:
    """`tokens[i]` is node i's draft token, `parent_array[i]` its parent node (-1: x0), int64
    (given as any sequence of ints); `parents` the same as a tuple, made when first read (the
    decode reads the array: a tuple of a few hundred ints costs microseconds after every
    message read)."""

    tokens: np.ndarray
    parent_array: np.ndarray
    known_groups: np.ndarray | tuple[int, ...] | None = field(default=None, repr=False)  # `groups()`, if known

    def __post_init__(self) -> None:
        if not isinstance(self.parent_array, np.ndarray) or self.parent_array.dtype != np.int64:
            self.parent_array = np.asarray(self.parent_array, dtype=np.int64)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        return tuple(self.parent_array.tolist())

    @property
    def size(self) -> int:
        return len(self.parent_array)

    @property
    def depth(self) -> np.ndarray:
        """Each node's depth below x0 (1 for x0's children)."""
        return node_depths(self.parents)

    @property
    def roots(self) -> np.ndarray:
        """Indices of x0's children, in order."""
        return np.flatnonzero(self.parent_array < 0)

    def groups(self) -> tuple[int, ...]:
        """Node counts of the runs of adjacent root subtrees that share their first token."""
        if self.known_groups is not None:
            return tuple(self.known_groups.tolist()) if isinstance(self.known_groups, np.ndarray) else self.known_groups
        roots = self.roots
        if not len(roots):
            return ()
        starts = roots[np.r_[True, self.tokens[roots[1:]] != self.tokens[roots[:-1]]]]
        return tuple(np.diff(np.r_[starts, self.size]).tolist())

    def slice(self, start: int, stop: int) -> DraftTree:
        """Nodes start..stop-1 (whole root subtrees) as a tree of their own."""
        if start == 0 and stop == self.size:
            return self
        inside = self.parents[start:stop]  # Python: a rank's share is a few dozen nodes
        if (inside and inside[0] >= 0) or any(0 <= p < start for p in inside):
            raise ValueError(f"nodes {start}..{stop - 1} are not whole subtrees")
        return DraftTree(self.tokens[start:stop], tuple([p - start if p >= 0 else -1 for p in inside]))


def node_depths(parents: Sequence[int]) -> np.ndarray:
    """Each node's depth below x0 (1 for x0's children), given parent pointers that precede
    their children (-1: x0)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return np.asarray(depth, dtype=np.int64)


def chain_parents(G: int, L: int) -> tuple[int, ...]:
    """Parent pointers of G unshared chains of L tokens (node c*L + k is chain c's token k)."""
    return tuple(-1 if k == 0 else c * L + k - 1 for c in range(G) for k in range(L))


class TreeBuilder:
    """Builds a tree within `budget` nodes from drafts inserted best first (`add`); the tree grown
    best first across all sources is lp/lookahead/grow.py's. Shared prefixes cost nothing; without
    sharing (`share=False`) every draft is a chain of its own."""

    def __init__(self, budget: int, share: bool = True) -> None:
        self.budget, self.share = budget, share
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._roots: list[int] = []  # each node's root ancestor
        self._index: dict[int, int] = {}  # pair_key(parent, token) -> node, when sharing

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def _new(self, parent: int, token: int) -> int | None:
        """A new node of `token` under `parent`, or None when the budget is spent."""
        node = len(self.tokens)
        if node >= self.budget:
            return None
        if self.share:
            self._index[parent << 32 | token] = node  # pair_key, inlined
        self.tokens.append(token)
        self.parents.append(parent)
        self._roots.append(node if parent < 0 else self._roots[parent])
        return node

    def add(self, draft: Sequence[int]) -> None:
        """Insert a draft below x0, truncated where the budget runs out."""
        index, new = self._index if self.share else {}, self._new
        node: int | None = -1
        for token in draft:  # runs for every draft token of every step
            found = index.get(node << 32 | token)  # pair_key, inlined
            node = new(node, int(token)) if found is None else found
            if node is None:
                return

    def tree(self) -> DraftTree:
        """The tree so far in subtree order: root subtrees grouped by first token, in the order
        the tokens first appeared; within a subtree, nodes in insertion order (a parent before
        its children, siblings best first)."""
        roots = np.asarray(self._roots, dtype=np.int64)
        tokens = np.asarray(self.tokens, dtype=np.int64)
        if self.share:  # one root per first token: a group is a root's subtree
            order = np.argsort(roots, kind="stable")
            sizes = np.bincount(roots, minlength=1)
            groups = tuple(sizes[sizes > 0].tolist())
        else:  # roots with the same first token adjacent: keyed by the first such root
            first: dict[int, int] = {}
            group = np.asarray([first.setdefault(self.tokens[r], r) for r in self._roots], dtype=np.int64)
            order = np.lexsort((roots, group))  # then node index: stable
            groups = None
        # each node's new index, and -1 at index -1: x0 stays the parent of the roots
        where = np.empty(len(order) + 1, dtype=np.int64)
        where[order] = np.arange(len(order))
        where[-1] = -1
        parents = where[np.asarray(self.parents, dtype=np.int64)[order]]
        return DraftTree(tokens[order], parents, groups)


def build_tree(drafts: Sequence[Sequence[int]], budget: int, share: bool = True) -> DraftTree:
    """The tree of `drafts` (best first) within `budget` nodes: drafts are inserted in order,
    each adding the nodes its prefix does not share, the last one truncated to what is left."""
    builder = TreeBuilder(budget, share)
    for draft in drafts:
        if builder.full:
            break
        builder.add(draft)
    return builder.tree()


__all__ = ["DraftTree", "TreeBuilder", "build_tree", "chain_parents", "node_depths"]

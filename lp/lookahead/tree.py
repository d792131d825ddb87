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
from dataclasses import dataclass
from itertools import repeat

import numpy as np


@dataclass(frozen=True, eq=False)
class DraftTree:
    """`tokens[i]` is node i's draft token, `parents[i]` its parent node (-1: x0)."""

    tokens: np.ndarray
    parents: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> np.ndarray:
        """Each node's depth below x0 (1 for x0's children)."""
        depth = np.zeros(self.size, dtype=np.int64)
        for i, p in enumerate(self.parents):
            depth[i] = 1 if p < 0 else depth[p] + 1
        return depth

    @property
    def roots(self) -> np.ndarray:
        """Indices of x0's children, in order."""
        return np.flatnonzero(np.asarray(self.parents, dtype=np.int64) < 0)

    def groups(self) -> tuple[int, ...]:
        """Node counts of the runs of adjacent root subtrees that share their first token."""
        roots = self.roots
        if not len(roots):
            return ()
        starts = roots[np.r_[True, self.tokens[roots[1:]] != self.tokens[roots[:-1]]]]
        return tuple(np.diff(np.r_[starts, self.size]).tolist())

    def slice(self, start: int, stop: int) -> "DraftTree":
        """Nodes start..stop-1 (whole root subtrees) as a tree of their own."""
        parents = tuple(p - start if p >= 0 else -1 for p in self.parents[start:stop])
        if any(p >= stop - start for p in parents) or (stop > start and self.parents[start] >= 0):
            raise ValueError(f"nodes {start}..{stop - 1} are not whole subtrees")
        return DraftTree(self.tokens[start:stop], parents)


def chain_parents(G: int, L: int) -> tuple[int, ...]:
    """Parent pointers of G unshared chains of L tokens (node c*L + k is chain c's token k)."""
    return tuple(-1 if k == 0 else c * L + k - 1 for c in range(G) for k in range(L))


def build_tree(drafts: Sequence[Sequence[int]], budget: int, share: bool = True,
               grafts: tuple[Sequence[int], Sequence[int]] = ((), ())) -> DraftTree:
    """The tree of `drafts` (best first) within `budget` nodes: drafts are inserted in order,
    each adding the nodes its prefix does not share, the last one truncated to what is left.
    Then `grafts`, nodes given as `(parents, tokens)` (parent -1: x0; parents first, as
    SuccessorTable.drafts makes them), are inserted one by one while the budget lasts (without
    sharing, each of their leaves' paths is one more draft).
    Root subtrees are then laid out grouped by first token, in the order the tokens first
    appear, nodes in depth-first order."""
    if not share and grafts[1]:
        drafts = [*drafts, *_leaf_paths(*grafts)]
    root: dict = {}  # key -> (token, children)
    used = 0
    for i, draft in enumerate(drafts):
        level = root
        for k, tok in enumerate(draft):
            key = tok if share or k > 0 else (tok, i)  # unshared: one root child per draft
            node = level.get(key)
            if node is None:
                if used == budget:
                    break
                node = level[key] = (int(tok), {})
                used += 1
            level = node[1]
        if used == budget:
            break
    if share:
        placed: list[dict | None] = []  # each graft's children, None where the budget cut it off
        for parent, tok in zip(*grafts):
            level = root if parent < 0 else placed[parent]
            node = level.get(tok) if level is not None else None
            if node is None and level is not None and used < budget:
                node = level[tok] = (int(tok), {})
                used += 1
            placed.append(node[1] if node is not None else None)
    rank = {}
    for tok, _ in root.values():
        rank.setdefault(tok, len(rank))
    tokens: list[int] = []
    parents: list[int] = []
    stack = [(node, -1) for node in reversed(sorted(root.values(), key=lambda n: rank[n[0]]))]
    while stack:
        (tok, kids), parent = stack.pop()
        here = len(tokens)
        parents.append(parent)
        tokens.append(tok)
        if kids:
            stack.extend(zip(reversed(kids.values()), repeat(here)))
    return DraftTree(np.asarray(tokens, dtype=np.int64), tuple(parents))


def _leaf_paths(parents: Sequence[int], tokens: Sequence[int]) -> list[tuple[int, ...]]:
    """The token paths from x0 to each leaf of a node list (parents first), in leaf order."""
    paths: list[tuple[int, ...]] = []
    inner = set(parents)
    for p, tok in zip(parents, tokens):
        paths.append((paths[p] if p >= 0 else ()) + (int(tok),))
    return [path for i, path in enumerate(paths) if i not in inner]


__all__ = ["DraftTree", "build_tree", "chain_parents"]

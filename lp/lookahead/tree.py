"""The verification branch as a token tree: candidates that start alike share their first
tokens, so a step verifies each distinct prefix once (a trie of the drafts under x0).

A tree is a flat list of nodes in subtree order: every node follows its parent, and each
subtree of the root (a node whose parent is x0, -1) is contiguous, so a rank can take whole
subtrees as one index range (lp/partition.py). Subtrees that start with the same token are
adjacent (sampling needs them on one rank). Without sharing (`share=False`) every draft is
its own chain: the classic verification branch of G n-grams.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from heapq import heappop, heappush

import numpy as np


@dataclass(frozen=True, eq=False)
class DraftTree:
    """`tokens[i]` is node i's draft token, `parents[i]` its parent node (-1: x0)."""

    tokens: np.ndarray
    parents: tuple[int, ...]
    known_groups: tuple[int, ...] | None = field(default=None, repr=False)  # `groups()`, if the maker knows

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> np.ndarray:
        """Each node's depth below x0 (1 for x0's children)."""
        return node_depths(self.parents)

    @cached_property
    def parent_array(self) -> np.ndarray:
        """`parents` as an int64 array."""
        return np.asarray(self.parents, dtype=np.int64)

    @property
    def roots(self) -> np.ndarray:
        """Indices of x0's children, in order."""
        return np.flatnonzero(self.parent_array < 0)

    def groups(self) -> tuple[int, ...]:
        """Node counts of the runs of adjacent root subtrees that share their first token."""
        if self.known_groups is not None:
            return self.known_groups
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


Chain = tuple[Sequence[int], Sequence[float], int]
"""A draft for `TreeBuilder.grow`: its tokens, each token's chance of being right when the
tokens before it are, and the label of its first node (token i's node: label + i)."""


def pair_key(first: int | np.ndarray, second: int | np.ndarray) -> int | np.ndarray:
    """One int for a pair of tokens (or of a node index >= -1 and a token): `first << 32 | second`,
    distinct for every pair with 0 <= second < 2**32. Ints or int64 arrays: a dict keyed by one int
    is read faster than one keyed by tuples (which each lookup would build)."""
    return first << 32 | second


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
    """Grows a tree within `budget` nodes: drafts (`add`), then the likeliest nodes of drafts
    and of a successor table's paths, best first (`grow`). Shared prefixes cost nothing; without sharing
    (`share=False`) every draft is a chain of its own."""

    def __init__(self, budget: int, share: bool = True) -> None:
        self.budget, self.share = budget, share
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._roots: list[int] = []  # each node's root ancestor
        self._index: dict[int, int] = {}  # pair_key(parent, token) -> node, when sharing
        self.labels: list[int] = []  # each node's chain label (`grow`), -1 where it has none
        self._grown = False  # `grow` has run: `add` would miss the nodes it made

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def _new(self, parent: int, token: int) -> int | None:
        """A new node of `token` under `parent`, or None when the budget is spent (`grow` has
        these lines inlined: keep the two alike)."""
        node = len(self.tokens)
        if node >= self.budget:
            return None
        if self.share:
            self._index[parent << 32 | token] = node  # pair_key, inlined
        self.tokens.append(token)
        self.parents.append(parent)
        self._roots.append(node if parent < 0 else self._roots[parent])
        self.labels.append(-1)
        return node

    def path_nodes(self, path: Sequence[int]) -> list[int]:
        """The nodes along a token path from x0, as far as the tree has it. Sharing only."""
        nodes, node, find = [], -1, self._index.get
        for token in path:
            node = find(node << 32 | token)  # pair_key, inlined
            if node is None:
                break
            nodes.append(node)
        return nodes

    def add(self, draft: Sequence[int]) -> None:
        """Insert a draft below x0, truncated where the budget runs out."""
        if self._grown:
            raise ValueError("drafts are added before the tree is grown")
        index, new = self._index if self.share else {}, self._new
        node: int | None = -1
        for token in draft:  # runs for every draft token of every step
            found = index.get(node << 32 | token)  # pair_key, inlined
            node = new(node, int(token)) if found is None else found
            if node is None:
                return

    def grow(
        self,
        x0: int,
        successors: Mapping[int, list[int]],
        rates: Sequence[float],
        depth: int,
        chains: Sequence[Chain] = (),
        pairs: Mapping[int, list[int]] | None = None,
        before: int = -1,
    ) -> None:
        """Graft the likeliest nodes below x0 until the budget is spent, most likely first, from
        two kinds of source that compete on one scale, a node's estimated chance of being right:
          * `chains`: drafts (tokens, chances, label), `chances[i]` the chance that token i is
            right when the tokens before it are; its nodes are labelled `label + i` (`labels`);
          * the successor table: `successors[t]` lists the k distinct tokens expected after
            token t, best first (absent where unknown), the rank-r one right with chance
            `rates[r]` (non-increasing in r); it grows on every node, at most `depth` deep;
            `pairs[pair_key(a, t)]`, where given, lists those expected after t when a comes before it,
            preferred to `successors[t]` (`before`: the token before x0).
        A node's chance is its parent's times its own rate. Nodes the tree already has cost
        nothing and are grown on. Sharing only. The builder's last call: `add` refuses after it."""
        if self._grown:
            raise ValueError("a tree is grown once (best first over all its sources)")
        self._grown = True
        if not self.share:
            return
        tokens, parents, roots, labels, budget = self.tokens, self.parents, self._roots, self.labels, self.budget
        # the loop runs for most of a real step's nodes: every name it calls is a local
        index, row_of, pair_of = self._index, successors.get, (pairs or {}).get
        find = index.get
        old = size = len(tokens)
        made: list[float] = []  # each grown node's chance (negated): the best estimate, it came first
        k, q0 = len(rates), rates[0] if rates else 0.0
        # Best-first over entries (parent node, a row or a chain, position i in it, depth, the
        # chain's chances or None for a row, the chain's label): a taken entry offers the next
        # token (a row's next sibling, a chain's next token) and the node's successors, so few
        # wait. Entries of equal chance leave in the order they came, as (-chance, arrival) keys
        # in one heap would: one FIFO per chance, the chances in a heap (a real step's entries
        # share a few dozen distinct chances).
        chances: list[float] = []
        waiting: dict[float, list[tuple]] = {}  # lists, not deques: most hold one entry

        def wait(chance: float, entry: tuple) -> None:
            queue = waiting.get(chance)
            if queue is None:
                waiting[chance] = [entry]
                heappush(chances, chance)
            else:
                queue.append(entry)

        for chain, rate, label in chains:
            if len(chain):
                wait(-rate[0], (-1, chain, 0, 1, rate, label))
        row = pair_of(pair_key(before, x0)) or row_of(x0)
        if k and depth >= 1 and row is not None:
            wait(-q0, (-1, row, 0, 1, None, -1))
        while chances:
            neg = chances[0]
            queue = waiting[neg]
            parent, seq, i, d, rate, label = queue.pop(0)
            if not queue:
                heappop(chances)
                del waiting[neg]
            while True:  # an entry that would leave next is taken at once (see below)
                token = seq[i]
                key = parent << 32 | token  # pair_key, inlined (as below)
                node = find(key)
                new = node is None
                if new:  # `_new`, inlined
                    if size >= budget:
                        return
                    node = size
                    size += 1
                    index[key] = node
                    tokens.append(token)
                    parents.append(parent)
                    roots.append(node if parent < 0 else roots[parent])
                    labels.append(label if rate is None else label + i)
                    made.append(neg)
                # a node is grown on once: where it is made (or, made before `grow`, where reached)
                below = None
                if k and d < depth and (new or node < old):
                    below = pair_of((tokens[parent] if parent >= 0 else x0) << 32 | token) or row_of(token)
                if rate is None:
                    # a row offers its next sibling, then the node's successors: the likelier of the
                    # two goes on at once when nothing waiting is as likely (it would leave next:
                    # the sibling first at equal chances, as it comes first), the other waits
                    sibling = neg / rates[i] * rates[i + 1] if i + 1 < k else None
                    child = neg * q0 if below is not None else None
                    if child is not None and (sibling is None or child < sibling):
                        if sibling is not None:
                            wait(sibling, (parent, seq, i + 1, d, None, -1))
                        if chances and chances[0] <= child:
                            wait(child, (node, below, 0, d + 1, None, -1))
                            break
                        parent, seq, i, d, neg = node, below, 0, d + 1, child
                    elif sibling is not None:
                        if chances and chances[0] <= sibling:
                            wait(sibling, (parent, seq, i + 1, d, None, -1))
                            if child is not None:
                                wait(child, (node, below, 0, d + 1, None, -1))
                            break
                        if child is not None:
                            wait(child, (node, below, 0, d + 1, None, -1))
                        i, neg = i + 1, sibling
                    else:
                        break
                    continue
                if below is not None:
                    wait(neg * q0, (node, below, 0, d + 1, None, -1))
                if i + 1 >= len(seq):
                    break
                # a chain goes on from its node's chance: another source's, if it made the node first
                neg = (neg if new or node < old else made[node - old]) * rate[i + 1]
                parent, i, d = node, i + 1, d + 1
                if chances and chances[0] <= neg:
                    wait(neg, (parent, seq, i, d, rate, label))
                    break

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
        return DraftTree(tokens[order], tuple(parents.tolist()), groups)

    def leaf_paths(self) -> list[tuple[int, ...]]:
        """The token path from x0 to each leaf, in insertion order."""
        paths: list[tuple[int, ...]] = []
        for p, token in zip(self.parents, self.tokens):
            paths.append((paths[p] if p >= 0 else ()) + (token,))
        inner = set(self.parents)
        return [path for i, path in enumerate(paths) if i not in inner]


def build_tree(drafts: Sequence[Sequence[int]], budget: int, share: bool = True) -> DraftTree:
    """The tree of `drafts` (best first) within `budget` nodes: drafts are inserted in order,
    each adding the nodes its prefix does not share, the last one truncated to what is left."""
    builder = TreeBuilder(budget, share)
    for draft in drafts:
        if builder.full:
            break
        builder.add(draft)
    return builder.tree()


__all__ = ["Chain", "DraftTree", "TreeBuilder", "build_tree", "chain_parents", "node_depths", "pair_key"]

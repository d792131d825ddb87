"""One verification tree grown best first across all draft sources: each node's estimated
chance of being right is its parent's times its source's rate, and the tree takes the likeliest
nodes below x0 until its budget is spent. Two kinds of source compete on that one scale:
  * chains: drafts (the text's continuations, pool n-grams, the window's row 0), token i of a
    draft right with chance `chances[source, i]` when the tokens before it are (the rates that
    lp/lookahead/rates.py counts);
  * the successor table (lp/lookahead/successors.py): the k tokens expected after a node's
    token, the rank-r one right with chance `rates[r]` (non-increasing in r); it grows on every
    node, at most `depth` deep.
Nodes that several sources make are made once (the first, likeliest, maker's chance counts) and
grown on.

A step grows a few hundred nodes after its message is read, so the growth is one compiled loop
(numba): in Python it costs about a microsecond a node."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lp.lookahead.loops import grow_tree
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import DraftTree


class Chains(NamedTuple):
    """Drafts for `grow`: draft c is `tokens[starts[c] : starts[c + 1]]`, from source
    `sources[c]` (its row of chances, and its nodes' labels)."""

    tokens: np.ndarray
    starts: np.ndarray
    sources: np.ndarray


NO_CHAINS = Chains(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64))


class Follow(NamedTuple):
    """Where the text went on after the tree's tokens before, for `grow`: below a node (not
    itself made by one of these), the `text` (x0 last) after an earlier occurrence of its token,
    at most `length` tokens: of its newest few (WALK + 1), the newest of those whose tokens
    before it match the node's path (its ancestors', x0's, then the text's before x0) longest,
    up to MATCHED tokens (lp/lookahead/loops.py); token i right with chance `chances[source + m,
    i]` when the ones before it are, for a match of m tokens. `latest` and `earlier`:
    `occurrences`' arrays, kept between a sequence's growths (each brings them up to date with
    the text's new tokens)."""

    text: np.ndarray
    latest: np.ndarray
    earlier: np.ndarray
    length: int
    source: int


def occurrences(vocab: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """`Follow.latest` and `Follow.earlier` for a new sequence of at most `positions` tokens: per
    token, its newest position with a known follower (-1: none) and, last, the positions seen;
    per position, the one before it of the same token."""
    latest = np.full(vocab + 1, -1, np.int64)
    latest[-1] = 0
    return latest, np.full(positions, -1, np.int64)


NO_FOLLOW = Follow(np.zeros(0, np.int64), *occurrences(0, 0), 0, 0)


class Grown(NamedTuple):
    """A grown tree (in subtree order, lp/lookahead/tree.py) and, per node: its label (source s's
    token i: `s * depth + i`, the counted rate's index; -1: the successor table's), its parent
    as an array, and its place in the growth (most likely first). Named tuples, as `Chains`: a
    step makes one of each after its message is read, where frozen dataclasses cost several
    times more to make."""

    tree: DraftTree
    labels: np.ndarray
    parents: np.ndarray
    order: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """Each node's token (the tree's)."""
        return self.tree.tokens

    def leaf_paths(self) -> list[tuple[int, ...]]:
        """The token path from x0 to each leaf, leaves in the order they were grown."""
        tokens, parents = self.tree.tokens.tolist(), self.parents.tolist()
        paths: list[tuple[int, ...]] = []
        for p, token in zip(parents, tokens):  # parents precede children
            paths.append((paths[p] if p >= 0 else ()) + (token,))
        inner = set(parents)
        leaves = [i for i in range(len(paths)) if i not in inner]
        return [paths[i] for i in sorted(leaves, key=self.order.__getitem__)]


class Labelled(NamedTuple):
    """A grown tree's nodes as its outcome is counted (lp/lookahead/rates.py): tokens, parents and
    labels (`Grown`'s, without the tree: its step's plan makes the tree when read)."""

    tokens: np.ndarray
    parents: np.ndarray
    labels: np.ndarray


def grow(
    budget: int,
    x0: int,
    depth: int,
    chains: Chains = NO_CHAINS,
    chances: np.ndarray | None = None,
    table: SuccessorTable | None = None,
    before: int = -1,
    follow: Follow = NO_FOLLOW,
) -> Grown:
    """The likeliest nodes below x0, at most `budget`: from `chains` (token i of a draft from
    source s right with chance `chances[s, i]` when the ones before it are; `chances`
    `[sources, length]`) and from `table`'s successor rows, at most `depth` deep (`before`: the
    token before x0, whose pair row with x0 is preferred). Entries of equal chance are taken in
    the order they were offered: the chains in order, then x0's row; a taken row offers its next
    sibling, then its node's successors; a taken chain token its node's successors, then the
    chain's next token. With `follow`, a new node not made by it also offers the text's
    continuation after an earlier occurrence of its token (`Follow`), before its successors."""
    if chances is None:
        chances = np.zeros((0, 1))
    tokens, parents, labels, order, groups = grow_tree(
        budget, x0, before, depth, chains.tokens, chains.starts, chains.sources, chances, *successor_arrays(table),
        follow.text, len(follow.text), follow.latest, follow.earlier, follow.length, follow.source,
    )  # fmt: skip
    return grown_of(tokens, parents, labels, order, groups)


def successor_arrays(table: SuccessorTable | None) -> tuple[np.ndarray, ...]:
    """What `grow_tree` reads of a successor table: its rank counts, token rows, pair rows, pair
    index, staged rows and their hash (without one: a table of no successors)."""
    if table is None:
        return _NO_TABLE
    return table.hits, table.table, table.pairs, table.index, table.staged, table.stage


def grown_of(
    tokens: np.ndarray, parents: np.ndarray, labels: np.ndarray, order: np.ndarray, groups: np.ndarray
) -> Grown:
    """`grow_tree`'s arrays as a Grown."""
    return Grown(DraftTree(tokens, parents, groups), labels, parents, order)


# no successor table: no counts past the "none of them" one (k = 0), one empty row and slot, no
# staged row and an empty stage
_NO_TABLE = (
    np.ones(1, np.int64),
    np.zeros((1, 1), np.int32),
    np.zeros((1, 1), np.int32),
    np.full((1, 2), -1, np.int64),
    np.zeros((0, 1), np.int64),
    np.full((1, 2), -1, np.int64),
)


__all__ = [
    "NO_CHAINS", "NO_FOLLOW", "Chains", "Follow", "Grown", "Labelled", "grow", "grown_of", "occurrences",
    "successor_arrays",
]  # fmt: skip

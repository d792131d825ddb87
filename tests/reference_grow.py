"""A plain reference of the best-first tree growth (lp/lookahead/grow.py) and of the successor
table's update, for randomized equality tests: Python dicts and one heap of entries keyed
(-chance, arrival), a taken entry making (or finding) one node and offering what follows it."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lp.lookahead.chains import Chains, add, new_chains
from lp.lookahead.grow import WALK, grow
from lp.lookahead.sources import MATCHED
from lp.lookahead.successors import SuccessorTable, new_table
from lp.lookahead.text import TextIndex
from lp.lookahead.tree import DraftTree, TreeBuilder


def chains_of(drafts: Sequence[Sequence[int]], sources: Sequence[int]) -> Chains:
    """Drafts (lists or tuples of tokens) and their sources as `grow`'s chains."""
    chains = new_chains(len(drafts), sum(map(len, drafts)))
    for draft, source in zip(drafts, sources):
        add(chains, np.asarray(draft, dtype=np.int64), 0, len(draft), source)
    return chains


@dataclass(frozen=True)
class Grown:
    """lp's grown tree (in subtree order) and, per node, its label and place in the growth."""

    tree: DraftTree
    labels: np.ndarray
    order: np.ndarray

    @property
    def parents(self) -> np.ndarray:
        return self.tree.parent_array

    def leaf_paths(self) -> list[tuple[int, ...]]:
        """The token path from x0 to each leaf, leaves in the order they were grown."""
        tokens, parents = self.tree.tokens.tolist(), self.parents.tolist()
        paths: list[tuple[int, ...]] = []
        for p, token in zip(parents, tokens):
            paths.append((paths[p] if p >= 0 else ()) + (token,))
        inner = set(parents)
        return [paths[i] for i in sorted((i for i in range(len(paths)) if i not in inner), key=self.order.__getitem__)]


def lp_grow(
    budget: int,
    text: Sequence[int],
    depth: int,
    chains: Chains | None = None,
    chances: np.ndarray | None = None,
    table: SuccessorTable | None = None,
    continuation_len: int = 0,
    vocab: int = 64,
) -> Grown:
    """lp's growth (lp/lookahead/grow.py) below the last token of `text` (the one before it: the
    pair rows' context), its continuations indexed over tokens below `vocab`."""
    index = TextIndex(text, vocab=vocab if continuation_len else 0)
    chances = np.zeros((1, 1)) if chances is None else np.asarray(chances, dtype=np.float64)
    table = new_table(0, 1, 1) if table is None else table
    tokens, parents, labels, order, groups, _ = grow(
        index, chains or new_chains(0, 0), chances, table, budget, depth, continuation_len
    )
    return Grown(DraftTree(tokens, parents, groups), labels, order)


class DictTable:
    """The successor table as dicts: `next[t]` and `pairs[(before, t)]` -> the k successors."""

    def __init__(self, k: int) -> None:
        self.k, self.next, self.pairs = k, {}, {}
        self.hits = [1] * (k + 1)

    def update(self, rows: np.ndarray, keys: Sequence[int] = (), first: int = -1) -> None:
        lists = [tuple(r) for r in rows[:, 1:].tolist()]
        if not lists:
            return
        if first >= 0:
            self.pairs[first] = lists[0]
        for key, row in zip(keys, lists[len(lists) - len(keys) :]):
            self.pairs[key] = row
        self.next.update(zip(rows[:, 0].tolist(), lists))

    def row(self, before: int, token: int) -> tuple[int, ...] | None:
        return self.pairs.get(before << 32 | token) or self.next.get(token) if before >= 0 else self.next.get(token)

    def observe(self, tokens: Sequence[int]) -> None:
        for before, last, token in zip(tokens, tokens[1:], tokens[2:]):
            row = self.row(before, last)
            if row is not None:
                self.hits[row.index(token) if token in row else self.k] += 1

    def rates(self) -> list[float]:
        total = sum(self.hits)
        rates = [h / total for h in self.hits[: self.k]]
        for r in range(1, self.k):
            rates[r] = min(rates[r], rates[r - 1])
        return rates


def reference_grow(
    budget: int,
    x0: int,
    depth: int,
    drafts: Sequence[Sequence[int]] = (),
    sources: Sequence[int] = (),
    chances: np.ndarray | None = None,
    table: DictTable | None = None,
    before: int = -1,
    text: Sequence[int] = (),
    follow: int = 0,
    follow_source: int = 0,
) -> tuple[list[int], list[int], list[int]]:
    """The grown nodes in the order they were made: (tokens, parents, labels). With `follow`, a
    new node not made by a continuation offers the `text`'s (x0 last) after an occurrence of its
    token before the last position, at most `follow` tokens: of the newest WALK + 1, the first
    whose tokens before it match the node's path (then the text before x0) longest, up to
    MATCHED, from `follow_source` + that length."""
    seen: dict[int, list[int]] = {}  # each token's positions before the last, newest first
    for e, t in enumerate(text[:-1]):
        seen.setdefault(t, []).insert(0, e)

    def continuation(token: int, parent: int) -> tuple[int, int] | None:
        """(the source, where the continuation starts) for a node of `token` below `parent`."""
        if token not in seen:
            return None
        path = []  # the tokens before the node, nearest first
        while parent >= 0:
            path.append(tokens[parent])
            parent = parents[parent]
        path += list(reversed(text))
        lengths = []
        for e in seen[token][: WALK + 1]:
            m = 0
            while m < MATCHED and e - 1 - m >= 0 and m < len(path) and text[e - 1 - m] == path[m]:
                m += 1
            lengths.append((m, e))
        m, e = max(lengths, key=lambda x: x[0])  # the first of the longest
        return follow_source + m, e + 1

    rates = table.rates() if table is not None else []
    k, D = len(rates), chances.shape[1] if chances is not None else 1
    tokens: list[int] = []
    parents: list[int] = []
    labels: list[int] = []
    chance: list[float] = []
    index: dict[tuple[int, int], int] = {}
    heap: list = []
    arrival = 0

    def offer(neg: float, parent: int, kind: str, seq, i: int, d: int) -> None:
        nonlocal arrival
        heapq.heappush(heap, (neg, arrival, parent, kind, seq, i, d))
        arrival += 1

    for c, draft in enumerate(drafts):
        if len(draft):
            offer(-float(chances[sources[c], 0]), -1, "chain", c, 0, 1)
    root_row = table.row(before, x0) if table is not None else None
    if k and depth >= 1 and root_row is not None:
        offer(-rates[0], -1, "row", root_row, 0, 1)
    while heap:
        neg, _, parent, kind, seq, i, d = heapq.heappop(heap)
        token = seq[i] if kind == "row" else int(text[seq[1] + i]) if kind == "follow" else int(drafts[seq][i])
        node = index.get((parent, token))
        new = node is None
        if new:
            if len(tokens) >= budget:
                break
            node = index[(parent, token)] = len(tokens)
            tokens.append(token)
            parents.append(parent)
            labels.append(-1 if kind == "row" else (seq[0] if kind == "follow" else sources[seq]) * D + i)
            chance.append(neg)
            goes_on = continuation(token, parent)
            if follow and kind != "follow" and d < depth and goes_on is not None:
                offer(neg * float(chances[goes_on[0], 0]), node, "follow", goes_on, 0, d + 1)
        below = None
        if k and d < depth and new:
            below = table.row(tokens[parent] if parent >= 0 else x0, token)
        if kind == "row":
            if i + 1 < k:
                offer(neg / rates[i] * rates[i + 1], parent, "row", seq, i + 1, d)
            if below is not None:
                offer(neg * rates[0], node, "row", below, 0, d + 1)
        elif kind == "follow":
            if below is not None:
                offer(neg * rates[0], node, "row", below, 0, d + 1)
            if new and i + 1 < follow and seq[1] + i + 1 < len(text) and d < depth:
                offer(neg * float(chances[seq[0], i + 1]), node, "follow", seq, i + 1, d + 1)
        else:
            if below is not None:
                offer(neg * rates[0], node, "row", below, 0, d + 1)
            if i + 1 < len(drafts[seq]):
                offer(
                    (neg if new else chance[node]) * float(chances[sources[seq], i + 1]),
                    node,
                    "chain",
                    seq,
                    i + 1,
                    d + 1,
                )
    return tokens, parents, labels


def subtree_order(tokens: Sequence[int], parents: Sequence[int]) -> DraftTree:
    """Nodes made in this order, as TreeBuilder lays them out (its `tree()`)."""
    paths: list[tuple[int, ...]] = []
    builder = TreeBuilder(len(tokens))
    for p, token in zip(parents, tokens):
        paths.append((paths[p] if p >= 0 else ()) + (token,))
        builder.add(paths[-1])
    return builder.tree()

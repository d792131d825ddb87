"""Drafts recycled from the model's own predictions (as in Token Recycling, Luo et al. 2024):
every step's forward computes logits for many rows, and each row's top-k tokens say what the
model expects after that row's input token. A table keeps, per token, the top-k of the last
row it was the input of; a step's drafts are the likeliest paths through the table from x0.

The table is replicated state like the pool: every rank applies the same gathered rows in the
same order (lp/message.py), so every rank builds the same drafts."""
from __future__ import annotations

import heapq

import numpy as np


class SuccessorTable:
    """`next[t]`: the k tokens the model ranked highest after token t (best first), the last
    time t was the input of a logits row; -1 where t has not been seen (or is past the table).

    How often the rank-r successor turned out to be the next committed token is counted as the
    decode goes (`observe`), so the drafts' order follows this decode's own hit rates. A
    decoder keeps one table and `reset`s it per sequence (allocating it costs more)."""

    def __init__(self, vocab_size: int, k: int) -> None:
        if k < 1:
            raise ValueError(f"successors per token must be >= 1, got {k}")
        self.k = k
        self.next = np.empty((vocab_size, k), dtype=np.int32)
        self.hits = np.empty(k + 1)
        self.reset()

    def reset(self) -> None:
        """Forget every row and count."""
        self.next.fill(-1)
        # hits[r]: committed tokens that were their predecessor's rank-r successor; hits[k]: none
        # of them. One pseudo-count each, so the first steps spread drafts evenly over ranks.
        self.hits.fill(1.0)

    def update(self, rows: np.ndarray) -> None:
        """Apply rows `[n, 1 + k]` (input token, its top-k successors) in order: a token's last
        row wins. Rows whose input token is negative are padding."""
        rows = rows[(rows[:, 0] >= 0) & (rows[:, 0] < len(self.next))]
        if not len(rows):
            return
        last = rows[::-1]
        _, first = np.unique(last[:, 0], return_index=True)  # each token's last row
        keep = last[first]
        self.next[keep[:, 0]] = keep[:, 1:]

    def observe(self, tokens: np.ndarray) -> None:
        """Count, for each token of `tokens` after the first, which rank of its predecessor's
        successors it was (call with the committed sequence's tail before `update`)."""
        if len(tokens) < 2:
            return
        inside = tokens[:-1] < len(self.next)
        seen = self.next[np.where(inside, tokens[:-1], 0)]
        known = inside & (seen[:, 0] >= 0)
        match = seen[known] == tokens[1:][known, None]
        rank = np.where(match.any(axis=1), match.argmax(axis=1), self.k)
        self.hits += np.bincount(rank, minlength=self.k + 1)

    def rates(self) -> np.ndarray:
        """`[k]` the estimated chance that the rank-r successor is the next token, made
        non-increasing in r (what the best-first search below relies on)."""
        return np.minimum.accumulate(self.hits[:self.k] / self.hits.sum())

    def drafts(self, x0: int, count: int, depth: int) -> tuple[list[int], list[int]]:
        """The `count` likeliest paths from x0 through the table, at most `depth` tokens each,
        as tree nodes, most likely first (a path's chance: the product of its steps' rates):
        `(parents, tokens)`, node i being `tokens[i]` after node `parents[i]` (-1: x0). A
        node's parent comes before it, so the first n nodes form a tree (lp/lookahead/tree.py)."""
        parents: list[int] = []
        tokens: list[int] = []
        if count < 1 or depth < 1 or x0 >= len(self.next) or self.next[x0, 0] < 0:
            return parents, tokens
        q = self.rates().tolist()
        table, k = self.next, self.k
        # best-first over (-chance, order, parent node, parent's token, rank, depth); a popped node
        # offers its first child and its next sibling, so the heap stays small
        heap = [(-q[0], 0, -1, x0, 0, 1)]
        order = 1
        while heap and len(tokens) < count:
            neg, _, parent, above, r, d = heapq.heappop(heap)
            here = len(tokens)
            parents.append(parent)
            tokens.append(int(table[above, r]))
            if r + 1 < k and table[above, r + 1] >= 0:
                heapq.heappush(heap, (neg / q[r] * q[r + 1], order, parent, above, r + 1, d))
                order += 1
            if d < depth and table[tokens[here], 0] >= 0:
                heapq.heappush(heap, (neg * q[0], order, here, tokens[here], 0, d + 1))
                order += 1
        return parents, tokens


__all__ = ["SuccessorTable"]

"""Drafts recycled from the model's own predictions (as in Token Recycling, Luo et al. 2024):
every step's forward computes logits for many rows, and each row's top-k tokens say what the
model expects after that row's input token. A table keeps, per token, the top-k of the last
row it was the input of; a step's drafts are the likeliest paths through the table from x0.

The table is replicated state like the pool: every rank applies the same gathered rows in the
same order (lp/message.py), so every rank builds the same drafts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.tree import Chain, TreeBuilder, pair_key


class SuccessorTable:
    """`next[t]`: the k tokens the model ranked highest after token t (best first), the last
    time t was the input of a logits row (tokens never seen have none). A dict of lists: a step
    reads a few hundred rows one by one (the search below) and writes about a hundred, which
    numpy rows would cost more for.

    How often the rank-r successor turned out to be the next committed token is counted as the
    decode goes (`observe`), so the drafts' order follows this decode's own hit rates."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"successors per token must be >= 1, got {k}")
        self.k = k
        self.next: dict[int, list[int]] = {}
        # the same, per (token before, token): the rows whose input's predecessor is known (the
        # tree's nodes, x0), preferred where they exist (more context predicts better)
        self.pairs: dict[int, list[int]] = {}  # keyed by pair_key(token before, token)
        # hits[r]: committed tokens that were their predecessor's rank-r successor; hits[k]: none
        # of them. One pseudo-count each, so the first steps spread drafts evenly over ranks.
        self.hits = [1] * (k + 1)

    def update(self, rows: np.ndarray, keys: Sequence[int] = (), first: int = -1) -> None:
        """Apply rows `[n, 1 + k]` (input token, its top-k successors) in order: a token's last
        row wins. Every row is a real one, its token >= 0 (lp.message.merge drops the messages'
        padding). For `pairs`, each row's `pair_key(token before its input, input)` where known:
        `first` row 0's (-1: unknown), `keys` the last len(keys) rows'."""
        if not len(rows):
            return
        # one list per row, shared by both dicts (no one changes a row in place): a dict's
        # update keeps each key's last row, as the table should
        lists = rows[:, 1:].tolist()
        if first >= 0:
            self.pairs[first] = lists[0]
        if keys:
            self.pairs.update(zip(keys, lists[len(lists) - len(keys) :]))
        self.next.update(zip(rows[:, 0].tolist(), lists))

    def row(self, before: int, token: int) -> list[int] | None:
        """The successors expected after `token` when `before` precedes it (None: unknown)."""
        return self.pairs.get(pair_key(before, token)) or self.next.get(token)

    def observe(self, tokens: Sequence[int]) -> None:
        """Count, for each token of `tokens` after the first two, which rank of its
        predecessor's successors (`row`) it was (call with the committed sequence's tail
        before `update`)."""
        for before, last, token in zip(tokens, tokens[1:], tokens[2:]):
            row = self.row(before, last)
            if row is not None:
                self.hits[row.index(token) if token in row else self.k] += 1

    def rates(self) -> list[float]:
        """The estimated chance that the rank-r successor is the next token, for r < k, made
        non-increasing in r (what the best-first search relies on)."""
        total = sum(self.hits)
        rates = [h / total for h in self.hits[: self.k]]
        for r in range(1, self.k):
            rates[r] = min(rates[r], rates[r - 1])
        return rates

    def grow(self, tree: TreeBuilder, x0: int, depth: int, chains: Sequence[Chain] = (), before: int = -1) -> None:
        """Graft onto `tree` the likeliest paths from x0 (`before`: the token before it) through
        the table and `chains`, at most `depth` tokens each, most likely first (a path's
        chance: the product of its steps' rates), until its budget is spent (TreeBuilder.grow)."""
        tree.grow(x0, self.next, self.rates(), depth, chains, self.pairs, before)


__all__ = ["SuccessorTable"]

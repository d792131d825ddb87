"""Drafts recycled from the model's own predictions (as in Token Recycling, Luo et al. 2024):
every step's forward computes logits for many rows, and each row's top-k tokens say what the
model expects after that row's input token. A table keeps, per token, the top-k of the last
row it was the input of; a step's drafts are the likeliest paths through the table from x0
(lp/lookahead/grow.py).

The table is replicated state like the pool: every rank applies the same gathered rows in the
same order (lp/message.py), so every rank builds the same drafts.

The table is arrays, written and read by compiled loops (numba): a step writes about a hundred
rows and the tree's growth reads a few hundred, one by one, which Python dicts cost tens of
microseconds for and array ops (a call per row) more. A step's rows land on scattered lines of
a table of megabytes, a cache miss or two each: the compiled observe stages them in a small
hash that lookups read first (`stage`), and they are written once the next forward is queued
(`apply`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.loops import NO_ROW, count_ranks, find_row, rehash, successor, update_rows
from lp.lookahead.tree import pair_key

_NO_KEYS = np.zeros(0, dtype=np.int64)
MOST_PAIRS_UP_FRONT = 1 << 17  # pair rows sized up front at most (4 MiB at k = 8); more grow
STAGE_SLOTS = 16  # the stage's hash slots until a step's room is made (`reserve`)


class SuccessorTable:
    """Row t of `table`: the k tokens the model ranked highest after token t (best first), the
    last time t was the input of a logits row (-1 for a token never seen); for `vocab` tokens.

    The same per (token before, token), for the rows whose input's predecessor is known (the
    tree's nodes, x0), preferred where they exist (more context predicts better): `pairs`' rows,
    found by `pair_key` in a hash `index` (lp/lookahead/loops.py `slot`). Both are sized for
    `expected_pairs` up front: growing them copies every pair row (or rehashes every key), a
    step's worth of work or more.

    How often the rank-r successor turned out to be the next committed token is counted as the
    decode goes (`observe`), so the drafts' order follows this decode's own hit rates.

    `staged` rows (a step's, staged by lp/decode/policy.py's compiled observe in the hash
    `stage`: `stage_rows`) count as written (`row` and the growth read them) until `apply`
    writes them."""

    def __init__(self, k: int, vocab: int, expected_pairs: int = 0) -> None:
        if k < 1:
            raise ValueError(f"successors per token must be >= 1, got {k}")
        self.k, self.vocab = k, vocab
        self.table = np.full((vocab, k), -1, dtype=np.int32)  # token ids fit: half the memory
        capacity = min(max(expected_pairs, 256), MOST_PAIRS_UP_FRONT)
        self.pairs = np.zeros((capacity, k), dtype=np.int32)
        self.index = np.full((1 << (2 * capacity).bit_length(), 2), -1, dtype=np.int64)  # (pair key, its row)
        self.n_pairs = 0
        # hits[r]: committed tokens that were their predecessor's rank-r successor; hits[k]: none
        # of them. One pseudo-count each, so the first steps spread drafts evenly over ranks.
        self.hits = np.ones(k + 1, dtype=np.int64)
        self.stage = np.full((STAGE_SLOTS, 2), -1, dtype=np.int64)  # staged key -> row of `staged`
        self.staged = self._no_rows = np.zeros((0, 1 + k), dtype=np.int64)
        self._staged_keys: tuple[np.ndarray, int] = (_NO_KEYS, -1)

    def hold(self, rows: np.ndarray, keys: np.ndarray = _NO_KEYS, first: int = -1) -> None:
        """`rows` (with `update`'s `keys` and `first`) were staged in `stage` (`stage_rows`, in a
        compiled observe): kept until `apply` writes them."""
        self.staged, self._staged_keys = rows, (keys, first)

    def apply(self) -> None:
        """Write the staged rows (`hold`), in the room `reserve` made before they were staged,
        and empty the stage."""
        if not len(self.staged):
            return
        rows, (keys, first) = self.staged, self._staged_keys
        if any(self._lacks(len(rows))):
            raise ValueError("staged successor rows without room: reserve() before they are staged")
        self.staged, self._staged_keys = self._no_rows, (_NO_KEYS, -1)
        self.n_pairs = update_rows(self.table, self.pairs, self.index, self.n_pairs, rows, keys, first)
        self.stage.fill(-1)

    def update(self, rows: np.ndarray, keys: np.ndarray = _NO_KEYS, first: int = -1) -> None:
        """Apply rows `[n, 1 + k]` (input token, its top-k successors) in order: a token's last
        row wins. Every row is a real one, its token >= 0 (lp.message.merge drops the messages'
        padding). For the pair rows, each row's `pair_key(token before its input, input)` where
        known: `first` row 0's (-1: unknown), `keys` (int64) the last len(keys) rows'. Staged
        rows are written first (`apply`)."""
        self.apply()
        if not len(rows):
            return
        self.reserve(len(rows))
        self.n_pairs = update_rows(self.table, self.pairs, self.index, self.n_pairs, rows, keys, first)

    def reserve(self, rows: int) -> None:
        """Room for the pair rows of `rows` more rows (and the hash index at most half full), and
        for staging them (two keys a row, the stage at most half full)."""
        need, (index, pairs) = self.n_pairs + rows + 1, self._lacks(rows)
        if index:
            self.index = rehash(self.index, 1 << (2 * need).bit_length())
        if pairs:
            grown = np.zeros((2 * need, self.k), dtype=np.int32)
            grown[: self.n_pairs] = self.pairs[: self.n_pairs]
            self.pairs = grown
        if 4 * rows > len(self.stage):  # replaced while empty: rows are staged after their room is made
            self.stage = np.full((1 << (4 * rows).bit_length(), 2), -1, dtype=np.int64)

    def _lacks(self, rows: int) -> tuple[bool, bool]:
        """Whether the hash index (at most half full: short probes) and the pair rows lack room
        for the pair rows of `rows` more rows."""
        need = self.n_pairs + rows + 1
        return 2 * need > len(self.index), need > len(self.pairs)

    def row(self, before: int, token: int) -> list[int] | None:
        """The successors expected after `token` when `before` precedes it (None: unknown)."""
        row = find_row(self.table, self.index, self.stage, before, token)
        if row == NO_ROW:
            return None
        return [int(successor(self.table, self.pairs, self.staged, row, r)) for r in range(self.k)]

    def observe(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Count, for each token of `tokens` after the first two, which rank of its
        predecessor's successors (`row`) it was (call with the committed sequence's tail
        before `update`)."""
        if len(tokens) > 2:
            tokens = np.asarray(tokens, dtype=np.int64)
            count_ranks(self.table, self.pairs, self.index, self.stage, self.staged, tokens, self.hits)


__all__ = ["SuccessorTable", "pair_key"]

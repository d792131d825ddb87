"""The n-gram pool: n-grams from the Jacobi trajectory (and the prompt), keyed by first token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.draft_loops import pool_insert, pool_rows, rehash_keys


class NGramPool:
    """At most `capacity` distinct (N-1)-token tails per first token; the least recently
    inserted tail is evicted first, and inserting a tail that is already there refreshes it
    and counts it once more (an n-gram the window or the text keeps producing is likelier).

    Arrays (lp/lookahead/draft_loops.py), written by every insert at once: a hash table of the
    first tokens, `table` (rows: key, its block; block -1: an empty slot); per block b a ring of
    `capacity` rows `rows[b]` (a tail, then the times it was inserted), oldest first from row
    `rings[b, 0]`, `rings[b, 1]` of them in use, `rings[b, 2:]` their fingerprints."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.capacity = capacity
        self.table = np.full((0, 2), -1, np.int64)
        self.rows = np.zeros((0, capacity, n), np.int64)
        self.rings = np.zeros((0, 2 + capacity), np.int64)
        self._made = 0  # blocks in use

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        """Insert one n-gram `(key, *tail)`."""
        self._insert(np.array([key, *tail], np.int64), self.n, 1)

    def add_rows(self, grams: np.ndarray) -> None:
        """Insert each row of an int array `[k, N]` as one n-gram, in row order."""
        self._insert(np.ascontiguousarray(grams, np.int64).reshape(-1), self.n, len(grams))

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert every n-gram of a token sequence (the prompt, or the output's newest tokens)."""
        tokens = np.asarray(tokens, np.int64)
        self._insert(tokens, 1, len(tokens) - self.n + 1)

    def _insert(self, flat: np.ndarray, stride: int, k: int) -> None:
        """Insert n-grams i < k, `flat[i * stride : i * stride + N]`, in order."""
        if k < 1 or not self.capacity:
            return
        made = pool_insert(self.table, self.rows, self.rings, self._made, flat, stride, k)
        if made < 0:  # no room: twice what these need, the table at most half full
            size = 2 * (self._made + k)
            more = size - len(self.rings)
            self.rows = np.concatenate([self.rows, np.zeros((more, *self.rows.shape[1:]), np.int64)])
            self.rings = np.concatenate([self.rings, np.zeros((more, 2 + self.capacity), np.int64)])
            self.table = rehash_keys(self.table, 1 << (2 * size).bit_length())
            made = pool_insert(self.table, self.rows, self.rings, self._made, flat, stride, k)
        self._made = made

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """The tails stored under `key`, oldest first (at most `capacity`)."""
        return self._read(key, False, True)

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with
        `frequent` the most often inserted (ties: the newest)."""
        return self._read(key, frequent, False)

    def _read(self, key: int, frequent: bool, oldest: bool) -> list[tuple[int, ...]]:
        return list(map(tuple, pool_rows(self.table, self.rows, self.rings, key, frequent, oldest).tolist()))

    def __len__(self) -> int:
        return int(self.rings[:, 1].sum())

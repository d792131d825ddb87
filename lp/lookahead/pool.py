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
    first tokens, `keys` and `blocks` (each key's block, -1: an empty slot); per block a ring of
    `capacity` tails, oldest first from `begins[b]`, `sizes[b]` of them: `tails[b]` and
    `counts[b]` (times inserted)."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.capacity = capacity
        self.keys, self.blocks = np.zeros(0, np.int64), np.full(0, -1, np.int64)
        self.tails = np.zeros((0, capacity, n - 1), np.int64)
        self.counts = np.zeros((0, capacity), np.int64)
        self.begins, self.sizes = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._made = np.zeros(1, np.int64)  # blocks in use

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
        need = int(self._made[0]) + k
        if need > len(self.sizes):
            self._grow(2 * need)
        if 2 * need > len(self.keys):  # at most half full: short probes
            self.keys, self.blocks = rehash_keys(self.keys, self.blocks, 1 << (2 * need).bit_length())
        pool_insert(
            self.keys, self.blocks, self.tails, self.counts, self.begins, self.sizes, self._made, flat, stride, k
        )

    def _grow(self, size: int) -> None:
        """Room for `size` blocks."""
        more = size - len(self.sizes)
        self.tails = np.concatenate([self.tails, np.zeros((more, *self.tails.shape[1:]), np.int64)])
        self.counts = np.concatenate([self.counts, np.zeros((more, self.capacity), np.int64)])
        self.begins = np.concatenate([self.begins, np.zeros(more, np.int64)])
        self.sizes = np.concatenate([self.sizes, np.zeros(more, np.int64)])

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """The tails stored under `key`, oldest first (at most `capacity`)."""
        return self._read(key, False, True)

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with
        `frequent` the most often inserted (ties: the newest)."""
        return self._read(key, frequent, False)

    def _read(self, key: int, frequent: bool, oldest: bool) -> list[tuple[int, ...]]:
        rows = pool_rows(
            self.keys, self.blocks, self.tails, self.counts, self.begins, self.sizes, key, frequent, oldest
        )
        return list(map(tuple, rows.tolist()))

    def __len__(self) -> int:
        return int(self.sizes.sum())

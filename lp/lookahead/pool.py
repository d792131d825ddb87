"""The n-gram pool: n-grams from the Jacobi trajectory (and the prompt), keyed by first token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.draft_loops import pool_flush, pool_queue, pool_rows, rehash_keys


class NGramPool:
    """At most `capacity` distinct (N-1)-token tails per first token; the least recently
    inserted tail is evicted first, and inserting a tail that is already there refreshes it
    and counts it once more (an n-gram the window or the text keeps producing is likelier).

    Inserts are queued and land lazily: a read of a key first inserts that key's queued
    n-grams, in order, and `flush` inserts all of them. Every read therefore sees what eager
    inserts would have made (each key's n-grams arrive in the same order), while most of a
    step's inserts wait until the next forward is queued (`flush`, lp/decode/loop.py): a step
    reads two keys of the tens it inserts, each insert a few cache misses. `len` flushes.

    Arrays (lp/lookahead/draft_loops.py): a hash table of the first tokens, `table` (rows: key,
    its block; block -1: an empty slot); per block b a ring of `capacity` rows `rows[b]` (a
    tail, then the times it was inserted), oldest first from row `rings[b, 0]`, `rings[b, 1]` of
    them in use, `rings[b, 2:]` their fingerprints; the queue, `queue[:, :state[1]]` (an n-gram
    a column), and `state[0]`, the blocks in use."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.capacity = capacity
        self.table = np.full((0, 2), -1, np.int64)
        self.rows = np.zeros((0, capacity, n), np.int64)
        self.rings = np.zeros((0, 2 + capacity), np.int64)
        self.queue = np.zeros((n, 0), np.int64)
        self.state = np.zeros(2, np.int64)

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        """Insert one n-gram `(key, *tail)`."""
        self._enqueue(np.array([key, *tail], np.int64), self.n, 1)

    def add_rows(self, grams: np.ndarray) -> None:
        """Insert each row of an int array `[k, N]` as one n-gram, in row order."""
        self._enqueue(np.ascontiguousarray(grams, np.int64).reshape(-1), self.n, len(grams))

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert every n-gram of a token sequence (the prompt, or the output's newest tokens)."""
        tokens = np.asarray(tokens, np.int64)
        self._enqueue(tokens, 1, len(tokens) - self.n + 1)

    def _enqueue(self, flat: np.ndarray, stride: int, k: int) -> None:
        """Queue n-grams i < k, `flat[i * stride : i * stride + N]`, in order."""
        if k < 1 or not self.capacity:
            return
        self.reserve(k)
        if not pool_queue(self.table, self.rings, self.state, self.queue, flat, stride, k):
            raise RuntimeError("the pool's queue has no room after its reserve")

    def reserve(self, k: int) -> None:
        """Room for k more queued n-grams and for a block each (the table at most half full):
        twice what they need, where they do not fit."""
        made, queued = self.state.tolist()
        need = made + queued + k
        if queued + k <= self.queue.shape[1] and need <= len(self.rings) and 2 * need <= len(self.table):
            return
        size = 2 * need
        if size > len(self.rings) or size > len(self.table):
            more = size - len(self.rings)
            self.rows = np.concatenate([self.rows, np.zeros((more, *self.rows.shape[1:]), np.int64)])
            self.rings = np.concatenate([self.rings, np.zeros((more, 2 + self.capacity), np.int64)])
            self.table = rehash_keys(self.table, 1 << (2 * size).bit_length())
        if queued + k > self.queue.shape[1]:
            queue = np.zeros((self.n, 2 * (queued + k)), np.int64)
            queue[:, :queued] = self.queue[:, :queued]
            self.queue = queue

    def flush(self) -> None:
        """Insert every queued n-gram."""
        pool_flush(self.table, self.rows, self.rings, self.state, self.queue)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """The tails stored under `key`, oldest first (at most `capacity`)."""
        return self._read(key, False, True)

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with
        `frequent` the most often inserted (ties: the newest)."""
        return self._read(key, frequent, False)

    def _read(self, key: int, frequent: bool, oldest: bool) -> list[tuple[int, ...]]:
        rows = pool_rows(self.table, self.rows, self.rings, self.state, self.queue, key, frequent, oldest)
        return list(map(tuple, rows.tolist()))

    def __len__(self) -> int:
        self.flush()
        return int(self.rings[:, 1].sum())

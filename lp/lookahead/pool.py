"""The n-gram pool: n-grams from the Jacobi trajectory (and the prompt), keyed by first token."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


class NGramPool:
    """At most `capacity` distinct (N-1)-token tails per first token; the least recently
    inserted tail is evicted first, and inserting a tail that is already there refreshes it
    and counts it once more (an n-gram the window or the text keeps producing is likelier).

    Inserts are queued and land lazily: a read of a key first inserts that key's queued
    n-grams, in order, and `flush` inserts all of them. Every read therefore sees what eager
    inserts would have made (each key's n-grams arrive in the same order), while most of a
    step's inserts can wait until the next forward is queued (`flush`, lp/decode/loop.py): a step
    reads two keys of the sixty or so it inserts. `len` flushes."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.capacity = capacity
        self._table: dict[int, OrderedDict[tuple[int, ...], int]] = {}  # tail -> times inserted
        # queued batches: each n-gram's key (None once a read of it inserted it) and its tails, as
        # rows of an int array [k, N-1] or as tuples
        self._queue: list[tuple[list[int | None], np.ndarray | list[tuple[int, ...]]]] = []

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        """Insert one n-gram `(key, *tail)`."""
        self._enqueue([int(key)], [tuple(map(int, tail))])

    def add_rows(self, grams: np.ndarray) -> None:
        """Insert each row of an int array `[k, N]` as one n-gram, in row order (the pool keeps
        `grams` until the n-grams land: do not change it)."""
        if len(grams):
            self._enqueue(grams[:, 0].tolist(), grams[:, 1:])

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert every n-gram of a token sequence (the prompt, or the output's newest tokens)."""
        n = len(tokens) - self.n + 1
        if n < 1:
            return
        tokens = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
        self._enqueue(tokens[:n], [tuple(tokens[i + 1 : i + self.n]) for i in range(n)])

    def _enqueue(self, keys: list[int | None], tails: np.ndarray | list[tuple[int, ...]]) -> None:
        if self.capacity:
            self._queue.append((keys, tails))

    def flush(self) -> None:
        """Insert every queued n-gram."""
        for keys, tails in self._queue:
            self._insert(keys, tails.tolist() if isinstance(tails, np.ndarray) else tails)
        self._queue.clear()

    def _land(self, key: int) -> None:
        """Insert the queued n-grams of `key` (before a read of it)."""
        for keys, tails in self._queue:
            if key in keys:  # a step's new n-grams often start with the next step's x0
                mine = [i for i, k in enumerate(keys) if k == key]
                self._insert(
                    [key] * len(mine),
                    tails[mine].tolist() if isinstance(tails, np.ndarray) else [tails[i] for i in mine],
                )
                for i in mine:
                    keys[i] = None

    def _insert(self, keys: Sequence[int | None], tails: Sequence[Sequence[int]]) -> None:
        """Insert n-grams `(key, *tail)` in order, skipping keys of None (inserted already);
        this runs for every window column and every committed token of every step."""
        table, capacity = self._table, self.capacity
        for key, tail in zip(keys, tails):
            if key is None:
                continue
            tail = tuple(tail)
            entries = table.get(key)
            if entries is None:
                entries = table[key] = OrderedDict()
            if tail in entries:
                entries[tail] += 1
                entries.move_to_end(tail)
            else:
                entries[tail] = 1
                if len(entries) > capacity:
                    entries.popitem(last=False)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """The tails stored under `key`, oldest first (at most `capacity`)."""
        self._land(key)
        entries = self._table.get(key)
        return list(entries) if entries else []

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with
        `frequent` the most often inserted (ties: the newest)."""
        newest = self.lookup(key)[::-1]
        return sorted(newest, key=self._table[key].__getitem__, reverse=True) if frequent and newest else newest

    def __len__(self) -> int:
        self.flush()
        return sum(len(e) for e in self._table.values())

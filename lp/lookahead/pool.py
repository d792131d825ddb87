"""The n-gram pool: n-grams from the Jacobi trajectory (and the prompt), keyed by first token."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np


class NGramPool:
    """At most `capacity` distinct (N-1)-token tails per first token; the least recently
    inserted tail is evicted first, and inserting a tail that is already there refreshes it
    and counts it once more (an n-gram the window or the text keeps producing is likelier)."""

    def __init__(self, n: int, capacity: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.capacity = capacity
        self._table: dict[int, OrderedDict[tuple[int, ...], int]] = {}  # tail -> times inserted

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        """Insert one n-gram `(key, *tail)`."""
        self._insert([int(key)], [tuple(map(int, tail))])

    def add_rows(self, grams: np.ndarray) -> None:
        """Insert each row of an int array `[k, N]` as one n-gram, in row order."""
        if len(grams):
            self._insert(grams[:, 0].tolist(), map(tuple, grams[:, 1:].tolist()))

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert every n-gram of a token sequence (the prompt, or the output's newest tokens)."""
        n = len(tokens) - self.n + 1
        if n < 1:
            return
        tokens = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
        self._insert(tokens[:n], (tuple(tokens[i + 1:i + self.n]) for i in range(n)))

    def _insert(self, keys: Sequence[int], tails: Iterable[tuple[int, ...]]) -> None:
        """Insert n-grams `(key, *tail)` in order (this runs for every window column and every
        committed token of every step)."""
        table, capacity = self._table, self.capacity
        if capacity == 0:
            return
        for key, tail in zip(keys, tails):
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
        entries = self._table.get(key)
        return list(entries) if entries else []

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with
        `frequent` the most often inserted (ties: the newest)."""
        newest = self.lookup(key)[::-1]
        return sorted(newest, key=self._table[key].__getitem__, reverse=True) if frequent and newest else newest

    def __len__(self) -> int:
        return sum(len(e) for e in self._table.values())

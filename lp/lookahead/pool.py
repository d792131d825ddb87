"""The n-gram pool: n-grams from the Jacobi trajectory (and the prompt and output), keyed by their
first token. At most `capacity` distinct (N-1)-token tails per first token; the least recently
inserted tail is evicted first, and inserting a tail that is already there refreshes it and counts
it once more (an n-gram the window or the text keeps producing is likelier).

Inserts are queued and land lazily: a read of a key first inserts that key's queued n-grams, in
order, and `flush` inserts all of them. Every read sees what eager inserts would have made, while
most of a step's inserts wait until the next forward is queued (lp/decode/phases.py): a step reads
two keys of the tens it inserts, each insert a few cache misses.

Fields: a hash table of the first tokens, `table` (rows: key, its block; block -1: an empty
slot); per block b a ring of `capacity` rows `rows[b]` (a tail, then the times it was inserted),
oldest first from row `rings[b, 0]`, `rings[b, 1]` of them in use, `rings[b, 2:]` their
fingerprints (a row's tokens are compared only where its fingerprint matches: a block's rows span
several cache lines, their fingerprints two); `blocks` in use; the queue `queue[:, :queued]`, an
n-gram a column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba.experimental import structref

from lp.jit import State, bit_length, compiled
from lp.lookahead.chains import Chains, add, new_chains
from lp.lookahead.text import FIB


@structref.register
class NGramPoolType(State):
    pass


class NGramPool(structref.StructRefProxy):
    """At most `capacity` tails of n - 1 tokens per first token."""

    def __new__(cls, n: int, capacity: int) -> NGramPool:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        return new_pool(n, capacity)

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        """Insert one n-gram `(key, *tail)`."""
        self.add_rows(np.array([[key, *tail]], np.int64))

    def add_rows(self, grams: np.ndarray) -> None:
        """Insert each row of an int array `[k, n]` as one n-gram, in row order."""
        _add(self, np.ascontiguousarray(grams, np.int64).reshape(-1), False)

    def add_sequence(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Insert every n-gram of a token sequence (the prompt, or the output's newest tokens)."""
        _add(self, np.asarray(tokens, np.int64), True)

    @property
    def queued(self) -> int:
        """The n-grams waiting to be inserted."""
        return _queued(self)

    def flush(self) -> None:
        """Insert every queued n-gram."""
        flush(self)

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """The tails stored under `key`, oldest first (at most `capacity`)."""
        return self.best(key)[::-1]

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        """The tails stored under `key` as candidates, best first: the newest, or with `frequent`
        the most often inserted (ties: the newest)."""
        return _best(self, key, frequent).drafts

    def __len__(self) -> int:
        flush(self)
        return _size(self)


structref.define_proxy(
    NGramPool, NGramPoolType, ["n", "capacity", "table", "rows", "rings", "blocks", "queue", "queued"]
)


@compiled
def new_pool(n: int, capacity: int) -> NGramPool:
    """An empty pool of n-grams, `capacity` tails per first token."""
    return NGramPool(
        n,
        capacity,
        np.full((0, 2), -1, np.int64),
        np.zeros((0, capacity, n), np.int64),
        np.zeros((0, 2 + capacity), np.int64),
        0,
        np.zeros((n, 0), np.int64),
        0,
    )


@compiled
def reserve(pool: NGramPool, k: int) -> None:
    """Room for k more queued n-grams and for a block each (the table at most half full): twice
    what they need, where they do not fit."""
    need = pool.blocks + pool.queued + k
    if need > len(pool.rings) or 2 * need > len(pool.table):
        size = 2 * need
        if size > len(pool.rings):
            larger_rows = np.zeros((size, pool.capacity, pool.n), np.int64)
            larger_rows[: len(pool.rows)] = pool.rows
            larger_rings = np.zeros((size, 2 + pool.capacity), np.int64)
            larger_rings[: len(pool.rings)] = pool.rings
            pool.rows, pool.rings = larger_rows, larger_rings
        old = pool.table
        rehashed = np.full((1 << bit_length(2 * size), 2), -1, np.int64)
        for i in range(len(old)):
            if old[i, 1] >= 0:
                rehashed[_slot(rehashed, old[i, 0]), :] = old[i, :]
        pool.table = rehashed
    if pool.queued + k > pool.queue.shape[1]:
        longer = np.zeros((pool.n, 2 * (pool.queued + k)), np.int64)
        longer[:, : pool.queued] = pool.queue[:, : pool.queued]
        pool.queue = longer


@compiled
def enqueue(pool: NGramPool, flat: np.ndarray, stride: int, k: int) -> None:
    """Queue n-grams i < k, `flat[i * stride : i * stride + n]`, in order (after `reserve`)."""
    if k < 1 or not pool.capacity:
        return
    if pool.queued + k > pool.queue.shape[1] or pool.blocks + pool.queued + k > len(pool.rings):
        raise ValueError("the pool's queue has no room: reserve() before enqueue()")
    queue, q = pool.queue, pool.queued
    for g in range(k):
        for t in range(pool.n):
            queue[t, q + g] = flat[g * stride + t]
    pool.queued = q + k


@compiled
def _slot(table: np.ndarray, key: int) -> int:
    """The slot of `key` in the first tokens' table, or the empty slot where it would go."""
    mask = len(table) - 1
    i = np.int64(((np.uint64(key) * FIB) >> np.uint64(32)) & np.uint64(mask))
    while table[i, 1] >= 0 and table[i, 0] != key:
        i = (i + 1) & mask
    return i


@compiled
def _block(pool: NGramPool, key: int) -> int:
    """The block of `key`'s tails, or -1."""
    return pool.table[_slot(pool.table, key), 1] if len(pool.table) else -1


@compiled
def _insert(pool: NGramPool, r: int) -> None:
    """Insert queued n-gram r (its key, then its tail): to the newest row of its key's ring, over
    the oldest where the ring is full, its count one more where the ring held it."""
    queue, rows, rings = pool.queue, pool.rows, pool.rings
    capacity, tail = rows.shape[1], rows.shape[2] - 1
    i = _slot(pool.table, queue[0, r])
    if pool.table[i, 1] < 0:
        pool.table[i, 0], pool.table[i, 1] = queue[0, r], pool.blocks
        rings[pool.blocks, 0], rings[pool.blocks, 1] = 0, 0
        pool.blocks += 1
    b = pool.table[i, 1]
    begin, size = rings[b, 0], rings[b, 1]
    mark = np.uint64(tail)
    for t in range(tail):
        mark = (mark ^ np.uint64(queue[1 + t, r])) * FIB
    mark = np.int64(mark)
    found = -1
    for p in range(size):  # rows 0..size-1: a ring turns only once full
        if rings[b, 2 + p] == mark:
            same = True
            for t in range(tail):
                if rows[b, p, t] != queue[1 + t, r]:
                    same = False
                    break
            if same:
                found = p
                break
    if found >= 0:  # to the newest row, counted once more: the rows after it move back one
        times, p = rows[b, found, tail] + 1, found
        newest = begin + size - 1 - (capacity if begin + size > capacity else 0)
        while p != newest:
            q = p + 1 if p + 1 < capacity else 0
            for t in range(tail + 1):
                rows[b, p, t] = rows[b, q, t]
            rings[b, 2 + p] = rings[b, 2 + q]
            p = q
    elif size < capacity:  # begin is 0
        times, p = 1, size
        rings[b, 1] = size + 1
    else:  # over the oldest
        times, p = 1, begin
        rings[b, 0] = begin + 1 if begin + 1 < capacity else 0
    for t in range(tail):
        rows[b, p, t] = queue[1 + t, r]
    rows[b, p, tail] = times
    rings[b, 2 + p] = mark


@compiled
def land(pool: NGramPool, key: int) -> None:
    """Insert the queued n-grams of `key`, in order; the others stay queued, in order."""
    queue, kept = pool.queue, 0
    for r in range(pool.queued):
        if queue[0, r] == key:
            _insert(pool, r)
        else:
            if kept != r:
                for t in range(queue.shape[0]):
                    queue[t, kept] = queue[t, r]
            kept += 1
    pool.queued = kept


@compiled
def flush(pool: NGramPool) -> None:
    """Insert every queued n-gram, in order."""
    for r in range(pool.queued):
        _insert(pool, r)
    pool.queued = 0


@compiled
def _ranked(pool: NGramPool, b: int, frequent: bool) -> np.ndarray:
    """Block b's rows, newest first, or with `frequent` most often inserted first (ties: newest)."""
    rows, capacity, tail = pool.rows, pool.rows.shape[1], pool.rows.shape[2] - 1
    begin, size = pool.rings[b, 0], pool.rings[b, 1]
    order = np.empty(size, np.int64)
    for j in range(size):
        p = begin + size - 1 - j
        order[j] = p - capacity if p >= capacity else p
    if frequent:  # a stable insertion sort: a block holds tens of rows at most
        for j in range(1, size):
            p = order[j]
            i = j
            while i > 0 and rows[b, order[i - 1], tail] < rows[b, p, tail]:
                order[i] = order[i - 1]
                i -= 1
            order[i] = p
    return order


@compiled
def tail_drafts(pool: NGramPool, key: int, frequent: bool, after: int, chains: Chains, source: int, ranks: int) -> None:
    """Append the tails under `key` (its queued n-grams landed first), best first, the r-th from
    source `source + min(r, ranks - 1)`; with `after` >= 0, only the tails that start with `after`,
    less that token."""
    land(pool, key)
    b = _block(pool, key)
    if b < 0:
        return
    rows, tail = pool.rows, pool.rows.shape[2] - 1
    skip = 1 if after >= 0 else 0
    order, first = _ranked(pool, b, frequent), chains.count
    for j in range(len(order)):
        p = order[j]
        if skip and rows[b, p, 0] != after:
            continue
        add(chains, rows[b, p], skip, tail - skip, source + min(chains.count - first, ranks - 1))


@compiled
def _add(pool: NGramPool, flat: np.ndarray, sequence: bool) -> None:
    """Queue the n-grams of the rows of `flat` (n tokens each), or with `sequence` every n-gram of
    the token sequence `flat`, room made."""
    k = max(len(flat) - pool.n + 1, 0) if sequence else len(flat) // pool.n
    reserve(pool, k)
    enqueue(pool, flat, 1 if sequence else pool.n, k)


@compiled
def _best(pool: NGramPool, key: int, frequent: bool) -> Chains:
    chains = new_chains(pool.capacity, pool.capacity * (pool.n - 1))
    tail_drafts(pool, key, frequent, -1, chains, 0, 1)
    return chains


@compiled
def _queued(pool: NGramPool) -> int:
    return pool.queued


@compiled
def _size(pool: NGramPool) -> int:
    return pool.rings[: pool.blocks, 1].sum()


__all__ = ["NGramPool", "enqueue", "flush", "land", "reserve", "tail_drafts"]

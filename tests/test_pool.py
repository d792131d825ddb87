"""The n-gram pool: bounded per key, deduplicated, least-recently-inserted eviction."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest

from lp.lookahead.pool import NGramPool
from tests.reference_drafts import DictPool


def test_add_and_lookup_oldest_first():
    pool = NGramPool(3, 4)
    pool.add(7, (1, 2))
    pool.add(7, (3, 4))
    pool.add(8, (5, 6))
    assert pool.lookup(7) == [(1, 2), (3, 4)]
    assert pool.lookup(8) == [(5, 6)]
    assert pool.lookup(9) == []
    assert len(pool) == 3


def test_dedup():
    pool = NGramPool(3, 4)
    for _ in range(3):
        pool.add(7, (1, 2))
    assert pool.lookup(7) == [(1, 2)]
    assert len(pool) == 1


def test_bounded_and_evicts_least_recently_inserted():
    pool = NGramPool(2, 3)
    for t in range(10):
        pool.add(0, (t,))
        assert len(pool.lookup(0)) <= 3
    assert pool.lookup(0) == [(7,), (8,), (9,)]


def test_reinsert_refreshes():
    pool = NGramPool(2, 3)
    for t in (1, 2, 3):
        pool.add(0, (t,))
    pool.add(0, (1,))  # refresh: 1 becomes the newest, 2 is now the oldest
    assert pool.lookup(0) == [(2,), (3,), (1,)]
    pool.add(0, (4,))
    assert pool.lookup(0) == [(3,), (1,), (4,)]


def test_best_newest_or_most_frequent_first():
    pool = NGramPool(2, 4)
    for t in (1, 2, 1, 3, 2, 1, 4):  # counts: 1 three times, 2 twice, 3 and 4 once
        pool.add(0, (t,))
    assert pool.best(0) == [(4,), (1,), (2,), (3,)]
    assert pool.best(0, frequent=True) == [(1,), (2,), (4,), (3,)]  # ties: newest first
    assert pool.best(9) == pool.best(9, frequent=True) == []


def test_capacity_is_per_key():
    pool = NGramPool(2, 2)
    for key in range(5):
        for t in range(4):
            pool.add(key, (t,))
    assert all(pool.lookup(k) == [(2,), (3,)] for k in range(5))
    assert len(pool) == 10


def test_capacity_zero_stores_nothing():
    pool = NGramPool(3, 0)
    pool.add(1, (2, 3))
    pool.add_sequence([1, 2, 3, 4, 1, 2, 3])
    pool.add_rows(np.array([[1, 2, 3]]))
    assert pool.lookup(1) == [] and len(pool) == 0


def test_add_sequence_seeds_every_ngram():
    seq = [5, 1, 2, 5, 1, 3, 5, 1, 2]
    pool = NGramPool(3, 10)
    pool.add_sequence(seq)
    # all 3-grams, dedup'd, in order of last insertion
    assert pool.lookup(5) == [(1, 3), (1, 2)]
    assert pool.lookup(1) == [(2, 5), (3, 5)]
    assert pool.lookup(2) == [(5, 1)]
    assert pool.lookup(3) == [(5, 1)]
    grams = {tuple(seq[i : i + 3]) for i in range(len(seq) - 2)}
    stored = {(k, *t) for k in set(seq) for t in pool.lookup(k)}
    assert stored == grams and len(pool) == len(grams)


def test_add_sequence_shorter_than_n():
    pool = NGramPool(4, 5)
    pool.add_sequence([1, 2, 3])
    assert len(pool) == 0
    pool.add_sequence([1, 2, 3, 4])
    assert pool.lookup(1) == [(2, 3, 4)]


def test_add_rows_in_row_order():
    pool = NGramPool(3, 2)
    pool.add_rows(np.array([[1, 2, 3], [1, 4, 5], [1, 6, 7], [2, 0, 0]], dtype=np.int64))
    assert pool.lookup(1) == [(4, 5), (6, 7)]
    assert pool.lookup(2) == [(0, 0)]
    # stored as plain ints, so they compare (and hash) like the tuples the decoder looks up
    assert all(type(x) is int for x in pool.lookup(1)[0])


def test_negative_keys_are_keys():
    pool = NGramPool(2, 4)
    pool.add(-5, (1,))
    assert pool.lookup(-5) == [(1,)] and len(pool) == 1


def test_lookup_returns_a_copy():
    pool = NGramPool(2, 3)
    pool.add(0, (1,))
    got = pool.lookup(0)
    got.append((99,))
    assert pool.lookup(0) == [(1,)]


def test_matches_a_naive_model_on_random_inserts():
    rng = random.Random(0)
    for capacity in (1, 2, 3, 5):
        pool, model = NGramPool(3, capacity), {}
        for _ in range(400):
            key, tail = rng.randrange(4), (rng.randrange(3), rng.randrange(3))
            pool.add(key, tail)
            entries = model.setdefault(key, OrderedDict())
            entries.pop(tail, None)
            entries[tail] = None
            while len(entries) > capacity:
                entries.popitem(last=False)
            assert pool.lookup(key) == list(entries)
        assert len(pool) == sum(len(e) for e in model.values())


def test_bad_n():
    with pytest.raises(ValueError):
        NGramPool(1, 3)


@pytest.mark.parametrize("seed", range(12))
def test_matches_the_dict_pool_on_random_inserts(seed):
    """Rows, sequences and single n-grams in any interleaving with reads, flushes and sizes:
    every read (newest, most frequent or oldest first) sees what the plain dict pool's eager
    inserts make, through evictions, refreshes and the tables' growth (many keys)."""
    rng = np.random.default_rng(seed)
    n, capacity, keys = int(rng.integers(2, 6)), int(rng.choice([0, 1, 2, 3, 5, 15])), int(rng.choice([3, 40, 300]))
    pool, ref = NGramPool(n, capacity), DictPool(n, capacity)
    for _ in range(500):
        op = rng.integers(6)
        if op == 0:  # a window's n-grams: keys repeat within a batch
            grams = rng.integers(0, keys, size=(int(rng.integers(0, 20)), n))
            grams[:, 1:] %= 3  # few tails: refreshes and ties of counts
            pool.add_rows(grams)
            ref.add_rows(grams)
        elif op == 1:  # the output's newest tokens
            tokens = rng.integers(0, 3, size=int(rng.integers(0, 9)))
            pool.add_sequence(tokens)
            ref.add_sequence(tokens.tolist())
        elif op == 2:
            key, tail = int(rng.integers(keys)), tuple(rng.integers(0, 3, size=n - 1).tolist())
            pool.add(key, tail)
            ref.add(key, tail)
        elif op == 3:
            assert len(pool) == len(ref)
        elif op == 4:
            pool.flush()
        else:
            key, frequent = int(rng.integers(keys)), bool(rng.integers(2))
            assert pool.best(key, frequent) == ref.best(key, frequent)
            assert pool.lookup(key) == ref.lookup(key)
    for key in range(keys):
        assert pool.lookup(key) == ref.lookup(key)


def test_a_read_lands_only_its_key():
    pool = NGramPool(2, 4)
    pool.add_rows(np.array([[1, 5], [2, 6], [1, 7]]))
    assert pool.lookup(1) == [(5,), (7,)]
    assert pool.queued == 1  # 2's n-gram still waits
    pool.flush()
    assert pool.queued == 0 and pool.lookup(2) == [(6,)]

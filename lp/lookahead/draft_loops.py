"""The compiled loops of the text index (lp/lookahead/drafts.py) and of the n-gram pool
(lp/lookahead/pool.py), and the step's draft chains read from both (numba).

A step extends the text by a few tokens, inserts tens of n-grams into the pool and reads a few
drafts from each: in Python each token, n-gram or draft costs about a microsecond. They live in
one module because numba's on-disk cache of a function does not notice a change in another
module's function it calls (as lp/lookahead/loops.py's). Each loop compiles once, at first use,
into __pycache__.

The text index interns every L-gram (MIN_MATCH <= L <= MAX_MATCH) as an id: the L-gram ending
at position e is the (L-1)-gram ending at e - 1 followed by the token at e, so its hash key is
(L, that (L-1)-gram's id, token), the token before it for L = MIN_MATCH: exact, with no tokens
compared. Per id the newest position ending it, per position and L the previous one ending the
same L-gram: a suffix's occurrences are a walk, newest first.

The pool keeps each first token's tails in a block, a ring of `capacity` rows oldest first: a
new tail goes in at the end (over the oldest one when full), a tail inserted again moves to the
end, its count one more."""

from __future__ import annotations

import numpy as np
from numba import njit

MIN_MATCH = 2  # a suffix of one token (x0 alone) is the pool's job
MAX_MATCH = 8  # longer suffixes rank no higher than this
GRAMS = MAX_MATCH - MIN_MATCH + 1  # L-gram lengths indexed

_FIB = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


@njit(cache=True)
def _spread(h: np.uint64, mask: int) -> int:
    """A slot of a power-of-two table from a 64-bit hash: its high bits mixed down."""
    return np.int64(((h * _FIB) >> np.uint64(32)) & np.uint64(mask))


# -- the text index -----------------------------------------------------------------------------


@njit(cache=True)
def _gram_slot(gram_keys: np.ndarray, gram_ids: np.ndarray, L: int, before: int, token: int) -> int:
    """The slot of key (L, before, token) in the L-gram table (gram_ids[i] < 0: empty), or the
    empty slot where it would go."""
    mask = len(gram_ids) - 1
    i = _spread(np.uint64(before) * _MIX + np.uint64(token) + np.uint64(L), mask)
    while gram_ids[i] >= 0 and not (gram_keys[i, 0] == L and gram_keys[i, 1] == before and gram_keys[i, 2] == token):
        i = (i + 1) & mask
    return i


@njit(cache=True)
def index_tokens(seq, ids, prev, head, gram_keys, gram_ids, state, new, longest):
    """Append `new` to `seq` (state[0] tokens so far) and index the L-grams (L <= `longest`)
    ending at each new token; state[1]: the ids made so far. The caller made room."""
    n, n_ids = state[0], state[1]
    for t in range(len(new)):
        token = new[t]
        e = n
        seq[e] = token
        n += 1
        for L in range(MIN_MATCH, min(longest, e + 1) + 1):
            before = seq[e - 1] if L == MIN_MATCH else ids[e - 1, L - MIN_MATCH - 1]
            i = _gram_slot(gram_keys, gram_ids, L, before, token)
            if gram_ids[i] < 0:
                gram_keys[i, 0], gram_keys[i, 1], gram_keys[i, 2] = L, before, token
                gram_ids[i] = n_ids
                head[n_ids] = -1
                n_ids += 1
            g = gram_ids[i]
            ids[e, L - MIN_MATCH] = g
            prev[e, L - MIN_MATCH] = head[g]
            head[g] = e
    state[0], state[1] = n, n_ids


@njit(cache=True)
def rehash_grams(gram_keys: np.ndarray, gram_ids: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    new_keys, new_ids = np.zeros((size, 3), np.int64), np.full(size, -1, np.int64)
    for i in range(len(gram_ids)):
        if gram_ids[i] >= 0:
            j = _gram_slot(new_keys, new_ids, gram_keys[i, 0], gram_keys[i, 1], gram_keys[i, 2])
            new_keys[j, :] = gram_keys[i, :]
            new_ids[j] = gram_ids[i]
    return new_keys, new_ids


@njit(cache=True)
def _known(tokens: np.ndarray, starts: np.ndarray, first: int, c: int, seq: np.ndarray, at: int, m: int) -> bool:
    """Whether chains first..c-1 hold `seq[at : at + m]` already."""
    for j in range(first, c):
        s = starts[j]
        if starts[j + 1] - s == m:
            same = True
            for t in range(m):
                if tokens[s + t] != seq[at + t]:
                    same = False
                    break
            if same:
                return True
    return False


@njit(cache=True)
def _text_drafts(seq, n, ids, prev, head, longest, length, count, tokens, starts, sources, c, source, ranks):
    """Append the text's drafts as chains c, c + 1, ... (`TextIndex.drafts`), the r-th from
    source `source + min(r, ranks - 1)`; the chains' count after them."""
    if length < 1 or count < 1:
        return c
    last, first = n - 1, c
    top = min(longest, n)
    for L in range(top, MIN_MATCH - 1, -1):
        col = L - MIN_MATCH
        e = head[ids[last, col]]
        while e >= 0:
            # an occurrence that matches L + 1 tokens was taken at L + 1
            if e != last and not (L < top and ids[e, col + 1] == ids[last, col + 1]):
                m = min(length, last - e)
                if not _known(tokens, starts, first, c, seq, e + 1, m):
                    s = starts[c]
                    tokens[s : s + m] = seq[e + 1 : e + 1 + m]
                    starts[c + 1] = s + m
                    sources[c] = source + min(c - first, ranks - 1)
                    c += 1
                    if c - first == count:
                        return c
            e = prev[e, col]
    return c


@njit(cache=True)
def text_drafts(seq, n, ids, prev, head, longest, length, count):
    """`TextIndex.drafts` as chains: their tokens and starts."""
    count = max(count, 0)
    tokens = np.empty(count * max(length, 0), np.int64)
    starts = np.zeros(count + 1, np.int64)
    c = _text_drafts(
        seq, n, ids, prev, head, longest, length, count, tokens, starts, np.empty(count, np.int64), 0, 0, 1
    )
    return tokens[: starts[c]], starts[: c + 1]


# -- the n-gram pool ----------------------------------------------------------------------------


@njit(cache=True)
def _key_slot(keys: np.ndarray, blocks: np.ndarray, key: int) -> int:
    """The slot of `key` in the pool's table (blocks[i] < 0: empty), or the empty slot where
    it would go."""
    mask = len(keys) - 1
    i = _spread(np.uint64(key), mask)
    while blocks[i] >= 0 and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _block(keys: np.ndarray, blocks: np.ndarray, key: int) -> int:
    """The block of `key`'s tails, or -1."""
    return blocks[_key_slot(keys, blocks, key)]


@njit(cache=True)
def pool_insert(keys, blocks, tails, counts, begins, sizes, state, flat, stride, k):
    """Insert n-grams i < k, `flat[i * stride : i * stride + n]`, in order; state[0]: the
    blocks made so far. The caller made room for k more."""
    capacity, tail = tails.shape[1], tails.shape[2]
    nb = state[0]
    for g in range(k):
        at = g * stride
        i = _key_slot(keys, blocks, flat[at])
        if blocks[i] < 0:
            keys[i], blocks[i] = flat[at], nb
            begins[nb], sizes[nb] = 0, 0
            nb += 1
        b, size, begin = blocks[i], sizes[blocks[i]], begins[blocks[i]]
        found = -1
        for j in range(size - 1, -1, -1):  # newest first: a tail comes back soon, if at all
            p = (begin + j) % capacity
            same = True
            for t in range(tail):
                if tails[b, p, t] != flat[at + 1 + t]:
                    same = False
                    break
            if same:
                found = j
                break
        if found >= 0:  # to the end, counted once more
            times = counts[b, (begin + found) % capacity] + 1
            for j in range(found, size - 1):
                p, q = (begin + j) % capacity, (begin + j + 1) % capacity
                tails[b, p, :] = tails[b, q, :]
                counts[b, p] = counts[b, q]
            p = (begin + size - 1) % capacity
        elif size < capacity:
            times, p = 1, (begin + size) % capacity
            sizes[b] = size + 1
        else:  # over the oldest
            times, p = 1, begin
            begins[b] = (begin + 1) % capacity
        tails[b, p, :] = flat[at + 1 : at + 1 + tail]
        counts[b, p] = times
    state[0] = nb


@njit(cache=True)
def rehash_keys(keys: np.ndarray, blocks: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    new_keys, new_blocks = np.zeros(size, np.int64), np.full(size, -1, np.int64)
    for i in range(len(keys)):
        if blocks[i] >= 0:
            j = _key_slot(new_keys, new_blocks, keys[i])
            new_keys[j], new_blocks[j] = keys[i], blocks[i]
    return new_keys, new_blocks


@njit(cache=True)
def _ranked(counts: np.ndarray, begins: np.ndarray, sizes: np.ndarray, b: int, frequent: bool) -> np.ndarray:
    """Block b's rows, newest first, or with `frequent` most often inserted first (ties: newest)."""
    size, capacity = sizes[b], counts.shape[1]
    order = np.empty(size, np.int64)
    for j in range(size):
        order[j] = (begins[b] + size - 1 - j) % capacity
    if frequent:  # a stable insertion sort: a block holds tens of rows at most
        for j in range(1, size):
            p = order[j]
            i = j
            while i > 0 and counts[b, order[i - 1]] < counts[b, p]:
                order[i] = order[i - 1]
                i -= 1
            order[i] = p
    return order


@njit(cache=True)
def pool_rows(keys, blocks, tails, counts, begins, sizes, key, frequent, oldest):
    """The tails under `key` as rows `[m, n - 1]`: best first (`NGramPool.best`), or with `oldest`
    oldest first."""
    b = _block(keys, blocks, key) if len(keys) else -1
    if b < 0:
        return np.zeros((0, tails.shape[2]), np.int64)
    order = _ranked(counts, begins, sizes, b, frequent)
    if oldest:
        order = order[::-1]
    out = np.empty((len(order), tails.shape[2]), np.int64)
    for j in range(len(order)):
        out[j, :] = tails[b, order[j], :]
    return out


@njit(cache=True)
def _pool_drafts(
    keys, blocks, tails, counts, begins, sizes, key, frequent, skip, after, tokens, starts, sources, c, source, ranks
):
    """Append the tails under `key`, best first, as chains c, c + 1, ... (the r-th from source
    `source + min(r, ranks - 1)`); with `skip`, only the tails that start with `after`, less
    that token. The chains' count after them."""
    b = _block(keys, blocks, key) if len(keys) else -1
    if b < 0:
        return c
    order = _ranked(counts, begins, sizes, b, frequent)
    first = c
    m = tails.shape[2] - skip
    for j in range(len(order)):
        p = order[j]
        if skip and tails[b, p, 0] != after:
            continue
        s = starts[c]
        tokens[s : s + m] = tails[b, p, skip:]
        starts[c + 1] = s + m
        sources[c] = source + min(c - first, ranks - 1)
        c += 1
    return c


# -- a step's chains ----------------------------------------------------------------------------


@njit(cache=True)
def step_chains(
    seq,
    n,
    ids,
    prev,
    head,
    longest,
    length,
    count,
    keys,
    blocks,
    tails,
    counts,
    begins,
    sizes,
    context,
    frequent,
    ranks,
    row,
    row_source,
):
    """A step's drafts as chains (tokens, starts, sources), best first by kind: the text's
    (`count` of them, at most `length` tokens each), the sources from 0; with `context`, the
    pool's tails under the token before x0 that continue with x0, the sources after the text's
    `ranks[0]`; the pool's tails under x0 (by `frequent`), the sources after those `ranks[1]`;
    then `row` (if not empty) from `row_source`."""
    capacity, tail = tails.shape[1], tails.shape[2]
    bound = max(count, 0) * max(length, 0) + 2 * capacity * tail + len(row)
    tokens = np.empty(bound, np.int64)
    starts = np.zeros(max(count, 0) + 2 * capacity + 2, np.int64)
    sources = np.empty(len(starts) - 1, np.int64)
    c = _text_drafts(seq, n, ids, prev, head, longest, length, count, tokens, starts, sources, 0, 0, ranks[0])
    if n:
        x0 = seq[n - 1]
        if context and n > 1:
            c = _pool_drafts(
                keys, blocks, tails, counts, begins, sizes, seq[n - 2], False, 1, x0, tokens, starts, sources, c,
                ranks[0], ranks[1],
            )  # fmt: skip
        c = _pool_drafts(
            keys, blocks, tails, counts, begins, sizes, x0, frequent, 0, 0, tokens, starts, sources, c,
            ranks[0] + ranks[1], ranks[2],
        )  # fmt: skip
    if len(row):
        s = starts[c]
        tokens[s : s + len(row)] = row
        starts[c + 1] = s + len(row)
        sources[c] = row_source
        c += 1
    return tokens[: starts[c]], starts[: c + 1], sources[:c]

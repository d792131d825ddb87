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
compared. Per id the newest position ending it, per position and L the id and the previous
position ending the same L-gram: a suffix's occurrences are a walk, newest first. With `lone`,
each token is interned too (key (1, -1, token), column GRAMS), for the drafts of x0's lone
matches.

The pool keeps each first token's tails in a block, a ring of `capacity` rows oldest first (a
tail and its count): a new tail goes in at the end (over the oldest one when full), a tail
inserted again moves to the end, its count one more. N-grams are queued, and inserted when a
read of their key or a flush comes (lp/lookahead/pool.py says why).

The loops take few arrays (each argument adds to a call's cost) and make room for nothing: the
classes size the arrays before a write."""

from __future__ import annotations

import numpy as np
from numba import njit

MIN_MATCH = 2  # a suffix of one token (x0 alone) is the pool's job
MAX_MATCH = 8  # longer suffixes rank no higher than this
GRAMS = MAX_MATCH - MIN_MATCH + 1  # L-gram lengths indexed (then, in column GRAMS, x0's lone token)

_FIB = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


@njit(cache=True)
def _spread(h: np.uint64, mask: int) -> int:
    """A slot of a power-of-two table from a 64-bit hash: its high bits mixed down."""
    return np.int64(((h * _FIB) >> np.uint64(32)) & np.uint64(mask))


# -- the text index -----------------------------------------------------------------------------


@njit(cache=True)
def _gram_slot(table: np.ndarray, L: int, before: int, token: int) -> int:
    """The slot of key (L, before, token) in the L-gram table (rows: L, before, token, id; id
    -1: empty), or the empty slot where it would go."""
    mask = len(table) - 1
    i = _spread(np.uint64(before) * _MIX + np.uint64(token) + np.uint64(L), mask)
    while table[i, 3] >= 0 and not (table[i, 0] == L and table[i, 1] == before and table[i, 2] == token):
        i = (i + 1) & mask
    return i


@njit(cache=True)
def index_tokens(seq, grams, head, table, n, made, new, longest, lone):
    """Append `new` to `seq[:n]` and index the L-grams (L <= `longest`) ending at each new
    token: `grams[e, L - MIN_MATCH]` (id, previous position ending it), `head[id]` (the newest);
    with `lone`, the token itself too (`grams[e, GRAMS]`). `made`: the ids so far; the ids
    after. The caller made room."""
    for t in range(len(new)):
        token = new[t]
        e = n + t
        seq[e] = token
        for L in range(MIN_MATCH, min(longest, e + 1) + 1):
            col = L - MIN_MATCH
            before = seq[e - 1] if L == MIN_MATCH else grams[e - 1, col - 1, 0]
            made = _intern(grams, head, table, made, e, col, L, before, token)
        if lone:
            made = _intern(grams, head, table, made, e, GRAMS, 1, -1, token)
    return made


@njit(cache=True)
def _intern(grams, head, table, made, e, col, L, before, token):
    """Index the L-gram with key (L, before, token) as ending at e (column `col`); the ids after."""
    i = _gram_slot(table, L, before, token)
    if table[i, 3] < 0:
        table[i, 0], table[i, 1], table[i, 2], table[i, 3] = L, before, token, made
        head[made] = -1
        made += 1
    g = table[i, 3]
    grams[e, col, 0], grams[e, col, 1] = g, head[g]
    head[g] = e
    return made


@njit(cache=True)
def rehash_grams(table: np.ndarray, size: int) -> np.ndarray:
    """The same L-gram ids in a table of `size` slots."""
    new = np.full((size, 4), -1, np.int64)
    for i in range(len(table)):
        if table[i, 3] >= 0:
            new[_gram_slot(new, table[i, 0], table[i, 1], table[i, 2]), :] = table[i, :]
    return new


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
def _take(seq, e, m, tokens, starts, sources, first, c, source, ranks):
    """The occurrence ending at e's continuation, `seq[e + 1 : e + 1 + m]`, as chain c (from
    source `source + min(c - first, ranks - 1)`) unless chains first..c-1 hold it: the chains'
    count after it."""
    if _known(tokens, starts, first, c, seq, e + 1, m):
        return c
    s = starts[c]
    tokens[s : s + m] = seq[e + 1 : e + 1 + m]
    starts[c + 1] = s + m
    sources[c] = source + min(c - first, ranks - 1)
    return c + 1


@njit(cache=True)
def _text_drafts(seq, n, grams, head, longest, length, count, tokens, starts, sources, c, source, ranks):
    """Append the text's drafts as chains c, c + 1, ... (`TextIndex.drafts`), the r-th from
    source `source + min(r, ranks - 1)`; the chains' count after them."""
    if length < 1 or count < 1:
        return c
    last, first = n - 1, c
    top = min(longest, n)
    for L in range(top, MIN_MATCH - 1, -1):
        col = L - MIN_MATCH
        e = head[grams[last, col, 0]]
        while e >= 0:
            # an occurrence that matches L + 1 tokens was taken at L + 1 (its continuation is there)
            if e != last and not (L < top and grams[e, col + 1, 0] == grams[last, col + 1, 0]):
                c = _take(seq, e, min(length, last - e), tokens, starts, sources, first, c, source, ranks)
                if c - first == count:
                    return c
            e = grams[e, col, 1]
    return c


@njit(cache=True)
def _lone_drafts(seq, n, grams, head, length, count, tokens, starts, sources, c, source, ranks):
    """Append the drafts of x0's lone matches as chains c, c + 1, ... (`TextIndex.lone_drafts`),
    the r-th from source `source + min(r, ranks - 1)`; the chains' count after them."""
    if length < 1 or count < 1 or n < 2:
        return c
    last, first, before = n - 1, c, seq[n - 2]
    e = head[grams[last, GRAMS, 0]]
    while e >= 0:
        # an occurrence that matches the token before x0 too is a text draft's (`_text_drafts`)
        if e != last and not (e > 0 and seq[e - 1] == before):
            c = _take(seq, e, min(length, last - e), tokens, starts, sources, first, c, source, ranks)
            if c - first == count:
                return c
        e = grams[e, GRAMS, 1]
    return c


@njit(cache=True)
def text_drafts(seq, n, grams, head, longest, length, count, lone):
    """`TextIndex.drafts` (or, with `lone`, `TextIndex.lone_drafts`) as chains: their tokens and
    starts."""
    count = max(count, 0)
    tokens = np.empty(count * max(length, 0), np.int64)
    starts = np.zeros(count + 1, np.int64)
    sources = np.empty(count, np.int64)
    if lone:
        c = _lone_drafts(seq, n, grams, head, length, count, tokens, starts, sources, 0, 0, 1)
    else:
        c = _text_drafts(seq, n, grams, head, longest, length, count, tokens, starts, sources, 0, 0, 1)
    return tokens[: starts[c]], starts[: c + 1]


# -- the n-gram pool ----------------------------------------------------------------------------


@njit(cache=True)
def _key_slot(table: np.ndarray, key: int) -> int:
    """The slot of `key` in the pool's table (rows: key, block; block -1: empty), or the empty
    slot where it would go."""
    mask = len(table) - 1
    i = _spread(np.uint64(key), mask)
    while table[i, 1] >= 0 and table[i, 0] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _block(table: np.ndarray, key: int) -> int:
    """The block of `key`'s tails, or -1."""
    return table[_key_slot(table, key), 1] if len(table) else -1


@njit(cache=True)
def _insert(table, rows, rings, made, queue, r):
    """Insert n-gram `queue[:, r]` (its key, then its tail): block b's rows `rows[b]` (a tail,
    its count) form a ring, `rings[b]` its oldest row, the rows in use, then each row's
    fingerprint (a row's tokens are compared only where the fingerprint matches: a block's rows
    span several cache lines, their fingerprints two). `made`: the blocks so far; the blocks
    after. The caller made room for one more."""
    capacity, tail = rows.shape[1], rows.shape[2] - 1
    i = _key_slot(table, queue[0, r])
    if table[i, 1] < 0:
        table[i, 0], table[i, 1] = queue[0, r], made
        rings[made, 0], rings[made, 1] = 0, 0
        made += 1
    b = table[i, 1]
    begin, size = rings[b, 0], rings[b, 1]
    mark = np.uint64(tail)
    for t in range(tail):
        mark = (mark ^ np.uint64(queue[1 + t, r])) * _FIB
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
    return made


@njit(cache=True)
def pool_queue(table, rings, state, queue, flat, stride, k):
    """Queue n-grams i < k, `flat[i * stride : i * stride + n]`, in order, as columns of `queue`
    (row 0 the keys); `state`: the blocks made, the n-grams queued. False (and nothing queued)
    without room for them: in the queue, and for a block each (the table at most half full)."""
    need = state[0] + state[1] + k
    if state[1] + k > queue.shape[1] or need > len(rings) or 2 * need > len(table):
        return False
    n, q = queue.shape[0], state[1]
    for g in range(k):
        for t in range(n):
            queue[t, q + g] = flat[g * stride + t]
    state[1] = q + k
    return True


@njit(cache=True)
def _land(table, rows, rings, state, queue, key):
    """Insert the queued n-grams of `key`, in order; the others stay queued, in order."""
    made, kept = state[0], 0
    for r in range(state[1]):
        if queue[0, r] == key:
            made = _insert(table, rows, rings, made, queue, r)
        else:
            if kept != r:
                for t in range(queue.shape[0]):
                    queue[t, kept] = queue[t, r]
            kept += 1
    state[0], state[1] = made, kept


@njit(cache=True)
def pool_flush(table, rows, rings, state, queue):
    """Insert every queued n-gram, in order."""
    made = state[0]
    for r in range(state[1]):
        made = _insert(table, rows, rings, made, queue, r)
    state[0], state[1] = made, 0


@njit(cache=True)
def rehash_keys(table: np.ndarray, size: int) -> np.ndarray:
    """The same keys and blocks in a table of `size` slots."""
    new = np.full((size, 2), -1, np.int64)
    for i in range(len(table)):
        if table[i, 1] >= 0:
            new[_key_slot(new, table[i, 0]), :] = table[i, :]
    return new


@njit(cache=True)
def _ranked(rows: np.ndarray, rings: np.ndarray, b: int, frequent: bool) -> np.ndarray:
    """Block b's rows, newest first, or with `frequent` most often inserted first (ties: newest)."""
    capacity, tail = rows.shape[1], rows.shape[2] - 1
    begin, size = rings[b, 0], rings[b, 1]
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


@njit(cache=True)
def pool_rows(table, rows, rings, state, queue, key, frequent, oldest):
    """The tails under `key` as rows `[m, n - 1]` (its queued n-grams inserted first): best first
    (`NGramPool.best`), or with `oldest` oldest first."""
    tail = rows.shape[2] - 1
    _land(table, rows, rings, state, queue, key)
    b = _block(table, key)
    if b < 0:
        return np.zeros((0, tail), np.int64)
    order = _ranked(rows, rings, b, frequent)
    if oldest:
        order = order[::-1]
    out = np.empty((len(order), tail), np.int64)
    for j in range(len(order)):
        out[j, :] = rows[b, order[j], :tail]
    return out


@njit(cache=True)
def _pool_drafts(table, rows, rings, key, frequent, skip, after, tokens, starts, sources, c, source, ranks):
    """Append the tails under `key`, best first, as chains c, c + 1, ... (the r-th from source
    `source + min(r, ranks - 1)`); with `skip`, only the tails that start with `after`, less
    that token. The chains' count after them."""
    b = _block(table, key)
    if b < 0:
        return c
    order = _ranked(rows, rings, b, frequent)
    first, tail = c, rows.shape[2] - 1
    m = tail - skip
    for j in range(len(order)):
        p = order[j]
        if skip and rows[b, p, 0] != after:
            continue
        s = starts[c]
        tokens[s : s + m] = rows[b, p, skip:tail]
        starts[c + 1] = s + m
        sources[c] = source + min(c - first, ranks - 1)
        c += 1
    return c


# -- a step's outcome ---------------------------------------------------------------------------


@njit(cache=True)
def feed_step(
    seq, grams, head, table, n, made, new, longest, lone, state, queue, window, level, from_window, from_text
):
    """A step's outcome fed to the text and the pool (`DraftSources.observe`): with
    `from_window`, the W n-grams that the window `[N - 1, W]` closes with its new `level` are
    queued for the pool (column j: x0 = `seq[n - 1]` or `window[0, j]`, the levels above,
    `level[j]`); the committed `new` join the text (`index_tokens`); with `from_text`, the
    n-grams that end in them are queued. `state`, `queue`: the pool's. The ids after. The caller
    made room in the text and the queue."""
    q, size = state[1], queue.shape[0]
    levels, W = window.shape
    if from_window:
        for j in range(W):
            queue[0, q] = seq[n - 1] if j == 0 else window[0, j]
            for lvl in range(1, levels):
                queue[lvl, q] = window[lvl, j]
            queue[size - 1, q] = level[j]
            q += 1
    made = index_tokens(seq, grams, head, table, n, made, new, longest, lone)
    if from_text:
        for start in range(max(n - size + 1, 0), n + len(new) - size + 1):
            for t in range(size):
                queue[t, q] = seq[start + t]
            q += 1
    state[1] = q
    return made


# -- a step's chains ----------------------------------------------------------------------------


@njit(cache=True)
def step_chains(
    seq,
    n,
    grams,
    head,
    longest,
    lone,
    length,
    count,
    table,
    rows,
    rings,
    state,
    queue,
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
    with `lone`, the drafts of x0's lone matches (`count` of them), the sources after those
    `ranks[2]`; then `row` (if not empty) from `row_source`. The pool's queued n-grams of the two
    keys it reads are inserted first."""
    capacity, tail = rows.shape[1], rows.shape[2] - 1
    count = max(count, 0)
    tokens = np.empty(2 * count * max(length, 0) + 2 * capacity * tail + len(row), np.int64)
    starts = np.zeros(2 * count + 2 * capacity + 2, np.int64)
    sources = np.empty(len(starts) - 1, np.int64)
    c = _text_drafts(seq, n, grams, head, longest, length, count, tokens, starts, sources, 0, 0, ranks[0])
    if n:
        x0 = seq[n - 1]
        if context and n > 1:
            _land(table, rows, rings, state, queue, seq[n - 2])
            c = _pool_drafts(
                table, rows, rings, seq[n - 2], False, 1, x0, tokens, starts, sources, c, ranks[0], ranks[1]
            )
        _land(table, rows, rings, state, queue, x0)
        c = _pool_drafts(
            table, rows, rings, x0, frequent, 0, 0, tokens, starts, sources, c, ranks[0] + ranks[1], ranks[2]
        )
    if lone:
        source = ranks[0] + ranks[1] + ranks[2]
        c = _lone_drafts(seq, n, grams, head, length, count, tokens, starts, sources, c, source, ranks[3])
    if len(row):
        s = starts[c]
        tokens[s : s + len(row)] = row
        starts[c + 1] = s + len(row)
        sources[c] = row_source
        c += 1
    return tokens[: starts[c]], starts[: c + 1], sources[:c]

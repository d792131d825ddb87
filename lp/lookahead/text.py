"""Drafts from the text itself: where the sequence's last tokens occurred before (in the prompt or
the output so far), what followed them is a candidate, as in prompt lookup and suffix decoding.
Such drafts can be longer than the pool's (N-1)-token n-grams.

`TextIndex` keeps the sequence and, for every L-gram in it (MIN_MATCH <= L <= MAX_MATCH), the
positions where it ends, newest first, so a step's text drafts are a walk over the occurrences of
the sequence's suffixes, not a scan of the sequence; a token costs MAX_MATCH - 1 hash lookups,
once. Each L-gram is interned as an id: the L-gram ending at position e is the (L-1)-gram ending at
e - 1 followed by the token at e, so its key is (L, that (L-1)-gram's id, token), the token before
it for L = MIN_MATCH: exact, with no tokens compared. With `lone`, each token is interned too
(key (1, -1, token), column GRAMS): the drafts of x0's lone matches. With `vocab`, each token's
earlier occurrences are chained too, for the text's continuations below tree nodes
(lp/lookahead/grow.py).

Fields: the sequence `seq[:n]`; per position e and column L - MIN_MATCH, `grams[e, col]`: the
L-gram's id (-1 where none ends at e) and the previous position ending it (-1: none); per id,
`head` (the newest position ending it); the ids' hash table `table`, rows (L, the (L-1)-gram's id
or the token before, token, id; id -1: an empty slot), `n_ids` ids made; per token, `latest`
(its newest position before the last, whose follower is known; -1: none) and per position
`earlier` (the previous position of its token), up to position `seen`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba.experimental import structref

from lp.errors import LPError
from lp.jit import State, bit_length, compiled
from lp.lookahead.chains import Chains, add, holds, new_chains

MIN_MATCH = 2  # a suffix of one token (x0 alone) is the pool's job
MAX_MATCH = 8  # longer suffixes rank no higher than this
GRAMS = MAX_MATCH - MIN_MATCH + 1  # L-gram lengths indexed (then, in column GRAMS, x0's lone token)
FIB = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a key's high bits mixed down to a slot
_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


@structref.register
class TextIndexType(State):
    pass


class TextIndex(structref.StructRefProxy):
    """The sequence and its index of earlier occurrences. `indexed=False` keeps the sequence only
    (a decode that takes no text drafts); `lone`: each token's occurrences too (`lone_drafts`);
    `vocab` > 0: each token's earlier occurrences for the continuations (tokens below `vocab`);
    `room`: the tokens it holds without growing (growing copies every array)."""

    def __new__(
        cls,
        tokens: Sequence[int] | np.ndarray = (),
        indexed: bool = True,
        lone: bool = False,
        room: int = 0,
        vocab: int = 0,
    ) -> TextIndex:
        return new_text_index(np.asarray(tokens, dtype=np.int64), indexed, lone, room, vocab)

    @property
    def tokens(self) -> np.ndarray:
        """The sequence (a copy)."""
        return _tokens(self)

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append committed tokens."""
        new = np.asarray(tokens, dtype=np.int64)
        reserve(self, len(new))
        extend(self, new)

    def drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of earlier
        occurrences of the sequence's suffix, best first: the longest matched suffix (at least
        MIN_MATCH tokens, counted up to MAX_MATCH), then the most recent occurrence."""
        chains = new_chains(max(count, 0), max(count, 0) * max(length, 0))
        suffix_drafts(self, length, count, chains, 0, 1)
        return chains.drafts

    def lone_drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of the earlier
        occurrences of x0 that match no longer suffix (those are `drafts`'), most recent first:
        the one-token matches prompt lookup falls back to. None unless the index is `lone`."""
        chains = new_chains(max(count, 0), max(count, 0) * max(length, 0))
        lone_drafts(self, length, count, chains, 0, 1)
        return chains.drafts


structref.define_proxy(
    TextIndex,
    TextIndexType,
    ["seq", "n", "grams", "head", "table", "n_ids", "longest", "lone", "latest", "earlier", "seen"],
)


@compiled
def new_text_index(tokens: np.ndarray, indexed: bool, lone: bool, room: int, vocab: int) -> TextIndex:
    """A TextIndex of `tokens` (TextIndex's arguments)."""
    text = TextIndex(
        np.zeros(0, np.int64),
        0,
        np.zeros((0, GRAMS + 1, 2), np.int64),
        np.zeros(0, np.int64),
        np.full((256, 4), -1, np.int64),
        0,
        MAX_MATCH if indexed else 0,
        lone and indexed,
        np.full(vocab, -1, np.int64),
        np.zeros(0, np.int64),
        0,
    )
    if room:
        _grow(text, room)
        _fit(text, room)
    reserve(text, len(tokens))
    extend(text, tokens)
    return text


@compiled
def reserve(text: TextIndex, tokens: int) -> None:
    """Room for `tokens` more tokens and their ids."""
    need = text.n + tokens
    if need > len(text.seq):
        _grow(text, 2 * need)
    _fit(text, tokens)


@compiled
def _grow(text: TextIndex, size: int) -> None:
    """Room for `size` tokens: every array copied into a larger one."""
    n, old = text.n, len(text.seq)
    longer_seq = np.zeros(size, np.int64)
    longer_seq[:n] = text.seq[:n]
    longer_grams = np.full((size, GRAMS + 1, 2), -1, np.int64)
    longer_grams[:old] = text.grams
    longer_head = np.zeros(size * (GRAMS + 1), np.int64)
    longer_head[: len(text.head)] = text.head
    text.seq, text.grams, text.head = longer_seq, longer_grams, longer_head
    if len(text.latest):
        longer_earlier = np.full(size, -1, np.int64)
        longer_earlier[: len(text.earlier)] = text.earlier
        text.earlier = longer_earlier


@compiled
def _fit(text: TextIndex, tokens: int) -> None:
    """Room in the ids' hash table for the ids of `tokens` more tokens (at most half full: short probes)."""
    most = text.n_ids + (GRAMS + text.lone) * tokens if text.longest else 0
    if 2 * most > len(text.table):
        old = text.table
        rehashed = np.full((1 << bit_length(2 * most), 4), -1, np.int64)
        for i in range(len(old)):
            if old[i, 3] >= 0:
                rehashed[_slot(rehashed, old[i, 0], old[i, 1], old[i, 2]), :] = old[i, :]
        text.table = rehashed


@compiled
def _slot(table: np.ndarray, L: int, before: int, token: int) -> int:
    """The slot of key (L, before, token) in the ids' table, or the empty slot where it would go."""
    mask = len(table) - 1
    h = np.uint64(before) * _MIX + np.uint64(token) + np.uint64(L)
    i = np.int64(((h * FIB) >> np.uint64(32)) & np.uint64(mask))
    while table[i, 3] >= 0 and not (table[i, 0] == L and table[i, 1] == before and table[i, 2] == token):
        i = (i + 1) & mask
    return i


@compiled
def find_gram(text: TextIndex, L: int, before: int, token: int) -> int:
    """The id of the L-gram with key (L, before, token) (`before`: the (L-1)-gram's id, or for
    L = MIN_MATCH the token before), -1 where the text holds none."""
    return text.table[_slot(text.table, L, before, token), 3]


@compiled
def extend(text: TextIndex, new: np.ndarray) -> None:
    """Append `new` (after `reserve`) and index the L-grams (L <= `longest`) ending at each new
    token, with `lone` the token itself, and with `latest` the occurrences whose follower is now
    known."""
    seq, grams = text.seq, text.grams
    for t in range(len(new)):
        token = new[t]
        e = text.n + t
        seq[e] = token
        for L in range(MIN_MATCH, min(text.longest, e + 1) + 1):
            col = L - MIN_MATCH
            before = seq[e - 1] if L == MIN_MATCH else grams[e - 1, col - 1, 0]
            _intern(text, e, col, L, before, token)
        if text.lone:
            _intern(text, e, GRAMS, 1, -1, token)
    text.n += len(new)
    latest, earlier = text.latest, text.earlier
    if len(latest):
        for e in range(text.seen, text.n - 1):
            if not 0 <= seq[e] < len(latest):
                raise LPError("a text token is not in the vocabulary of its occurrences' index")
            earlier[e] = latest[seq[e]]
            latest[seq[e]] = e
        text.seen = max(text.seen, text.n - 1)


@compiled
def _intern(text: TextIndex, e: int, col: int, L: int, before: int, token: int) -> None:
    """Index the L-gram with key (L, before, token) as ending at e (column `col`)."""
    table, head = text.table, text.head
    i = _slot(table, L, before, token)
    if table[i, 3] < 0:
        table[i, 0], table[i, 1], table[i, 2], table[i, 3] = L, before, token, text.n_ids
        head[text.n_ids] = -1
        text.n_ids += 1
    g = table[i, 3]
    text.grams[e, col, 0], text.grams[e, col, 1] = g, head[g]
    head[g] = e


@compiled
def _take(text: TextIndex, e: int, length: int, chains: Chains, first: int, source: int, ranks: int) -> None:
    """The continuation of the occurrence ending at e, `seq[e + 1 : e + 1 + length]`, as a draft
    (the r-th of drafts `first`..: from source `source + min(r, ranks - 1)`) unless one holds it."""
    if not holds(chains, first, text.seq, e + 1, length):
        add(chains, text.seq, e + 1, length, source + min(chains.count - first, ranks - 1))


@compiled
def suffix_drafts(text: TextIndex, length: int, count: int, chains: Chains, source: int, ranks: int) -> None:
    """Append `TextIndex.drafts(length, count)` to `chains`, the r-th from source
    `source + min(r, ranks - 1)`."""
    if length < 1 or count < 1:
        return
    grams, head = text.grams, text.head
    last, first = text.n - 1, chains.count
    top = min(text.longest, text.n)
    for L in range(top, MIN_MATCH - 1, -1):
        col = L - MIN_MATCH
        e = head[grams[last, col, 0]]
        while e >= 0:
            # an occurrence that matches L + 1 tokens was taken at L + 1 (its continuation is there)
            if e != last and not (L < top and grams[e, col + 1, 0] == grams[last, col + 1, 0]):
                _take(text, e, min(length, last - e), chains, first, source, ranks)
                if chains.count - first == count:
                    return
            e = grams[e, col, 1]


@compiled
def lone_drafts(text: TextIndex, length: int, count: int, chains: Chains, source: int, ranks: int) -> None:
    """Append `TextIndex.lone_drafts(length, count)` to `chains`, the r-th from source
    `source + min(r, ranks - 1)`."""
    if length < 1 or count < 1 or text.n < 2 or not text.lone:
        return
    seq, grams = text.seq, text.grams
    last, first, before = text.n - 1, chains.count, seq[text.n - 2]
    e = text.head[grams[last, GRAMS, 0]]
    while e >= 0:
        # an occurrence that matches the token before x0 too is a suffix draft's
        if e != last and not (e > 0 and seq[e - 1] == before):
            _take(text, e, min(length, last - e), chains, first, source, ranks)
            if chains.count - first == count:
                return
        e = grams[e, GRAMS, 1]


@compiled
def _tokens(text: TextIndex) -> np.ndarray:
    return text.seq[: text.n].copy()


__all__ = [
    "GRAMS",
    "MAX_MATCH",
    "MIN_MATCH",
    "TextIndex",
    "extend",
    "find_gram",
    "lone_drafts",
    "new_text_index",
    "reserve",
    "suffix_drafts",
]

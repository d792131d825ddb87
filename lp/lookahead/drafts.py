"""Drafts from the text itself: where the sequence's last tokens occurred before (in the prompt
or the output so far), what followed them is a candidate, as in prompt lookup and suffix
decoding. Such drafts can be longer than the pool's (N-1)-token n-grams. And a step's drafts of
every kind, the text's and the pool's, read in one compiled loop (lp/lookahead/draft_loops.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.draft_loops import (
    GRAMS,
    MAX_MATCH,
    MIN_MATCH,
    index_tokens,
    rehash_grams,
    step_chains,
    text_drafts,
)
from lp.lookahead.pool import NGramPool


class TextIndex:
    """A sequence and, for every L-gram in it (MIN_MATCH <= L <= MAX_MATCH), the positions
    where it ends, newest first: a step's text drafts are then a walk over the occurrences of
    the sequence's suffixes, not a scan of the whole sequence; extending by a token costs
    MAX_MATCH - 1 hash lookups, once. `indexed=False` keeps the sequence only (a decode that
    takes no text drafts). With `lone`, every token's occurrences too (`lone_drafts`). `room`:
    the tokens it holds without growing (growing copies every array: a step's worth of work).

    Arrays (lp/lookahead/draft_loops.py): the sequence `seq[:n]`; per position e and L-gram
    column L - MIN_MATCH (the token itself: column GRAMS), `grams[e, col]`: the L-gram's id (-1
    where none ends at e) and the previous position ending it (-1: none); per id, `head` (the
    newest position ending it); the ids' hash table `table`, rows (L, the (L-1)-gram's id or the
    token before, token, id; id -1: an empty slot)."""

    def __init__(
        self, tokens: Sequence[int] | np.ndarray = (), indexed: bool = True, lone: bool = False, room: int = 0
    ) -> None:
        self.longest = MAX_MATCH if indexed else 0
        self.lone = lone and indexed
        self.seq = np.zeros(0, np.int64)
        self.grams = np.zeros((0, GRAMS + 1, 2), np.int64)
        self.head = np.zeros(0, np.int64)
        self.table = np.full((256, 4), -1, np.int64)
        self.n = 0
        self.n_ids = 0  # L-gram ids made (the next id)
        if room:
            self._grow(room)
            self._fit(0, room)
        self.extend(tokens)

    @property
    def tokens(self) -> np.ndarray:
        """The sequence (a view: read it before the next `extend`)."""
        return self.seq[: self.n]

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append committed tokens."""
        new = np.asarray(tokens, dtype=np.int64)
        self.reserve(len(new))
        self.n_ids = index_tokens(
            self.seq, self.grams, self.head, self.table, self.n, self.n_ids, new, self.longest, self.lone
        )
        self.n += len(new)

    def appended(self, tokens: int, n_ids: int) -> None:
        """`tokens` more tokens were appended and indexed in place (`index_tokens`, by the caller's
        compiled loop, after `reserve`), the L-gram ids made now `n_ids`."""
        self.n += tokens
        self.n_ids = n_ids

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` more tokens and their ids."""
        need = self.n + tokens
        if need > len(self.seq):
            self._grow(2 * need)
        self._fit(self.n_ids, tokens)

    def _fit(self, ids: int, tokens: int) -> None:
        """Room in the ids' hash table for the ids of `tokens` more tokens after `ids` ids."""
        most = ids + (GRAMS + self.lone) * tokens if self.longest else 0
        if 2 * most > len(self.table):  # at most half full: short probes
            self.table = rehash_grams(self.table, 1 << (2 * most).bit_length())

    def _grow(self, size: int) -> None:
        """Room for `size` tokens."""
        more = size - len(self.seq)
        self.seq = np.concatenate([self.seq, np.zeros(more, np.int64)])
        self.grams = np.concatenate([self.grams, np.full((more, GRAMS + 1, 2), -1, np.int64)])
        self.head = np.concatenate([self.head, np.zeros(more * (GRAMS + 1), np.int64)])

    def drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of earlier
        occurrences of the sequence's suffix, best first: the longest matched suffix (at least
        MIN_MATCH tokens, counted up to MAX_MATCH), then the most recent occurrence."""
        return as_tuples(*text_drafts(self.seq, self.n, self.grams, self.head, self.longest, length, count, False))

    def lone_drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of the earlier
        occurrences of x0 that match no longer suffix (those are `drafts`'), most recent first:
        the one-token matches prompt lookup falls back to. None unless the index is `lone`."""
        if not self.lone:
            return []
        return as_tuples(*text_drafts(self.seq, self.n, self.grams, self.head, self.longest, length, count, True))


def step_drafts(
    text: TextIndex,
    pool: NGramPool,
    *,
    length: int,
    count: int,
    context: bool,
    frequent: bool,
    ranks: np.ndarray,
    row: np.ndarray,
    row_source: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step's drafts, best first by kind, as chains: draft c is `tokens[starts[c] :
    starts[c + 1]]` from source `sources[c]`. The text's (`TextIndex.drafts(length, count)`),
    the r-th from source min(r, ranks[0] - 1); with `context`, the tails of the pool's n-grams
    that start with the sequence's last two tokens (N-2 tokens each: two matched tokens predict
    better than one), newest first, the r-th from ranks[0] + min(r, ranks[1] - 1); the pool's
    tails under the last token (`NGramPool.best(x0, frequent)`), from ranks[0] + ranks[1] +
    min(r, ranks[2] - 1); with a `lone` index, the drafts of x0's lone matches
    (`TextIndex.lone_drafts(length, count)`), from ranks[0] + ranks[1] + ranks[2] + min(r, ranks[3]
    - 1); then `row`, if not empty, from `row_source`."""
    return step_chains(
        text.seq, text.n, text.grams, text.head, text.longest, text.lone, length, count,
        pool.table, pool.rows, pool.rings, pool.state, pool.queue, context, frequent, ranks, row, row_source,
    )  # fmt: skip


def as_tuples(tokens: np.ndarray, starts: np.ndarray) -> list[tuple[int, ...]]:
    """Chains (draft c: `tokens[starts[c] : starts[c + 1]]`) as tuples of ints."""
    flat, bounds = tokens.tolist(), starts.tolist()
    return [tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:])]


__all__ = ["MAX_MATCH", "MIN_MATCH", "TextIndex", "as_tuples", "step_drafts"]

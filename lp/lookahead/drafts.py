"""Drafts from the text itself: where the sequence's last tokens occurred before (in the prompt
or the output so far), what followed them is a candidate, as in prompt lookup and suffix
decoding. Such drafts can be longer than the pool's (N-1)-token n-grams."""

from __future__ import annotations

from collections.abc import Iterable

MIN_MATCH = 2  # a suffix of one token (x0 alone) matches too often: its drafts are `lone_drafts`
MAX_MATCH = 8  # longer suffixes rank no higher than this


class TextIndex:
    """A sequence and, for every L-gram in it (MIN_MATCH <= L <= MAX_MATCH, and L = 1 with
    `lone`), the positions where it ends, oldest first. A step's text drafts are then a few dict
    lookups, not a scan of the whole sequence: extending by a token costs a few small inserts,
    once. `indexed=False` keeps the sequence only (a decode that takes no text drafts)."""

    def __init__(self, tokens: Iterable[int] = (), indexed: bool = True, lone: bool = False) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._shortest = 1 if lone and indexed else MIN_MATCH
        self._longest = MAX_MATCH if indexed else 0
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens."""
        seq, ends = self.tokens, self._ends
        for token in tokens:
            seq.append(int(token))
            e = len(seq) - 1
            for L in range(self._shortest, min(self._longest, e + 1) + 1):
                key = tuple(seq[e - L + 1 :])
                found = ends.get(key)
                if found is None:
                    ends[key] = [e]
                else:
                    found.append(e)

    def drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of earlier
        occurrences of the sequence's suffix, best first: the longest matched suffix (at least
        MIN_MATCH tokens, counted up to MAX_MATCH), then the most recent occurrence."""
        seq = self.tokens
        last = len(seq) - 1
        out: dict[tuple[int, ...], None] = {}
        seen: set[int] = set()
        if length < 1 or count < 1:
            return []
        # an occurrence that matches L tokens also matches every shorter suffix: take it once,
        # at its longest match
        for L in range(min(MAX_MATCH, last + 1), MIN_MATCH - 1, -1):
            for e in reversed(self._ends.get(tuple(seq[last - L + 1 :]), ())):
                if e == last or e in seen:
                    continue
                seen.add(e)
                out.setdefault(tuple(seq[e + 1 : e + 1 + length]))
                if len(out) == count:
                    return list(out)
        return list(out)

    def lone_drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to `count` distinct continuations (at most `length` tokens each) of the earlier
        occurrences of x0 that match no longer suffix (those are `drafts`'), most recent first:
        the one-token matches prompt lookup falls back to. None unless the index is `lone`."""
        seq = self.tokens
        last = len(seq) - 1
        out: dict[tuple[int, ...], None] = {}
        if length < 1 or count < 1 or self._shortest > 1 or last < 1:
            return []
        before = seq[last - 1]
        for e in reversed(self._ends.get((seq[last],), ())):
            if e == last or (e > 0 and seq[e - 1] == before):
                continue
            out.setdefault(tuple(seq[e + 1 : e + 1 + length]))
            if len(out) == count:
                break
        return list(out)


__all__ = ["MAX_MATCH", "MIN_MATCH", "TextIndex"]

"""Drafts from the text itself: where the sequence's last tokens occurred before (in the prompt
or the output so far), what followed them is a candidate, as in prompt lookup and suffix
decoding. Such drafts can be longer than the pool's (N-1)-token n-grams."""
from __future__ import annotations

import numpy as np

MIN_MATCH = 2  # a suffix of one token (x0 alone) is the pool's job
MAX_MATCH = 8  # longer suffixes rank no higher than this


def text_drafts(tokens: np.ndarray, length: int, count: int) -> list[tuple[int, ...]]:
    """Up to `count` distinct continuations (at most `length` tokens each) of earlier
    occurrences of the sequence's suffix, best first: the longest matched suffix (at least
    MIN_MATCH tokens, counted up to MAX_MATCH), then the most recent occurrence."""
    n = len(tokens)
    ends = np.flatnonzero(tokens[:n - 1] == tokens[n - 1]) if n > 1 else np.zeros(0, dtype=np.int64)
    if not len(ends) or length < 1 or count < 1:
        return []
    back = np.arange(min(MAX_MATCH, n))
    idx = ends[:, None] - back[None, :]
    same = (idx >= 0) & (tokens[np.maximum(idx, 0)] == tokens[n - 1 - back][None, :])
    match = np.cumprod(same, axis=1).sum(axis=1)
    keep = match >= MIN_MATCH
    ends, match = ends[keep], match[keep]
    out: dict[tuple[int, ...], None] = {}
    for e in ends[np.lexsort((-ends, -match))].tolist():
        out.setdefault(tuple(tokens[e + 1:e + 1 + length].tolist()))
        if len(out) == count:
            break
    return list(out)


__all__ = ["text_drafts"]

"""The draft sources whose acceptance rates are counted apart (lp/lookahead/rates.py), numbered:
each kind of a step's drafts by rank (lp/lookahead/drafts.py; a kind's last rank takes the ranks
after it), the window's row 0, and the text's continuations below tree nodes by the length of
their match (lp/lookahead/grow.py). The draft memory (lp/lookahead/memory.py) counts every
source's rates across decodes, so it needs their number as the drafts do."""

from __future__ import annotations

TEXT_RANKS, POOL_RANKS, LONE_RANKS = 4, 3, 2
MEMORY_SOURCES = 3  # the memory's drafts by the length of their match: 4 tokens or more, 3, 2
# the kinds in the order a step takes them: the text's suffix matches, the pool's context-matched
# n-grams, the pool's n-grams under x0, the text's lone matches of x0, the memory's suffix matches
KINDS = (TEXT_RANKS, POOL_RANKS, POOL_RANKS, LONE_RANKS, MEMORY_SOURCES)
MEMORY_SOURCE = sum(KINDS[:-1])  # the memory's first source
WINDOW_SOURCE = sum(KINDS)  # the window's row 0: its guesses of the next W - 1 tokens
CONTINUATION_SOURCE = WINDOW_SOURCE + 1  # + m: the text after an occurrence matching m more tokens
MATCHED = 2  # the path's tokens before a node that an earlier occurrence's must match, at most
SOURCES = CONTINUATION_SOURCE + MATCHED + 1

__all__ = [
    "CONTINUATION_SOURCE",
    "KINDS",
    "LONE_RANKS",
    "MATCHED",
    "MEMORY_SOURCE",
    "MEMORY_SOURCES",
    "POOL_RANKS",
    "SOURCES",
    "TEXT_RANKS",
    "WINDOW_SOURCE",
]

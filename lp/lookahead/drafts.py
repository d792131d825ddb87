"""A step's drafts, best first by kind, as chains (lp/lookahead/chains.py), each from a source whose
acceptance rate is counted apart (lp/lookahead/sources.py numbers them). The draft memory's
drafts, what followed the text's suffix in earlier decodes (lp/lookahead/memory.py), are a kind of
their own: where they do not fit a request, their counted rate drops them from its trees."""

from __future__ import annotations

from lp.jit import compiled
from lp.lookahead.chains import Chains, add, new_chains
from lp.lookahead.memory import DraftMemory, memory_drafts
from lp.lookahead.pool import NGramPool, tail_drafts
from lp.lookahead.sources import LONE_RANKS, MEMORY_SOURCE, POOL_RANKS, TEXT_RANKS, WINDOW_SOURCE
from lp.lookahead.text import TextIndex, lone_drafts, suffix_drafts
from lp.lookahead.window import JacobiWindow


@compiled
def step_drafts(
    text: TextIndex,
    pool: NGramPool,
    window: JacobiWindow,
    memory: DraftMemory,
    length: int,
    count: int,
    context: bool,
    frequent: bool,
    guesses: int,
    remembered: int,
    remembered_len: int,
) -> Chains:
    """The step's drafts below x0 (the text's last token), best first by kind: `count` text drafts
    of at most `length` tokens (sources from 0); with `context`, the pool's tails under the token
    before x0 that go on with x0 (two matched tokens predict better than one; sources after the
    text's TEXT_RANKS); the pool's tails under x0, newest first or with `frequent` most often
    produced first; with a `lone` text index, `count` drafts of x0's lone matches; `remembered`
    drafts of the memory (at most `remembered_len` tokens); then the window's first `guesses`
    row-0 guesses (WINDOW_SOURCE)."""
    tail = pool.rows.shape[2] - 1
    count, remembered = max(count, 0), max(remembered, 0)
    row = window.rows[0, 1 : 1 + guesses]
    chains = new_chains(
        2 * count + 2 * pool.capacity + remembered + 1,
        2 * count * max(length, 0) + 2 * pool.capacity * tail + remembered * max(remembered_len, 0) + len(row),
    )
    suffix_drafts(text, length, count, chains, 0, TEXT_RANKS)
    n = text.n
    if n:
        x0 = text.seq[n - 1]
        if context and n > 1:
            tail_drafts(pool, text.seq[n - 2], False, x0, chains, TEXT_RANKS, POOL_RANKS)
        tail_drafts(pool, x0, frequent, -1, chains, TEXT_RANKS + POOL_RANKS, POOL_RANKS)
    lone_drafts(text, length, count, chains, TEXT_RANKS + 2 * POOL_RANKS, LONE_RANKS)
    memory_drafts(memory, text, remembered_len, remembered, chains, MEMORY_SOURCE)
    if len(row):
        add(chains, row, 0, len(row), WINDOW_SOURCE)
    return chains


__all__ = ["step_drafts"]

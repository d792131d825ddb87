"""A plain reference of a step's host work after its message is read, for randomized equality
tests of the compiled plan and observe (lp/decode/plan.py, lp/decode/policy.py): the merge, the
cut at max_new_tokens and EOS, and each source fed by its own Python method, in the order the
compiled observe keeps."""

from __future__ import annotations

import numpy as np

from lp.decode.policy import DraftSources
from lp.message import merge
from lp.partition import RankPlan


def window_ngrams(rows: np.ndarray, x0: int, level: np.ndarray) -> np.ndarray:
    """The W n-grams `[W, N]` that a window's trajectory closes with its new `level`: column j's
    x0 (j = 0) or row-0 guess, its levels above, then `level[j]` (lp/lookahead/window.py)."""
    grams = np.concatenate([rows, level[None, :]], axis=0).T.copy()
    grams[0, 0] = x0
    return grams


def observe(
    sources: DraftSources, gathered: np.ndarray, plans: tuple[RankPlan, ...], remaining: int, eos: set[int]
) -> tuple[list[int], bool]:
    """`DraftSources.observe`, one source at a time (after `prepare`)."""
    cfg = sources.cfg
    outcome = merge(gathered, plans, cfg.max_commit, cfg.successors_sent)
    tokens, stopped = outcome.tokens[:remaining], False
    ends = [i for i, t in enumerate(tokens) if t in eos]
    if ends:
        tokens, stopped = tokens[: ends[0] + 1], True
    grown, sources._grown = sources._grown, None
    if grown is not None:
        sources.rates.observe(grown, outcome.tokens[: outcome.accepted])
    text, pool, window, table = sources.text, sources.pool, sources.window, sources.successors
    if table is not None:
        table.observe([*text.tokens[-2:].tolist(), *tokens])
        first, keys = sources._keys
        table.update(outcome.successors, keys, first)
    pooled = sources.G > 0 and pool.capacity > 0  # the step shape's G (none in `mode=ar`)
    if window is not None:
        if pooled and window.ready:
            pool.add_rows(window_ngrams(window.rows, int(text.tokens[-1]), outcome.new))
        window.update(outcome.new)
    text.extend(tokens)
    if pooled and cfg.pool_from_output:
        pool.add_sequence(text.tokens[-(len(tokens) + sources.N - 1) :])
    return tokens, stopped

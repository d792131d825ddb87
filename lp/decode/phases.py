"""The two phases of a step's host work, compiled, on one sequence's drafting state (`DraftState`).

The state holds the draft sources (lp/lookahead/): the text index, the n-gram pool, the successor
table of recycled top-k tokens, the sources' counted rates, the Jacobi window and the draft memory
of earlier decodes (shared by every sequence, read here, fed by the batch); and the step in
flight: its tree and its successor rows' pair keys. It is identical on every rank.

* `before_read`, while the device computes the step's forward: what the step's outcome does not
  decide. The last step's successor rows are written into the table and the pool's queued
  n-grams inserted (both wait until then: scattered writes the next plan did not need); every
  source makes room for what the step may bring; this step's successor rows get their pair keys.
  On a GPU it also rehearses the plan, so that the call after the read finds its code and arrays
  in the host's caches.
* After the read, what the device waits for, in order:
  1. `after_read`: merge the ranks' messages (lp/message.py): the winning path, the window's new
     level, the step's successor rows; commit the path's tokens, cut at `remaining` and after an
     EOS; feed the outcome to the sources (`observe`): the tree's nodes counted against the
     accepted path (rates); each new token's rank in its predecessor's successor row counted,
     then the step's rows staged; the window's n-grams queued for the pool; the tokens added to
     the text and the n-grams ending in them queued; the window moved up a level;
  2. `grow_next`: grow the next step's tree best first over every source (lp/lookahead/grow.py),
     its nodes' chances handed to the step's budget (lp/decode/budget.py), which says how many
     of them the step verifies;
  3. `plan`: those nodes, split over the ranks, this rank's share laid out (lp/decode/plan.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.experimental import structref

from lp.decode.plan import PLANNED, Split, lay_out_step
from lp.decode.shares import fitted
from lp.errors import LPError
from lp.jit import State, compiled
from lp.lookahead import pool as pools
from lp.lookahead import successors as tables
from lp.lookahead import text as texts
from lp.lookahead.chains import Chains
from lp.lookahead.drafts import step_drafts
from lp.lookahead.grow import grow
from lp.lookahead.memory import DraftMemory
from lp.lookahead.pool import NGramPool
from lp.lookahead.rates import DraftRates, count
from lp.lookahead.successors import SuccessorTable, count_ranks
from lp.lookahead.text import TextIndex
from lp.lookahead.window import JacobiWindow, ready, update
from lp.message import HEADER, merge_messages


class DraftShape(NamedTuple):
    """A decode's constants for the drafter's compiled calls (from its DecodeConfig and world)."""

    split: Split  # the step's window and ranks
    k: int  # successors per logits row sent for the successor table (0: no table)
    depth: int  # the longest draft: the rates' depths
    draft_len: int  # the longest text draft
    text_drafts: int  # text drafts a step (0: none)
    remembered: int  # the draft memory's drafts a step (0: none)
    context: bool  # the pool's tails under the token before x0 that go on with x0 first
    frequent: bool  # the pool's tails most often produced first, not newest
    continuation_len: int  # the text's continuations below tree nodes (0: none)
    max_commit: int  # the most tokens a step commits
    keep: bool  # the accepted drafts' KV is kept: each step feeds x0 alone
    pooled: bool  # the window's n-grams go to the pool
    from_text: bool  # the committed text's n-grams go to the pool
    shared: bool  # the drafts share their prefixes in one grown tree (else one chain each)


@structref.register
class DraftStateType(State):
    pass


class DraftState(structref.StructRefProxy):
    """One sequence's draft sources (the memory: shared), the constants of its decode (`shape`; `budgets[p - 1]`: the
    tree nodes of a step that feeds p tokens, DecodeConfig.tree_budget), the tree grown for the
    next step before the step's budget cuts it (`grown`: tokens, parents, labels, growth places,
    root subtree sizes), and the step in flight: its tree's nodes (tokens, parents, labels) and its
    successor rows' pair keys (`keys`, the nodes' from the last; `first_key`, x0's), made
    `prepared` by `before_read`."""


structref.define_proxy(
    DraftState,
    DraftStateType,
    [
        "text",
        "pool",
        "table",
        "rates",
        "window",
        "memory",
        "shape",
        "budgets",
        "grown",
        "tokens",
        "parents",
        "labels",
        "keys",
        "first_key",
        "prepared",
    ],
)


@compiled
def new_state(
    text: TextIndex,
    pool: NGramPool,
    table: SuccessorTable,
    rates: DraftRates,
    window: JacobiWindow,
    memory: DraftMemory,
    shape: DraftShape,
    budgets: np.ndarray,
) -> DraftState:
    """A sequence's drafting state: its sources, and no step yet."""
    none = np.zeros(0, np.int64)
    grown = (none, none, none, none, none)
    return DraftState(
        text, pool, table, rates, window, memory, shape, budgets, grown, none, none, none, none, -1, False
    )


@compiled
def grow_tree(
    d: DraftState, pending: int, most: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tree of a step that feeds `pending` tokens, at most `most` nodes: its drafts
    (lp/lookahead/drafts.py; the window's row-0 guesses once its levels come from Jacobi steps)
    and the successor table's rows grown best first (tokens, parents, labels, each node's place in
    the growth, root subtrees' sizes, the chances in growth order). Growth is best first, so a
    smaller tree is the first nodes of a larger one."""
    if not 1 <= pending <= len(d.budgets):
        raise LPError("a step feeds 1 to max_commit pending tokens, not " + str(pending))
    s, budget = d.shape, min(d.budgets[pending - 1], most)
    if not budget:
        none = np.zeros(0, np.int64)
        return none, none, none, none, none, np.zeros(0, np.float64)
    guesses = s.depth if s.split.W > 1 and ready(d.window, 0) else 0
    chains = _drafts(d, guesses)
    return grow(d.text, chains, d.rates.chances, d.table, budget, s.depth, s.continuation_len)


@compiled
def _planned(
    d: DraftState,
    pending: np.ndarray,
    tokens: np.ndarray,
    parents: np.ndarray,
    labels: np.ndarray,
    growth: np.ndarray,
    groups: np.ndarray,
    windowed: bool,
) -> PLANNED:
    """The step of this tree, cut to its ranks' shares: kept as the current step's (its outcome
    counts its nodes), planned (without `windowed`: the pending tokens alone)."""
    tokens, parents, labels, groups = fitted(d.shape.split, len(pending), tokens, parents, labels, growth, groups)
    d.tokens, d.parents, d.labels = tokens, parents, labels
    return lay_out_step(d.shape.split, pending, d.window.rows, tokens, parents, groups, windowed)


@compiled
def grow_next(d: DraftState, pending: int, most: int) -> np.ndarray:
    """Grow the tree of the next step, which feeds `pending` tokens, to at most `most` nodes (0:
    the budget gives it none, and none is grown), and keep it (`grown`) until the step's budget
    says how much of it the step verifies (`plan`): its chances in growth order."""
    if most <= 0:
        none = np.zeros(0, np.int64)
        d.grown = (none, none, none, none, none)
        return np.zeros(0, np.float64)
    tokens, parents, labels, growth, groups, chances = grow_tree(d, pending, most)
    d.grown = (tokens, parents, labels, growth, groups)
    return chances


@compiled
def plan(d: DraftState, pending: np.ndarray, k: int, windowed: bool) -> PLANNED:
    """The next step's plan: the first `k` nodes its tree's growth took (`grow_next`), split and
    laid out; without `windowed` (k is 0), the pending tokens alone: the window waits."""
    tokens, parents, labels, growth, groups = first_grown(*d.grown, k)
    return _planned(d, pending, tokens, parents, labels, growth, groups, windowed)


@compiled
def first_grown(
    tokens: np.ndarray, parents: np.ndarray, labels: np.ndarray, growth: np.ndarray, groups: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A tree's first `k` nodes in growth order (a node grows after its parent, so they are a
    tree), in the same subtree order: tokens, parents, labels, growth places, root subtrees' sizes."""
    n = len(tokens)
    if k >= n:
        return tokens, parents, labels, growth, groups
    where = np.full(n, -1, np.int64)
    m = 0
    for v in range(n):
        if growth[v] < k:
            where[v] = m
            m += 1
    out_t, out_p, out_l, out_g = (
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
        np.empty(m, np.int64),
    )
    sizes = np.zeros(len(groups), np.int64)
    v = 0
    for r in range(len(groups)):
        for _ in range(groups[r]):
            j = where[v]
            if j >= 0:
                out_t[j], out_l[j], out_g[j] = tokens[v], labels[v], growth[v]
                out_p[j] = where[parents[v]] if parents[v] >= 0 else -1
                sizes[r] += 1
            v += 1
    return out_t, out_p, out_l, out_g, sizes[sizes > 0]


@compiled
def plan_given(
    d: DraftState, pending: np.ndarray, tokens: np.ndarray, parents: np.ndarray, groups: np.ndarray
) -> PLANNED:
    """The plan of a step of a given tree (no node labelled: no rates counted; its nodes in their
    order, as if grown so)."""
    labels, growth = np.full(len(tokens), -1, np.int64), np.arange(len(tokens))
    return _planned(d, pending, tokens, parents, labels, growth, groups, True)


@compiled
def before_read(d: DraftState, rehearse: bool) -> None:
    """The last step's successor rows written, the pool's queued n-grams inserted, room made in the
    text, the pool and the table for what this step may bring, and the pair keys of this step's
    successor rows (x0's, then the tree's nodes' from the last to the first; each node's
    predecessor its parent, x0 for a root). With `rehearse`, a step is planned and dropped."""
    s = d.shape
    W = s.split.W
    if s.k:
        tables.apply(d.table)
    pools.flush(d.pool)
    texts.reserve(d.text, s.max_commit)
    if s.pooled:  # the window's n-grams and those ending in the committed tokens
        pools.reserve(d.pool, W + s.max_commit)
    if s.k:
        seq, n, m = d.text.seq, d.text.n, len(d.tokens)
        d.first_key = tables.pair_key(seq[n - 2], seq[n - 1]) if n > 1 else -1
        keys = np.empty(m, np.int64)
        for j in range(m):
            v = m - 1 - j
            before = d.tokens[d.parents[v]] if d.parents[v] >= 0 else seq[n - 1]
            keys[j] = tables.pair_key(before, d.tokens[v])
        d.keys = keys
        tables.reserve(d.table, 1 + W + m)
    d.prepared = True
    if rehearse and s.shared:
        tokens, parents, labels, growth, groups, _ = grow_tree(d, 1, d.budgets[0])
        tokens, parents, _, groups = fitted(s.split, 1, tokens, parents, labels, growth, groups)
        lay_out_step(s.split, d.text.seq[d.text.n - 1 : d.text.n], d.window.rows, tokens, parents, groups)


@compiled
def after_read(
    d: DraftState, gathered: np.ndarray, bounds: np.ndarray, order: np.ndarray, remaining: int, eos: np.ndarray
) -> tuple[np.ndarray, bool]:
    """The step's messages merged and fed to the sources: the committed tokens and whether an EOS
    ended them. `bounds` and `order`: the step's shares (`StepPlan`)."""
    s = d.shape
    if not d.prepared:
        raise LPError("the drafter's after_read needs a before_read after each step's plan")
    d.prepared = False
    best, level, rows = merge_messages(gathered, bounds, HEADER + s.max_commit, s.k, order, s.split.W)
    accepted = gathered[best, 2] if best >= 0 else 0
    if accepted >= s.max_commit:
        raise LPError("a message accepts more than the step's " + str(s.max_commit - 1) + " draft tokens")
    path = gathered[best, HEADER : HEADER + accepted + 1] if best >= 0 else gathered[0, :1]
    cut, stopped = min(len(path), remaining), False
    for i in range(cut):
        for token in eos:
            stopped = stopped or path[i] == token
        if stopped:
            cut = i + 1
            break
    new = path[:cut]
    observe(d, path[:accepted], new, level, rows)
    return new, stopped


@compiled
def observe(d: DraftState, accepted: np.ndarray, new: np.ndarray, level: np.ndarray, rows: np.ndarray) -> None:
    """A step's outcome fed to the sources: its `accepted` draft tokens, its committed tokens
    `new`, the window's new `level` (empty where the step fed no window: the window waits) and the
    step's successor `rows` (lp/message.py's order)."""
    s = d.shape
    W, N = s.split.W, s.split.N
    windowed = W > 0 and len(level) == W
    count(d.rates, d.tokens, d.parents, d.labels, accepted)
    seq, n = d.text.seq, d.text.n
    if s.k and len(rows):  # on the table the drafts used, before the step's rows are staged (a step
        # of plain batched decoding sent none: it neither teaches the table nor scores it)
        tail = np.concatenate((seq[max(n - 2, 0) : n], new))
        count_ranks(d.table, tail)
        tables.stage(d.table, rows, d.keys, d.first_key)
    if (
        s.pooled and windowed and ready(d.window, 0)
    ):  # column j's n-gram: x0 or its row-0 guess, its levels, its new token
        grams, window = np.empty(W * N, np.int64), d.window.rows
        for j in range(W):
            grams[j * N] = seq[n - 1] if j == 0 else window[0, j]
            for lvl in range(1, N - 1):
                grams[j * N + lvl] = window[lvl, j]
            grams[j * N + N - 1] = level[j]
        pools.enqueue(d.pool, grams, N, W)
    texts.extend(d.text, new)
    if s.from_text:  # the n-grams that end in the committed tokens
        start = max(n - N + 1, 0)
        pools.enqueue(d.pool, d.text.seq[start:], 1, n + len(new) - N + 1 - start)
    if windowed:
        update(d.window, level)


@compiled
def _drafts(d: DraftState, guesses: int) -> Chains:
    """The step's drafts as chains (lp/lookahead/drafts.py), the window's first `guesses` guesses last."""
    s = d.shape
    return step_drafts(
        d.text,
        d.pool,
        d.window,
        d.memory,
        s.draft_len,
        s.text_drafts,
        s.context,
        s.frequent,
        guesses,
        s.remembered,
        s.depth,
    )


@compiled
def step_chains(d: DraftState) -> Chains:
    """The step's drafts as chains, without the window's row (one chain per draft: `tree=False`)."""
    return _drafts(d, 0)


__all__ = [
    "DraftShape",
    "DraftState",
    "after_read",
    "before_read",
    "first_grown",
    "grow_next",
    "new_state",
    "plan",
    "plan_given",
]

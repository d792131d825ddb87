"""A step's plan: its tree grown from the draft sources (lp/decode/policy.py), split over the P
ranks (lp.partition) and this rank's share laid out as one forward (lp.lookahead.mask), with
its input ids. Pure host work, the same on every rank.

Most of a decode's steps plan right after a message read, while the device waits: there the
step's merge and the sources' update (lp/decode/policy.py `observe_body`), then the next step's
drafts, growth, partition, layout and ids (`plan_body`) are one compiled call (`observe_next`),
each the loop of its own module, since a call and its Python glue cost microseconds each, on
an instruction cache that the step's other work has just evicted (its cache key: lp/compiled.py).
A decode's first step, and the steps of sources that grow no tree in that call, plan in a call
of their own (`plan_next`, `plan_step`). What the next forward does not need, the sources'
Python-side counts, the grown tree's arrays and the state's advance, follows that forward's
queueing (lp/decode/loop.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from lp import message
from lp import partition as partition_loops
from lp.compiled import sources_digest
from lp.config import DecodeConfig
from lp.decode import policy
from lp.decode.policy import DraftSources, observe_body
from lp.lookahead import JacobiWindow, draft_loops, loops, mask
from lp.lookahead.draft_loops import step_chains
from lp.lookahead.grow import Labelled
from lp.lookahead.loops import grow_tree
from lp.lookahead.mask import StepLayout, gather_ids, lay_out, layout_of
from lp.lookahead.tree import DraftTree
from lp.message import merge, message_size
from lp.partition import RankPlan, partition, plans_of, search


class StepPlan:
    """One rank's share of a step, all host-side: its input ids (in `layout`'s order) and layout,
    the step's whole tree (this rank's nodes: `plan.candidates`) and every rank's share as a row
    of `bounds` (`plans`). Made after every message read (the first before any), before the
    forward is queued: its tree (given, or made from a grown one's arrays, once) and its plans
    are made when read, and the grown arrays the sources count (`grown`) at
    `DraftSources.settle`, after the forward is queued, where making them delays no forward."""

    __slots__ = ("_buffer", "_tree", "bounds", "ids", "layout", "rank")

    def __init__(
        self,
        ids: np.ndarray,
        layout: StepLayout,
        rank: int,
        tree: DraftTree | tuple[np.ndarray, tuple[int, ...]],
        bounds: np.ndarray,
    ) -> None:
        """`tree`: the step's tree, or the compiled plan's buffer and its parts' ends (`packed`),
        from which it is grown."""
        self.ids, self.layout, self.rank = ids, layout, rank
        self._tree, self._buffer = (tree, None) if isinstance(tree, DraftTree) else (None, tree)
        self.bounds = bounds  # each rank's share: (first column, column stop, first candidate, candidate stop)

    @property
    def tree(self) -> DraftTree:
        """The step's whole tree."""
        if self._tree is None:
            tokens, parents, _, groups = _cut(*self._buffer)[1:5]
            self._tree = DraftTree(tokens, parents, groups)
        return self._tree

    def grown(self) -> Labelled:
        """The grown tree's arrays, as its outcome is counted (`DraftSources.grew`)."""
        if self._buffer is None:
            raise ValueError("a given tree was not grown: it has no labels")
        return Labelled(*_cut(*self._buffer)[1:4])

    @property
    def plans(self) -> tuple[RankPlan, ...]:
        """Every rank's plan."""
        return plans_of(self.bounds)

    @property
    def plan(self) -> RankPlan:
        """This rank's plan."""
        return plans_of(self.bounds[self.rank : self.rank + 1])[0]


def largest_step(cfg: DecodeConfig) -> int:
    """The most tokens a step of `cfg` feeds one rank at any world size: `max_commit` pending
    tokens (re-fed over P ranks; one replica feeds x0 alone), every window column and the whole
    tree, or `step_limit` where it is less."""
    W, N, _, budget = cfg.step_shape
    most = RankPlan(range(W), range(budget)).cost(N, pending=cfg.max_commit, candidate_tokens=1)
    return most if cfg.step_limit is None else min(most, cfg.step_limit)


def rank_share(
    m: int, tree: DraftTree, *, W: int, N: int, P: int, rank: int
) -> tuple[tuple[RankPlan, ...], StepLayout]:
    """A step with `m` pending tokens split over P ranks: every rank's plan, then rank `rank`'s
    layout (what tools.project replays for each rank)."""
    step = plan_step(np.zeros(m, dtype=np.int64), None, tree, W=W, N=N, P=P, rank=rank)
    return step.plans, step.layout


def plan_step(
    pending: list[int] | np.ndarray, window: JacobiWindow | None, tree: DraftTree, *, W: int, N: int, P: int, rank: int
) -> StepPlan:
    """Split the step of `tree` over P ranks and lay out rank `rank`'s forward: the pending
    tokens (x0 last), its window columns with their row-0 prefix, then its verification
    subtrees."""
    groups = np.asarray(tree.groups(), dtype=np.int64) if P > 1 else _NONE
    arrays = (np.ascontiguousarray(tree.tokens, dtype=np.int64), tree.parent_array, groups)
    return _plan(pending, window, W, N, P, rank, _GIVEN, arrays, tree)


def plan_next(pending: list[int], sources: DraftSources, *, W: int, N: int, P: int, rank: int) -> StepPlan:
    """The next step's plan (`plan_step`) with its tree from `sources`: grown in the same compiled
    call where the sources grow one (`DraftSources.growth`), else built by them."""
    growth = sources.growth(len(pending))
    if growth is None:
        return plan_step(pending, sources.window, sources.tree(len(pending)), W=W, N=N, P=P, rank=rank)
    step = _plan(pending, sources.window, W, N, P, rank, growth, _NO_TREE)
    sources.grew(step.grown())
    return step


def _plan(
    pending: list[int] | np.ndarray,
    window: JacobiWindow | None,
    W: int,
    N: int,
    P: int,
    rank: int,
    growth: tuple,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
    given: DraftTree | None = None,
) -> StepPlan:
    """`_plan_loop` on `growth` (or `_GIVEN`, and the `given` tree's `arrays`: tokens, parents,
    groups) and its answer as a StepPlan."""
    fed = np.asarray(pending, dtype=np.int64)
    if len(fed) < 1 or N < 2 or not 0 <= rank < P:
        raise ValueError(f"bad step shape m={len(fed)} N={N} P={P} rank={rank}")
    rows = window.rows if window is not None else np.zeros((N - 1, W), dtype=np.int64)  # ids read its shape
    if rows.shape != (N - 1, W):
        raise ValueError(f"the window's rows are {rows.shape}, not (N - 1, W) = {(N - 1, W)}")
    return _step_of(_plan_loop(*growth, rows, *arrays, fed, W, N, P, rank), len(fed), W, N, P, rank, given)


def _step_of(planned: tuple, m: int, W: int, N: int, P: int, rank: int, given: DraftTree | None = None) -> StepPlan:
    """`packed`'s answer `planned` (of `plan_body`'s) for a step of `m` pending tokens as a
    StepPlan: its tree `given`, or made from the grown arrays when read. Only what the step's
    forward needs is cut from the buffer here, after a message read."""
    bad, ends, out, mask = planned
    bounds = out[ends[4] : ends[5]]
    if not len(bounds):
        groups = out[ends[3] : ends[4]]
        raise ValueError(
            f"bad partition request W={W} N={N} G={ends[1] - ends[0]} P={P} groups={tuple(groups.tolist())}"
        )
    bounds = bounds.reshape(-1, 4)
    a, b, c, d = bounds[rank].tolist()
    _, e1, e2, _, _, e5, e6, e7, e8, e9, e10 = ends
    parents, mine, gather, depth, rows = out[e1:e2], out[e5:e6], out[e6:e7], out[e7:e8], out[e8:e9]
    layout_ = layout_of(m, W, N, range(a, b), parents, range(c, d), bad, mine, gather, depth, mask, rows)
    return StepPlan(out[e9:e10], layout_, rank, (out, ends) if given is None else given, bounds)


def next_pending(committed: list[int], keep: bool) -> list[int]:
    """The tokens the step after one that committed `committed` feeds before its window and tree
    (x0 last): all of them, or with `keep` (their drafts' KV kept) only the last."""
    return committed[-1:] if keep else committed


def _cut(out: np.ndarray, ends: tuple[int, ...]) -> list[np.ndarray]:
    """`out` cut at `ends` (each part's end) into views."""
    parts, at = [], 0
    for end in ends:
        parts.append(out[at:end])
        at = end
    return parts


def observe_next(
    gathered: np.ndarray,
    bounds: np.ndarray,
    remaining: int,
    eos: np.ndarray,
    sources: DraftSources,
    *,
    W: int,
    N: int,
    P: int,
    rank: int,
) -> tuple[list[int], bool, StepPlan | None]:
    """A step's outcome fed to `sources` (`DraftSources.observe`, after `prepare`: the committed
    tokens and whether an EOS ended them) and the next step's plan (`plan_next`; None where the
    decode ends: at an EOS or `remaining` tokens), in one compiled call where the sources grow
    the tree in it (`DraftSources.next_growth`), else in two. After a one call that plans the
    next step, the sources' own counts and the grown tree's arrays (`grew_later`) wait for
    `DraftSources.settle` (lp/decode/loop.py: once that step's forward is queued); one that ends
    the decode settles them."""
    growth = sources.next_growth
    if growth is None:
        tokens, stopped = sources.observe(gathered, bounds, remaining, eos)
        if stopped or len(tokens) >= remaining:
            return tokens, stopped, None
        return tokens, stopped, plan_next(next_pending(tokens, sources.keep), sources, W=W, N=N, P=P, rank=rank)
    best, stopped, ids, rows, planned, plan = _observe_plan_loop(
        W, N, P, rank, gathered, bounds, remaining, eos, *sources.take(), *growth, False
    )
    _, ends, out, _ = plan
    tokens = sources.observed(gathered, best, out[: ends[0]], ids, rows, now=False)
    if not planned:
        sources.settle()
        return tokens, stopped, None
    step = _step_of(plan, len(next_pending(tokens, sources.keep)), W, N, P, rank)
    sources.grew_later(step.grown)
    return tokens, stopped, step


def rehearse(
    gathered: np.ndarray, eos: np.ndarray, sources: DraftSources, *, W: int, N: int, P: int, rank: int
) -> None:
    """Rehearse the next `observe_next` while the device computes: its compiled call, in the same
    machine code, plans the step after the sources' current state (after `prepare`, whose flush
    leaves the pool's queue empty, so the drafts' landing of a key's queued n-grams writes
    nothing; of `gathered`, a step's messages, it reads one token, as that step's pending one)
    and drops the plan, changing nothing (the text's index of earlier occurrences, `Follow`, it
    brings up to date as the plan after the read would). The step's other work (the forward's dispatch, the
    acceptance, the message) has evicted that code and the sources' arrays from the host's
    caches by the time the messages are read; rehearsed, the call after the read finds them
    there and runs faster (in tools.host's replay of a GPU's host on this project's CPU:
    results/host/ab_staged.txt; not yet measured on a GPU machine's host). It costs a plan's
    worth of host time that an asynchronous device (a GPU) overlaps and a CPU's forward does not
    (lp/decode/loop.py: `Decoder(rehearse=)`). Only where the next step is planned in that one
    call (`DraftSources.next_growth`)."""
    growth = sources.next_growth
    if growth is not None:
        _observe_plan_loop(W, N, P, rank, gathered, _NO_BOUNDS, 1, eos, *sources.arguments(), *growth, True)


@njit
def plan_body(
    grow, budget, depth, seq, n, grams, head, longest, lone, length, count,
    ptable, prows, prings, pstate, pqueue, context, frequent, ranks, row_len, row_source,
    chances, hits, table, pairs, index, staged, stage, latest, earlier, follow,
    window, tokens, parents, groups, pending, W, N, P, rank,
):  # fmt: skip
    """A step's plan: with `grow`, its tree of at most `budget` nodes grown from the drafts
    (`step_chains` over the text's, the pool's and the window's row 0, guesses 1..`row_len`)
    and the successor rows (`grow_tree`), below x0 = `seq[n - 1]` (the token before it:
    `seq[n - 2]`); else the given `tokens`, `parents` and root `groups`. Then the ranks'
    shares (`search`; one rank: the whole step), rank `rank`'s layout (`lay_out`) and its
    ids (`gather_ids`). The tree's arrays (labels: grown only), the shares (none
    where the groups cannot be split), the layout's arrays and the ids. Not cached itself: the
    cached calls that run it are keyed by its sources (lp/compiled.py)."""
    labels = np.empty(0, np.int64)
    if grow:
        row = window[0, 1 : 1 + row_len]
        flat, starts, sources = step_chains(
            seq, n, grams, head, longest, lone, length, count,
            ptable, prows, prings, pstate, pqueue, context, frequent, ranks, row, row_source,
        )  # fmt: skip
        before = seq[n - 2] if n > 1 else -1
        tokens, parents, labels, _, groups = grow_tree(
            budget, seq[n - 1], before, depth, flat, starts, sources, chances, hits, table, pairs, index, staged, stage,
            seq, n, latest, earlier, follow, row_source + 1,  # the continuations' rates follow the window's
        )  # fmt: skip
    size = len(tokens)
    if P == 1:
        bounds = np.empty((1, 4), np.int64)
        bounds[0, 0], bounds[0, 1], bounds[0, 2], bounds[0, 3] = 0, W, 0, size
    else:
        bounds = search(W, N, groups, P, 1, size)
        if not len(bounds):
            none = np.zeros((0, 0), np.bool_)
            return tokens, parents, labels, groups, bounds, -1, parents, pending, pending, none, pending, pending
    a, b, c, d = bounds[rank, 0], bounds[rank, 1], bounds[rank, 2], bounds[rank, 3]
    bad, mine, gather, depth_of, mask_of, rows = lay_out(len(pending), W, N, a, b, b - 1 if b > a else 0, parents, c, d)
    ids = gather_ids(gather, pending, window, tokens, c) if bad < 0 else pending
    return tokens, parents, labels, groups, bounds, bad, mine, gather, depth_of, mask_of, rows, ids


@njit
def packed(new, planned):
    """`new` (the observe's committed tokens) and `plan_body`'s answer `planned` for Python: the
    shares' test (`bad`), the ends of its int64 arrays (`new` first, the shares flat) in one
    buffer, the buffer, the layout's mask: two arrays boxed for Python, not twelve, and views
    of the buffer cost Python less (1.4 us less a plan at W15 N5 G15). Not cached itself, as
    `plan_body`."""
    tokens, parents, labels, groups, bounds, bad, mine, gather, depth, mask, rows, ids = planned
    flat = bounds.reshape(-1)
    out = np.empty(
        len(new) + len(tokens) + len(parents) + len(labels) + len(groups) + len(flat) + len(mine) + len(gather)
        + len(depth) + len(rows) + len(ids),
        np.int64,
    )  # fmt: skip
    e0 = _put(out, 0, new)
    e1 = _put(out, e0, tokens)
    e2 = _put(out, e1, parents)
    e3 = _put(out, e2, labels)
    e4 = _put(out, e3, groups)
    e5 = _put(out, e4, flat)
    e6 = _put(out, e5, mine)
    e7 = _put(out, e6, gather)
    e8 = _put(out, e7, depth)
    e9 = _put(out, e8, rows)
    e10 = _put(out, e9, ids)
    return bad, (e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10), out, mask


@njit
def _put(out, at, a):
    """`a` copied into `out` from `at`: the end."""
    for i in range(len(a)):
        out[at + i] = a[i]
    return at + len(a)


def _compile(digest: str):
    """`_plan_loop` and `_observe_plan_loop`, keyed in numba's cache by `digest` too
    (lp/compiled.py)."""

    @njit(cache=True)
    def plan_loop(*args):
        """`plan_body` on its arguments, `packed`."""
        if len(digest) == 0:  # never: the digest is read for numba's cache key (lp/compiled.py)
            raise ValueError("no digest of the loops' sources")
        return packed(np.empty(0, np.int64), plan_body(*args))

    @njit(cache=True)
    def observe_plan_loop(
        W, N, P, rank, gathered, bounds, remaining, eos, start, k, tree, parents, labels, rate_hits, offered,
        chances, table, pairs, index, stage, hits, keys, first, seq, grams, head, text_table, n, made, longest,
        lone, state, queue, window, from_window, from_text, budget, depth, length, count, ptable, prows, prings,
        context, frequent, ranks, row_len, row_source, latest, earlier, follow, keep, rehearsal,
    ):  # fmt: skip
        """`observe_body` (lp/decode/policy.py) on its arguments (the messages to `from_text`),
        then, unless the step ended the decode, `plan_body` for rank `rank` of P on the next
        step's growth (`DraftSources.next_growth`: from `budget` to `row_source`, the rest of
        `plan_body`'s arguments the observe's: the text's and the successor table's arrays, the
        pool's state and queue, the `chances` as rows of `depth`), the committed tokens pending
        (`keep`: the last alone, `next_pending`): the observe's answer but its committed tokens,
        whether it planned, those tokens and the plan `packed`. (One array passed once: each
        argument costs the call's dispatch a tenth of a microsecond.) A `rehearsal` observes
        nothing and changes nothing (but indexes the text's occurrences early, `Follow`): it
        plans the step after the sources' current state, its pending token `gathered[0, 0]` (the
        ids' alone), through the same `plan_body` call, and its answer is dropped (`rehearse`)."""
        if len(digest) == 0:  # never: the digest is read for numba's cache key (lp/compiled.py)
            raise ValueError("no digest of the loops' sources")
        e = np.empty(0, np.int64)  # not a global's: numba types those read-only, and so the arrays they meet
        if rehearsal:  # the values the observe gives, of the same types, for the text as it stands
            best, stopped, new, rows = -1, False, gathered[0, :0], np.zeros((0, k + 1), np.int64)
            fed = gathered[0, :1]
        else:
            best, new, stopped, made, rows = observe_body(
                gathered, bounds, remaining, eos, start, k, tree, parents, labels, rate_hits, offered, chances,
                table, pairs, index, stage, hits, keys, first, seq, grams, head, text_table, n, made, longest, lone,
                state, queue, window, from_window, from_text,
            )  # fmt: skip
            if best < -1 or stopped or len(new) >= remaining:
                none = (e, e, e, e, np.empty((0, 4), np.int64), -1, e, e, e, np.zeros((0, 0), np.bool_), e, e)
                return best, stopped, made, rows, False, packed(new, none)
            fed = new[len(new) - 1 :] if keep else new
        rates = chances.reshape((len(chances) // depth, depth))  # `DraftRates.chances`, flat in the observe
        plan = plan_body(
            True, budget, depth, seq, n + len(new), grams, head, longest, lone, length, count, ptable, prows, prings,
            state, queue, context, frequent, ranks, row_len, row_source, rates, hits, table, pairs, index, rows, stage,
            latest, earlier, follow, window, e, e, e, fed, W, N, P, rank,
        )  # fmt: skip
        return best, stopped, made, rows, True, packed(new, plan)

    return plan_loop, observe_plan_loop


# a plan of a given tree: no growth (the growth's arguments of no sources)
_NONE, _NO_ROWS = np.zeros(0, dtype=np.int64), np.zeros((1, 1), dtype=np.int32)
_plan_loop, _observe_plan_loop = _compile(sources_digest(draft_loops, loops, mask, partition_loops, message, policy))

_GIVEN = (
    False, 0, 1, _NONE, 0, np.zeros((0, 1, 2), np.int64), _NONE, 0, False, 0, 0, np.zeros((0, 2), np.int64),
    np.zeros((0, 1, 2), np.int64), np.zeros((0, 3), np.int64), _NONE, np.zeros((2, 0), np.int64), False, False,
    _NONE, 0, 0, np.zeros((0, 1)), np.ones(1, np.int64), _NO_ROWS, _NO_ROWS, np.full((1, 2), -1, np.int64),
    np.zeros((0, 1), np.int64), np.full((1, 2), -1, np.int64), np.full(1, -1, np.int64), _NONE, 0,
)  # fmt: skip
_NO_TREE = (_NONE, _NONE, _NONE)  # grown: no given tree
_NO_BOUNDS = np.zeros((0, 4), np.int64)  # a rehearsal's (`rehearse`): it merges no messages


def compile_kernels() -> None:
    """Compile the step's numba kernels (the plan of a given tree, the partitioner's search, the
    merge), or load them from numba's cache, on a two-rank step of a two-node tree: before a
    decode's clock starts rather than in its first step (seconds on a fresh install, a fraction
    of a second from the cache, once per process). The plan of a grown tree, and the observe
    with the next step's plan: lp/decode/policy.py's."""
    tree = DraftTree(np.zeros(2, dtype=np.int64), (-1, 0))
    plans, _ = rank_share(1, tree, W=1, N=2, P=2, rank=0)
    partition(1, 2, 2, 2, (1, 1), 1)
    merge(np.zeros((2, message_size(1, 3, 4, 1)), dtype=np.int64), plans, 3, 1)

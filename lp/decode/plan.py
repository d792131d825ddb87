"""The partition glue: a step's tree and window split over the P ranks (lp.partition), and this
rank's share laid out as one forward (lp.lookahead.mask). Pure host work, the same on every rank."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lp.config import DecodeConfig
from lp.lookahead import JacobiWindow
from lp.lookahead.mask import StepLayout, gather_ids, share_layout
from lp.lookahead.tree import DraftTree
from lp.message import merge, message_size
from lp.partition import RankPlan, partition


@dataclass(frozen=True)
class StepPlan:
    """One rank's share of a step, all host-side: its input ids (in `layout`'s order) and layout,
    every rank's plan, and the step's whole tree (this rank's nodes: `plan.candidates`)."""

    ids: np.ndarray
    layout: StepLayout
    plans: tuple[RankPlan, ...]
    rank: int
    tree: DraftTree

    @property
    def plan(self) -> RankPlan:
        return self.plans[self.rank]


def largest_step(cfg: DecodeConfig) -> int:
    """The most tokens a step of `cfg` feeds one rank: `max_commit` pending tokens, every window
    column and the whole tree, or `step_limit` where it is less."""
    W, N, _, budget = cfg.step_shape
    most = RankPlan(range(W), range(budget)).cost(N, pending=cfg.max_commit, candidate_tokens=1)
    return most if cfg.step_limit is None else min(most, cfg.step_limit)


def rank_share(
    m: int, tree: DraftTree, *, W: int, N: int, P: int, rank: int
) -> tuple[tuple[RankPlan, ...], StepLayout]:
    """A step with `m` pending tokens split over P ranks: every rank's plan, then rank `rank`'s
    layout (what tools.project replays for each rank)."""
    if P == 1:  # the whole step: no search (nor the tree's groups, which only a search needs)
        plans: tuple[RankPlan, ...] = (RankPlan(range(W), range(tree.size)),)
    else:
        plans = partition(W, N, tree.size, P, groups=tree.groups(), candidate_tokens=1)
    plan = plans[rank]
    return plans, share_layout(m, W, N, plan.columns, tree.parent_array, plan.candidates)


def plan_step(
    pending: list[int], window: JacobiWindow | None, tree: DraftTree, *, W: int, N: int, P: int, rank: int
) -> StepPlan:
    """Split the step over P ranks and lay out rank `rank`'s forward: the pending tokens (x0
    last), its window columns with their row-0 prefix, then its verification subtrees."""
    plans, layout = rank_share(len(pending), tree, W=W, N=N, P=P, rank=rank)
    rows = window.rows if window is not None else _NO_WINDOW
    first = plans[rank].candidates.start
    ids = gather_ids(layout.gather, np.asarray(pending, dtype=np.int64), rows, tree.tokens, first)
    return StepPlan(ids, layout, plans, rank, tree=tree)


_NO_WINDOW = np.zeros((0, 1), dtype=np.int64)


def compile_kernels() -> None:
    """Compile the step's numba kernels (partition, layout, merge), or load them from numba's
    cache, on a two-rank step of a two-node tree: before a decode's clock starts rather than in
    its first step (seconds on a fresh install, about 0.3 s from the cache, once per process)."""
    tree = DraftTree(np.zeros(2, dtype=np.int64), (-1, 0))
    plans, _ = rank_share(1, tree, W=1, N=2, P=2, rank=0)
    merge(np.zeros((2, message_size(1, 3, 4, 1)), dtype=np.int64), plans, 3, 1)

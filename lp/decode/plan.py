"""A step's plan: its tree split over the P ranks (lp.partition) and this rank's share laid out as
one forward (lp.lookahead.mask), with its input ids. Pure host work, the same on every rank.

The drafter plans most steps in a compiled call after a message read (lp/decode/phases.py,
`lay_out_step`); `StepPlan` names what it returns. Given trees (tools, tests) plan through the
same compiled function (`plan_step`)."""

from __future__ import annotations

import numpy as np

from lp.decode.shares import preorder, rank_nodes, reordered
from lp.errors import LPError
from lp.jit import compiled
from lp.lookahead.mask import StepLayout, gather_ids, lay_out, layout_of
from lp.lookahead.tree import DraftTree
from lp.partition import RankPlan, Split, plans_of, search, search_split

# lay_out_step's answer: the tree (tokens, parents, root groups), every rank's bounds, this rank's
# layout (its nodes' parents, gather, depth, logit rows), its ids, the pre-order, and its mask
PLANNED = tuple[
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
]


class StepPlan:
    """One rank's share of a step: the step's whole `tree` (the same on every rank), every rank's
    share as a row of `bounds` (first column, column stop, first node, node stop), this rank's
    `layout` and input `ids` (in the layout's order). With `Split.share`, `bounds` and
    `plan.candidates` count nodes in the tree's pre-order (`order`; empty: the tree's own), and
    this rank's layout first feeds again the `dups` ancestors of its first node."""

    __slots__ = ("bounds", "dups", "ids", "layout", "order", "split", "tree")

    def __init__(self, planned: PLANNED, m: int, split: Split) -> None:
        tokens, parents, groups, bounds, mine, gather, depth, rows, ids, order, mask = planned
        self.split, self.order, self.ids = split, order, ids
        self.tree = DraftTree(tokens, parents, groups)
        self.bounds = bounds
        a, b, c, d = bounds[split.rank].tolist()
        self.layout: StepLayout = layout_of(
            m, split.W, split.N, range(a, b), mine, range(c, d), -1, mine, gather, depth, mask, rows
        )
        self.dups = len(self.layout.parents) - (d - c)

    @property
    def first_node(self) -> int:
        """The node (in `bounds`' count) that this rank's local node 0 would be, were its own
        nodes all it fed: its own nodes' local indices less this are their indices."""
        return int(self.bounds[self.split.rank, 2]) - self.dups

    @property
    def whole(self) -> int:
        """The whole step's tokens, as one rank would feed them: the pending tokens once, the window
        where the step feeds it, and every node (the same on every rank, where `layout.size` is
        this rank's share)."""
        columns = int(self.bounds[:, 1].max())
        return RankPlan(range(columns), range(self.tree.size)).cost(self.split.N, self.layout.m, 1)

    @property
    def plans(self) -> tuple[RankPlan, ...]:
        """Every rank's plan."""
        return plans_of(self.bounds)

    @property
    def plan(self) -> RankPlan:
        """This rank's plan."""
        return plans_of(self.bounds[self.split.rank : self.split.rank + 1])[0]


@compiled
def lay_out_step(
    split: Split,
    pending: np.ndarray,
    window: np.ndarray,
    tokens: np.ndarray,
    parents: np.ndarray,
    groups: np.ndarray,
    windowed: bool = True,
) -> PLANNED:
    """The plan of a step that feeds `pending` (x0 last), the window's `rows` `[N - 1, W]` and the
    tree of `tokens` and `parents` (root subtrees of `groups` nodes): the ranks' shares (`search`,
    or with `split.share` `search_split` on the tree in pre-order; one rank: the whole step), this
    rank's layout (`lay_out`) and ids (`gather_ids`): `StepPlan`'s parts. Without `windowed`, a
    step of the pending tokens alone on every rank (no window, no tree: the step's budget gave the
    sequence no node, lp/decode/budget.py)."""
    W, N, P, rank, share = split
    if len(pending) < 1 or N < 2 or not 0 <= rank < P or window.shape[0] != N - 1 or window.shape[1] != W:
        raise LPError("bad step shape: pending tokens, N, P, the rank or the window's rows do not fit")
    size = len(tokens)
    if not windowed:
        if size:
            raise LPError("a step without its window verifies no tree")
        bounds = np.zeros((P, 4), np.int64)
    elif P > 1 and share > 0:
        order = preorder(parents)
        ordered, depth = reordered(parents, order)
        bounds = search_split(W, N, depth, P, share - (len(pending) - 1))
        a, b, c, d = bounds[rank, 0], bounds[rank, 1], bounds[rank, 2], bounds[rank, 3]
        nodes, local = rank_nodes(ordered, depth, c, d)
        bad, mine, gather, depth, mask, rows = lay_out(len(pending), W, N, a, b, local, 0, len(local))
        if bad >= 0:
            raise LPError("bad tree: a node's parent does not precede it")
        ids = gather_ids(gather, pending, window, tokens[order[nodes]], 0)
        return tokens, parents, groups, bounds, mine, gather, depth, rows, ids, order, mask
    elif P == 1:
        bounds = np.empty((1, 4), np.int64)
        bounds[0, 0], bounds[0, 1], bounds[0, 2], bounds[0, 3] = 0, W, 0, size
    else:
        bounds = search(W, N, groups, P, 1, size)
        if not len(bounds):
            raise LPError("bad partition request: the tree's root subtrees are empty or do not sum to its nodes")
    order = np.zeros(0, np.int64)
    a, b, c, d = bounds[rank, 0], bounds[rank, 1], bounds[rank, 2], bounds[rank, 3]
    bad, mine, gather, depth, mask, rows = lay_out(len(pending), W, N, a, b, parents, c, d)
    if bad >= 0:
        raise LPError("bad tree: node " + str(bad) + "'s parent is not x0 nor an earlier node of its rank's share")
    ids = gather_ids(gather, pending, window, tokens, c)
    return tokens, parents, groups, bounds, mine, gather, depth, rows, ids, order, mask


def plan_step(pending: list[int] | np.ndarray, window: np.ndarray | None, tree: DraftTree, split: Split) -> StepPlan:
    """The plan of a step of a given `tree` (its window's rows `[N - 1, W]`; None: a window of
    pending tokens only, whose ids nothing reads)."""
    W, N = split.W, split.N
    rows = np.zeros((N - 1, W), np.int64) if window is None else window
    groups = np.asarray(tree.groups(), dtype=np.int64)
    fed = np.asarray(pending, dtype=np.int64)
    arrays = (np.ascontiguousarray(tree.tokens, dtype=np.int64), tree.parent_array, groups)
    return StepPlan(lay_out_step(split, fed, rows, *arrays), len(fed), split)


def next_pending(committed: list[int], keep: bool) -> list[int]:
    """The tokens the step after one that committed `committed` feeds before its window and tree
    (x0 last): all of them, or with `keep` (their drafts' KV kept) only the last."""
    return committed[-1:] if keep else committed


__all__ = ["PLANNED", "Split", "StepPlan", "lay_out_step", "next_pending", "plan_step"]

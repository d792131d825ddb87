"""A step's plan: its tree split over the P ranks (lp.partition) and this rank's share laid out as
one forward (lp.lookahead.mask), with its input ids. Pure host work, the same on every rank.

The drafter plans most steps inside its compiled call after a message read (lp/decode/phases.py,
`lay_out_step`); its answer comes to Python as one buffer of the plan's int64 arrays and the
layout's mask, which `StepPlan` cuts into views only where read (a call returning many arrays
costs Python microseconds each). Given trees (tools, plain decoding one step ahead) plan
through the same compiled function (`plan_step`)."""

from __future__ import annotations

import numpy as np

from lp.decode.shares import preorder, rank_nodes, reordered
from lp.errors import LPError
from lp.jit import compiled
from lp.lookahead.mask import StepLayout, gather_ids, lay_out, layout_of
from lp.lookahead.tree import DraftTree
from lp.partition import RankPlan, Split, plans_of, search, search_split

# the plan's int64 arrays in its buffer, in order (`StepPlan`)
PARTS = ("tokens", "parents", "groups", "bounds", "mine", "gather", "depth", "rows", "ids", "order")
ENDS = tuple[int, int, int, int, int, int, int, int, int, int]  # each part's end in the buffer


class StepPlan:
    """One rank's share of a step: its input ids (in `layout`'s order) and layout, the step's whole
    tree (this rank's nodes: `plan.candidates`) and every rank's share as a row of `bounds`
    (`plans`), each made from the compiled plan's buffer when first read. With `Split.share`,
    `bounds` and `plan.candidates` count nodes in the tree's pre-order (`order`), and this
    rank's layout first feeds again the `dups` ancestors of its first node."""

    __slots__ = ("_buffer", "_dups", "_ends", "_layout", "_mask", "_m", "_split", "_tree", "bounds", "ids")

    def __init__(self, buffer: np.ndarray, ends: ENDS, mask: np.ndarray, m: int, split: Split) -> None:
        self._buffer, self._ends, self._mask, self._m, self._split = buffer, ends, mask, m, split
        self._tree: DraftTree | None = None
        self._layout: StepLayout | None = None
        self._dups: int | None = None  # read several times a step: counted once
        self.bounds = self._part(3).reshape(-1, 4)  # each rank's (first column, column stop, first node, node stop)
        self.ids = self._part(8)

    def _part(self, i: int) -> np.ndarray:
        return self._buffer[self._ends[i - 1] if i else 0 : self._ends[i]]

    @property
    def tree(self) -> DraftTree:
        """The step's whole tree."""
        if self._tree is None:
            self._tree = DraftTree(self._part(0), self._part(1), self._part(2))
        return self._tree

    @property
    def layout(self) -> StepLayout:
        """This rank's layout."""
        if self._layout is None:
            a, b, c, d = self.bounds[self._split.rank].tolist()
            W, N = self._split.W, self._split.N
            mine, gather, depth, rows = (self._part(i) for i in range(4, 8))
            self._layout = layout_of(
                self._m, W, N, range(a, b), mine, range(c, d), -1, mine, gather, depth, self._mask, rows
            )
        return self._layout

    @property
    def order(self) -> np.ndarray:
        """The tree's nodes in the order `bounds` counts them (pre-order; empty: the tree's own)."""
        return self._part(9)

    @property
    def dups(self) -> int:
        """The nodes this rank's layout feeds before its own: ancestors of its first node."""
        if self._dups is None:
            c, d = self.bounds[self._split.rank, 2:].tolist()
            self._dups = len(self.layout.parents) - (d - c)
        return self._dups

    @property
    def first_node(self) -> int:
        """The node (in `bounds`' count) that this rank's local node 0 would be, were its own
        nodes all it fed: its own nodes' local indices less this are their indices."""
        return int(self.bounds[self._split.rank, 2]) - self.dups

    @property
    def plans(self) -> tuple[RankPlan, ...]:
        """Every rank's plan."""
        return plans_of(self.bounds)

    @property
    def plan(self) -> RankPlan:
        """This rank's plan."""
        return plans_of(self.bounds[self._split.rank : self._split.rank + 1])[0]


@compiled
def lay_out_step(
    split: Split, pending: np.ndarray, window: np.ndarray, tokens: np.ndarray, parents: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, ENDS, np.ndarray]:
    """The plan of a step that feeds `pending` (x0 last), the window's `rows` `[N - 1, W]` and the
    tree of `tokens` and `parents` (root subtrees of `groups` nodes): the ranks' shares (`search`,
    or with `split.share` `search_split` on the tree in pre-order; one rank: the whole step), this
    rank's layout (`lay_out`) and ids (`gather_ids`), packed as PARTS in one buffer (the ends of
    each part), and the layout's mask."""
    W, N, P, rank, share = split
    if len(pending) < 1 or N < 2 or not 0 <= rank < P or window.shape[0] != N - 1 or window.shape[1] != W:
        raise LPError("bad step shape: pending tokens, N, P, the rank or the window's rows do not fit")
    size = len(tokens)
    if P > 1 and share > 0:
        order = preorder(parents)
        ordered, depth = reordered(parents, order)
        bounds = search_split(W, N, depth, P, share - (len(pending) - 1))
        a, b, c, d = bounds[rank, 0], bounds[rank, 1], bounds[rank, 2], bounds[rank, 3]
        nodes, local = rank_nodes(ordered, depth, c, d)
        bad, mine, gather, depth, mask, rows = lay_out(len(pending), W, N, a, b, local, 0, len(local))
        if bad >= 0:
            raise LPError("bad tree: a node's parent does not precede it")
        ids = gather_ids(gather, pending, window, tokens[order[nodes]], 0)
        buffer, ends = _packed((tokens, parents, groups, bounds.reshape(-1), mine, gather, depth, rows, ids, order))
        return buffer, ends, mask
    order = np.zeros(0, np.int64)
    if P == 1:
        bounds = np.empty((1, 4), np.int64)
        bounds[0, 0], bounds[0, 1], bounds[0, 2], bounds[0, 3] = 0, W, 0, size
    else:
        bounds = search(W, N, groups, P, 1, size)
        if not len(bounds):
            raise LPError("bad partition request: the tree's root subtrees are empty or do not sum to its nodes")
    a, b, c, d = bounds[rank, 0], bounds[rank, 1], bounds[rank, 2], bounds[rank, 3]
    bad, mine, gather, depth, mask, rows = lay_out(len(pending), W, N, a, b, parents, c, d)
    if bad >= 0:
        raise LPError("bad tree: node " + str(bad) + "'s parent is not x0 nor an earlier node of its rank's share")
    ids = gather_ids(gather, pending, window, tokens, c)
    buffer, ends = _packed((tokens, parents, groups, bounds.reshape(-1), mine, gather, depth, rows, ids, order))
    return buffer, ends, mask


@compiled
def _packed(parts: tuple) -> tuple[np.ndarray, ENDS]:
    """The plan's PARTS (int64 vectors, in order) in one buffer, and each one's end."""
    tokens, parents, groups, flat, mine, gather, depth, rows, ids, order = parts
    buffer = np.empty(
        len(tokens) * 2
        + len(groups)
        + len(flat)
        + len(mine)
        + len(gather)
        + len(depth)
        + len(rows)
        + len(ids)
        + len(order),
        np.int64,
    )
    e0 = _put(buffer, 0, tokens)
    e1 = _put(buffer, e0, parents)
    e2 = _put(buffer, e1, groups)
    e3 = _put(buffer, e2, flat)
    e4 = _put(buffer, e3, mine)
    e5 = _put(buffer, e4, gather)
    e6 = _put(buffer, e5, depth)
    e7 = _put(buffer, e6, rows)
    e8 = _put(buffer, e7, ids)
    e9 = _put(buffer, e8, order)
    return buffer, (e0, e1, e2, e3, e4, e5, e6, e7, e8, e9)


@compiled
def _put(buffer: np.ndarray, at: int, part: np.ndarray) -> int:
    """`part` copied into `buffer` from `at`: its end."""
    for i in range(len(part)):
        buffer[at + i] = part[i]
    return at + len(part)


def plan_step(pending: list[int] | np.ndarray, window: np.ndarray | None, tree: DraftTree, split: Split) -> StepPlan:
    """The plan of a step of a given `tree` (its window's rows `[N - 1, W]`; None: a window of
    pending tokens only, whose ids nothing reads)."""
    W, N = split.W, split.N
    rows = np.zeros((N - 1, W), np.int64) if window is None else window
    groups = np.asarray(tree.groups(), dtype=np.int64)
    fed = np.asarray(pending, dtype=np.int64)
    arrays = (np.ascontiguousarray(tree.tokens, dtype=np.int64), tree.parent_array, groups)
    return StepPlan(*lay_out_step(split, fed, rows, *arrays), len(fed), split)


def next_pending(committed: list[int], keep: bool) -> list[int]:
    """The tokens the step after one that committed `committed` feeds before its window and tree
    (x0 last): all of them, or with `keep` (their drafts' KV kept) only the last."""
    return committed[-1:] if keep else committed


__all__ = ["PARTS", "Split", "StepPlan", "lay_out_step", "next_pending", "plan_step"]

"""One step's layout: which tokens a rank feeds, at which positions, under which mask, and
which rows need logits. Pure in its shape: a worker keeps one device copy per shape.

A step's input is, in order: the m pending tokens (committed to the output but not yet to the
KV cache; the last one is x0 at position t), the row-0 prefix rows[0, 1..J-1] that this rank's
columns need, levels 1..N-2 of each of its columns, then its verification tree (the drafts'
tokens, lp/lookahead/tree.py; G unshared n-grams g_c[1..N-1] are G chains). Every token sees
the committed cache, and within the step only its own chain: a token attends to itself and
its ancestors (docs/design.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from lp.jit import compiled
from lp.lookahead.tree import chain_parents

# Token identities: ("p", i) pending i; ("w", l, j) window row l column j; ("g", i) tree node i.
Token = tuple


@dataclass(eq=False)  # not frozen: made after most message reads, and a frozen one costs 4x to make
class StepLayout:
    """Everything about a step that depends only on its shape.

    `gather` indexes the flat source vector [pending (m), window rows (N-1)*W, tree tokens
    (n)] to produce the input ids. `depth` is each token's position relative to x0.
    `mask[q, k]` says whether step token q may attend to step token k (so its last n x n block
    says which tree nodes are ancestors of which). `logit_rows` lists the rows whose prediction
    is used: x0's (y1), the last token of each column (new), then every tree node, in order.
    `prefix` and `levels` count the row-0 prefix tokens and the levels above row 0 per column.
    Layouts of the same shape have the same `key`: a worker keeps one device copy per key.
    """

    m: int
    columns: range
    prefix: int
    levels: int
    gather: np.ndarray
    depth: np.ndarray
    mask: np.ndarray
    logit_rows: np.ndarray
    parents: np.ndarray  # the tree's parent pointers (-1: x0)
    key: tuple = field(repr=False)  # (m, W, N, first column, column stop, the parents' bytes)

    @property
    def tree(self) -> tuple[int, ...]:
        """The tree's parent pointers as a tuple."""
        return tuple(self.parents.tolist())

    @cached_property
    def tokens(self) -> tuple[Token, ...]:
        """Each input position's identity, in order (for reading and checking a layout)."""
        return (
            tuple(("p", i) for i in range(self.m))
            + tuple(("w", 0, i) for i in range(1, self.prefix + 1))
            + tuple(("w", lvl, j) for j in self.columns for lvl in range(1, self.levels + 1))
            + tuple(("g", i) for i in range(len(self.parents)))
        )

    @property
    def size(self) -> int:
        return len(self.gather)

    # The step's parts by name, so no caller decodes the row order by hand.
    X0_ROW = 0  # logits row: the prediction after x0 (y1)

    @property
    def column_rows(self) -> slice:
        """Logits rows: each window column's prediction (its new token), in column order."""
        return slice(1, 1 + len(self.columns))

    @property
    def node_rows(self) -> slice:
        """Logits rows: the prediction after each tree node, in node order."""
        return slice(1 + len(self.columns), len(self.logit_rows))

    @property
    def node_tokens(self) -> slice:
        """Input positions of the tree nodes (they come last)."""
        return slice(self.size - len(self.parents), self.size)


@lru_cache(maxsize=4096)
def step_layout(m: int, W: int, N: int, columns: range, tree: tuple[int, ...] | int) -> StepLayout:
    """Build the layout of a step with `m` pending tokens, the given window `columns` (a
    contiguous range inside 0..W-1) and a verification tree given by its parent pointers
    (`DraftTree.parents`: -1 is x0, parents precede children), or an int G: G unshared
    n-grams of N-1 tokens, the classic branch. Cached: tools and tests lay out a few shapes
    many times (a decode lays out its rank's share in lp/decode/plan.py's compiled plan)."""
    if isinstance(tree, int):
        if tree < 0:
            raise ValueError(f"bad step shape: {tree} candidates")
        return step_layout(m, W, N, columns, chain_parents(tree, N - 1))
    parents = np.fromiter(tree, dtype=np.int64, count=len(tree))
    if m < 1 or N < 2 or not 0 <= columns.start <= columns.stop <= W:
        raise ValueError(f"bad step shape m={m} W={W} N={N} columns={columns}")
    arrays = lay_out(m, W, N, columns.start, columns.stop, parents, 0, len(parents))
    return layout_of(m, W, N, columns, parents, range(len(parents)), *arrays)


def layout_of(
    m: int,
    W: int,
    N: int,
    columns: range,
    parents: np.ndarray,
    nodes: range,
    bad: int,
    mine: np.ndarray,
    gather: np.ndarray,
    depth: np.ndarray,
    mask: np.ndarray,
    rows: np.ndarray,
) -> StepLayout:
    """`lay_out`'s answer for a step of `m` pending tokens, window `columns` and the nodes `nodes`
    of a tree of `parents` as a StepLayout (a ValueError where a node's
    parent is neither x0 nor an earlier one of `nodes`)."""
    if bad >= 0:
        a, p = nodes.start, int(parents[nodes.start + bad])
        where = f"is {p}" if p < -1 else f"{p - a} does not precede it" if p >= a else f"{p} is not one of nodes {a}.."
        raise ValueError(f"bad tree: node {bad}'s parent {where}")
    key = (m, W, N, columns.start, columns.stop, mine.tobytes())
    return StepLayout(m, columns, columns[-1] if len(columns) else 0, N - 2, gather, depth, mask, rows, mine, key)


@compiled
def lay_out(
    m: int, W: int, N: int, start: int, stop: int, tree: np.ndarray, a: int, b: int
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The layout's arrays (`layout_of`) for nodes a..b-1 of a tree of parents `tree`: the first of them
    whose parent is neither -1 nor an earlier one of them (-1: none); their parents as a tree
    of their own; gather, depth, `[T, T]` mask and logit rows of a step with m pending tokens,
    window columns start..stop-1 (and the row-0 prefix they need, rows[0, 1..stop-1]), then those nodes.
    Compiled: most steps of a real decode bring a new tree (and, over several ranks, new
    columns), and a node's mask row is a walk up its ancestors, per node, which array ops
    cannot do in one op and Python does in tens of microseconds, on the host's path between
    the message read and the next forward."""
    L, nc, n = N - 2, stop - start, b - a
    prefix = stop - 1 if nc else 0  # the row-0 tokens rows[0, 1..prefix]
    parents = np.empty(n, np.int64)
    for i in range(n):
        p = tree[a + i]
        parents[i] = p - a if p >= a else -1 if p == -1 else -2  # -2: not one of the nodes
    base = m + prefix  # column start+k's level l (1..L) at base + k*L + l-1
    first = base + nc * L  # the tree's first node
    T = first + n
    gather = np.empty(T, np.int64)
    depth = np.empty(T, np.int64)
    mask = np.zeros((T, T), np.bool_)
    rows = np.empty(1 + nc + n, np.int64)  # the prediction rows: x0's, the columns', every node's
    for q in range(T):  # every token sees every pending token, the pending ones causally
        for k in range(min(q + 1, m)):
            mask[q, k] = True
    for q in range(m):
        gather[q], depth[q] = q, q - (m - 1)
    for i in range(1, prefix + 1):  # the row-0 prefix: causal
        q = m + i - 1
        gather[q], depth[q] = m + i, i
        for k in range(m, q + 1):
            mask[q, k] = True
    rows[0] = m - 1
    for c in range(nc):  # column j's level l sees rows[0, 1..j] and its own column's levels up to l
        j, top = start + c, base + c * L
        for lvl in range(1, L + 1):
            q = top + lvl - 1
            gather[q], depth[q] = m + lvl * W + j, lvl + j
            for k in range(m, m + j):
                mask[q, k] = True
            for k in range(top, q + 1):
                mask[q, k] = True
        # each column's prediction row: its last token (x0 or row 0 when N = 2)
        rows[1 + c] = m - 1 + j if N == 2 else top + L - 1
    for i in range(n):  # a node sees its ancestors and itself
        p, q = parents[i], first + i
        if p != -1 and not 0 <= p < i:
            return i, parents, gather, depth, mask, rows
        depth[q] = 1 if p < 0 else depth[first + p] + 1
        up = i
        while up >= 0:  # up the parents, which precede their children: depth steps
            mask[q, first + up] = True
            up = parents[up]
        gather[q] = m + (N - 1) * W + i
        rows[1 + nc + i] = q
    return -1, parents, gather, depth, mask, rows


@compiled
def gather_ids(gather: np.ndarray, pending: np.ndarray, rows: np.ndarray, tree: np.ndarray, a: int) -> np.ndarray:
    """A step's input ids: `gather` (a layout's) applied to the flat source [pending, the window's
    `rows` `[N-1, W]` row by row, tree tokens from `tree[a]` on], without building the source
    (one call instead of three array ops, after the message read)."""
    m, W = len(pending), rows.shape[1]
    cut = m + rows.shape[0] * W
    ids = np.empty(len(gather), np.int64)
    for q in range(len(gather)):
        g = gather[q]
        if g < m:
            ids[q] = pending[g]
        elif g < cut:
            ids[q] = rows[(g - m) // W, (g - m) % W]
        else:
            ids[q] = tree[a + g - cut]
    return ids

"""One step's layout: which tokens a rank feeds, at which positions, under which mask, and
which rows need logits. Pure in its shape, so it is built once per shape and cached.

A step's input is, in order: the m pending tokens (committed to the output but not yet to the
KV cache; the last one is x0 at position t), the row-0 prefix rows[0, 1..J-1] that this rank's
columns need, levels 1..N-2 of each of its columns, then its verification tree (the drafts'
tokens, lp/lookahead/tree.py; G unshared n-grams g_c[1..N-1] are G chains). Every token sees
the committed cache, and within the step only its own chain: a token attends to itself and
its ancestors (docs/design.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from lp.lookahead.tree import chain_parents

# Token identities: ("p", i) pending i; ("w", l, j) window row l column j; ("g", i) tree node i.
Token = tuple


@dataclass(frozen=True, eq=False)  # identity hash: step_layout returns one object per shape
class StepLayout:
    """Everything about a step that depends only on its shape.

    `gather` indexes the flat source vector [pending (m), window rows (N-1)*W, tree tokens
    (n)] to produce the input ids. `depth` is each token's position relative to x0.
    `mask[q, k]` says whether step token q may attend to step token k (so its last n x n block
    says which tree nodes are ancestors of which). `logit_rows` lists the rows whose prediction
    is used: x0's (y1), the last token of each column (new), then every tree node, in order.
    `prefix` and `levels` count the row-0 prefix tokens and the levels above row 0 per column.
    """

    m: int
    columns: range
    tree: tuple[int, ...]
    prefix: int
    levels: int
    gather: np.ndarray
    depth: np.ndarray
    mask: np.ndarray
    logit_rows: np.ndarray

    @cached_property
    def tokens(self) -> tuple[Token, ...]:
        """Each input position's identity, in order (for reading and checking a layout)."""
        return (
            tuple(("p", i) for i in range(self.m))
            + tuple(("w", 0, i) for i in range(1, self.prefix + 1))
            + tuple(("w", lvl, j) for j in self.columns for lvl in range(1, self.levels + 1))
            + tuple(("g", i) for i in range(len(self.tree)))
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
        return slice(self.size - len(self.tree), self.size)


# cached by its arguments as given: every caller passes all five by position, so an equal step
# gets the same object (the worker keeps device copies per layout object)
@lru_cache(maxsize=4096)
def step_layout(m: int, W: int, N: int, columns: range, tree: tuple[int, ...] | int) -> StepLayout:
    """Build the layout of a step with `m` pending tokens, the given window `columns` (a
    contiguous range inside 0..W-1) and a verification tree given by its parent pointers
    (`DraftTree.parents`: -1 is x0, parents precede children), or an int G: G unshared
    n-grams of N-1 tokens, the classic branch. (Empty ranges compare equal, so the cache may
    return another empty range's layout: they are identical.)"""
    if isinstance(tree, int):
        if tree < 0:
            raise ValueError(f"bad step shape: {tree} candidates")
        return step_layout(m, W, N, columns, chain_parents(tree, N - 1))
    if m < 1 or N < 2 or not (0 <= columns.start <= columns.stop <= W):
        raise ValueError(f"bad step shape m={m} W={W} N={N} columns={columns} tree={tree}")
    ancestors, tree_depth = _ancestors(tree)  # raises on a bad tree
    # Most steps of a real decode bring a new tree, while the tokens before it (pending tokens
    # and window) keep their shape: that part comes from its own cache, and the tree is laid
    # after it. Tree nodes see every pending token, no window token, and their own ancestors.
    gather, depth, window_mask, last, prefix = window_part(m, W, N, columns)
    first, n = len(gather), len(tree)
    T = first + n
    mask = np.zeros((T, T), dtype=bool)
    mask[:first, :first] = window_mask
    mask[first:, :m] = True
    mask[first:, first:] = ancestors
    # the prediction rows: x0's, the columns', every node's
    rows = np.concatenate([[m - 1], last, np.arange(first, T)])
    return StepLayout(
        m=m,
        columns=columns,
        tree=tree,
        prefix=prefix,
        levels=N - 2,
        gather=np.concatenate([gather, m + (N - 1) * W + np.arange(n)]),
        depth=np.concatenate([depth, tree_depth]),
        mask=mask,
        logit_rows=rows,
    )


@lru_cache(maxsize=1024)
def window_part(m: int, W: int, N: int, columns: range) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The step's tokens before its tree, in order: the m pending tokens, the row-0 prefix,
    each column's levels (none on a rank without columns). Their gather indices, depths,
    `[first, first]` mask, the columns' prediction rows and the prefix's length. Cached, so
    the arrays are read-only."""
    x0, L, nc = m - 1, N - 2, len(columns)
    prefix = columns[-1] if nc else 0  # row-0 tokens rows[0, 1..prefix], at m..m+prefix-1
    base = m + prefix  # column c's level l (1..L) at base + c*L + l-1
    first = base + nc * L
    pending = np.arange(m)
    gather, depth, last = [pending], [pending - x0], pending[:0]
    mask = np.zeros((first, first), dtype=bool)
    mask[:m, :m] = np.tri(m, dtype=bool)  # pending: causal
    mask[m:, :m] = True  # everything else sees every pending token
    if nc:
        cols = np.arange(columns.start, columns.stop)
        lvl = np.tile(np.arange(1, L + 1), nc)  # per level token: its level and column
        col = np.repeat(cols, L)
        i = np.arange(1, prefix + 1)
        gather += [m + i, m + lvl * W + col]
        depth += [i, lvl + col]
        mask[m:base, m:base] = np.tri(prefix, dtype=bool)  # the row-0 prefix: causal
        # column j's level l sees rows[0, 1..j] and its own column's levels up to l
        mask[base:, m:base] = i[None, :] <= col[:, None]
        mask[base:, base:] = (col[:, None] == col[None, :]) & (lvl[None, :] <= lvl[:, None])
        # each column's prediction row: its last token (x0 or row 0 when N = 2)
        last = m - 1 + cols if N == 2 else base + np.arange(nc) * L + L - 1
    arrays = np.concatenate(gather), np.concatenate(depth), mask, last
    for a in arrays:
        a.setflags(write=False)
    return (*arrays, prefix)


def _ancestors(parents: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The `[n, n]` relation "k is node q or one of its ancestors", and each node's depth below
    x0 (1 for its children). Parents precede children, so one pass makes each node's row a
    Python int bitset, its parent's plus its own bit, and its depth its parent's plus one (and
    checks the pointers); the n ints are then unpacked in one array op (a row op per node
    costs more)."""
    n = len(parents)
    bits: list[int] = []
    depth: list[int] = []
    for q, p in enumerate(parents):
        if p < 0:
            if p != -1:
                raise ValueError(f"bad tree: node {q}'s parent is {p}")
            bits.append(1 << q)
            depth.append(1)
        elif p < q:
            bits.append(bits[p] | 1 << q)
            depth.append(depth[p] + 1)
        else:
            raise ValueError(f"bad tree: node {q}'s parent {p} does not precede it")
    width = (n + 7) // 8
    packed = np.frombuffer(b"".join([b.to_bytes(width, "little") for b in bits]), dtype=np.uint8)
    mask = np.unpackbits(packed.reshape(n, width), axis=1, count=n, bitorder="little").view(bool)
    return mask, np.asarray(depth, dtype=np.int64)

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
from functools import lru_cache

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
    """

    m: int
    columns: range
    tree: tuple[int, ...]
    tokens: tuple[Token, ...]
    gather: np.ndarray
    depth: np.ndarray
    mask: np.ndarray
    logit_rows: np.ndarray

    @property
    def size(self) -> int:
        return len(self.tokens)

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
    if m < 1 or N < 2 or not (0 <= columns.start <= columns.stop <= W) \
            or any(not -1 <= p < i for i, p in enumerate(tree)):
        raise ValueError(f"bad step shape m={m} W={W} N={N} columns={columns} tree={tree}")
    tokens: list[Token] = []
    parent: list[int] = []
    depth: list[int] = []
    source: list[int] = []
    index: dict[Token, int] = {}

    def add(tok: Token, par: int, dep: int, src: int) -> None:
        index[tok] = len(tokens)
        tokens.append(tok)
        parent.append(par)
        depth.append(dep)
        source.append(src)

    for i in range(m):
        add(("p", i), i - 1, i - (m - 1), i)
    x0 = m - 1
    win = m  # offset of the window rows in the source vector
    prefix = columns[-1] if len(columns) else 0  # row-0 tokens rows[0, 1..prefix]
    for i in range(1, prefix + 1):
        add(("w", 0, i), x0 if i == 1 else index[("w", 0, i - 1)], i, win + i)
    for j in columns:
        for lvl in range(1, N - 1):
            below = (x0 if j == 0 else index[("w", 0, j)]) if lvl == 1 else index[("w", lvl - 1, j)]
            add(("w", lvl, j), below, lvl + j, win + lvl * W + j)
    cand = win + (N - 1) * W
    first = len(tokens)
    for i, p in enumerate(tree):
        add(("g", i), x0 if p < 0 else first + p, 1 if p < 0 else depth[first + p] + 1, cand + i)

    T = len(tokens)
    mask = np.zeros((T, T), dtype=bool)
    for q in range(T):  # parents precede children, so one pass closes the ancestor relation
        if parent[q] >= 0:
            mask[q] = mask[parent[q]]
        mask[q, q] = True

    def last_of_column(j: int) -> int:
        if N == 2:
            return x0 if j == 0 else index[("w", 0, j)]
        return index[("w", N - 2, j)]

    rows = [x0] + [last_of_column(j) for j in columns]
    rows += range(first, T)
    return StepLayout(
        m=m,
        columns=columns,
        tree=tree,
        tokens=tuple(tokens),
        gather=np.asarray(source, dtype=np.int64),
        depth=np.asarray(depth, dtype=np.int64),
        mask=mask,
        logit_rows=np.asarray(rows, dtype=np.int64),
    )

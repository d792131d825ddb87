"""Drafts recycled from the model's own predictions (as in Token Recycling, Luo et al. 2024):
every step's forward computes logits for many rows, and each row's top-k tokens say what the
model expects after that row's input token (a step of plain batched decoding, where the budget
chose no node, computes none: under load lookahead costs what plain decoding does). A table
keeps, per token, the top-k of the last row it was the input of, and per pair (token before,
token) where a row's context is known (the tree's nodes, x0), the pair's row, preferred where it
exists (more context predicts better). A step's recycled drafts are the likeliest paths through
the table from x0 (lp/lookahead/grow.py).

The table is replicated state like the pool: every rank applies the same gathered rows in the
same order (lp/message.py), so every rank builds the same drafts. A step's rows land on scattered
lines of a table of megabytes, a cache miss or two each: they are staged in a small hash that
lookups read first (`stage`), and written once the next forward is queued (`apply`).

Fields: `table[t]` token t's row (-1: never seen), `pairs[p]` pair row p, found by its key
(`pair_key`) in the open-addressing hash `index` of (key, p); `hits[r]`: committed tokens that were
their predecessor's rank-r successor, `hits[k]`: none of them (one pseudo-count each, so the first
steps spread drafts evenly over the ranks; a draft memory shares them out as earlier decodes
counted); the staged rows `staged` (input token, successors), their pair keys `staged_keys` (the
last rows'; `staged_first`: row 0's, -1: none) and the hash `stage` of (key, row of `staged`): pair
keys, and STAGED_TOKEN | token for the token rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba.experimental import structref

from lp.errors import LPError
from lp.jit import State, bit_length, compiled
from lp.lookahead.text import FIB

NO_ROW = -(1 << 62)  # `find_row`'s answer where neither table has a row
STAGED_TOKEN = 1 << 62  # a staged token row's key, apart from every pair key
MOST_PAIRS_UP_FRONT = 1 << 17  # pair rows sized up front at most (4 MiB at k = 8); more grow
STAGE_SLOTS = 16  # the stage's slots until a step's room is made (`reserve`)


@compiled
def pair_key(first: int, second: int) -> int:
    """One int for a pair of tokens: `first << 32 | second`."""
    return first << 32 | second


@structref.register
class SuccessorTableType(State):
    pass


class SuccessorTable(structref.StructRefProxy):
    """The k successors of `vocab` tokens' last rows, and of pairs' (sized for `expected_pairs`
    up front: growing copies every pair row, a step's worth of work or more)."""

    def __new__(cls, k: int, vocab: int, expected_pairs: int = 0) -> SuccessorTable:
        if k < 1:
            raise ValueError(f"successors per token must be >= 1, got {k}")
        return new_table(k, vocab, min(max(expected_pairs, 256), MOST_PAIRS_UP_FRONT))

    @property
    def hits(self) -> np.ndarray:
        """The rank counts (the table's own array: writes count)."""
        return _hits(self)

    def update(self, rows: np.ndarray, keys: np.ndarray | None = None, first: int = -1) -> None:
        """Apply rows `[n, 1 + k]` (input token, its top-k successors) in order: a token's last row
        wins. For the pair rows, each row's `pair_key(token before its input, input)` where known:
        `first` row 0's (-1: unknown), `keys` the last len(keys) rows'."""
        rows = np.ascontiguousarray(rows, np.int64)
        keys = np.zeros(0, np.int64) if keys is None else np.asarray(keys, np.int64)
        apply(self)
        reserve(self, len(rows))
        stage(self, rows, keys, first)
        apply(self)

    def row(self, before: int, token: int) -> list[int] | None:
        """The successors expected after `token` when `before` precedes it (None: unknown)."""
        row = _row(self, before, token)
        return None if row[0] == NO_ROW else row.tolist()

    def observe(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Count, for each token of `tokens` after the first two, which rank of its predecessor's
        successors (`row`) it was."""
        count_ranks(self, np.asarray(tokens, dtype=np.int64))

    @property
    def n_pairs(self) -> int:
        return _n_pairs(self)


structref.define_proxy(
    SuccessorTable,
    SuccessorTableType,
    ["k", "table", "pairs", "index", "n_pairs", "hits", "stage", "staged", "staged_keys", "staged_first"],
)


@compiled
def new_table(k: int, vocab: int, pairs: int) -> SuccessorTable:
    """An empty table of k successors per token, room for `pairs` pair rows."""
    return SuccessorTable(
        k,
        np.full((vocab, k), -1, np.int32),  # token ids fit: half the memory
        np.zeros((pairs, k), np.int32),
        np.full((1 << bit_length(2 * pairs), 2), -1, np.int64),
        0,
        np.ones(k + 1, np.float64),
        np.full((STAGE_SLOTS, 2), -1, np.int64),
        np.zeros((0, 1 + k), np.int64),
        np.zeros(0, np.int64),
        -1,
    )


@compiled
def slot(index: np.ndarray, key: int) -> int:
    """The slot of the non-negative `key` in an open-addressing hash `index` `[size, 2]` of (key
    (-1: empty), value), size a power of two, or the empty slot where it would go. A slot's key
    and value share a cache line: a step probes a few hundred slots at random."""
    mask = len(index) - 1
    i = np.int64(((np.uint64(key) * FIB) >> np.uint64(32)) & np.uint64(mask))
    while index[i, 0] != key and index[i, 0] != -1:
        i = (i + 1) & mask
    return i


@compiled
def _put(index: np.ndarray, key: int, value: int) -> None:
    i = slot(index, key)
    index[i, 0], index[i, 1] = key, value


@compiled
def find_row(table: SuccessorTable, before: int, token: int) -> int:
    """Where the successors of `token` after `before` are: the pair row of (`before`, `token`),
    else `token`'s own row, else NO_ROW; each looked up first among the staged rows (row j as
    len(table) + j), then in the pair rows (pair row p as -p - 1) or the token rows."""
    rows, stage = table.table, table.stage
    if before >= 0:
        key = pair_key(before, token)
        i = slot(stage, key)
        if stage[i, 0] >= 0:
            return len(rows) + stage[i, 1]
        i = slot(table.index, key)
        if table.index[i, 0] >= 0:
            return -table.index[i, 1] - 1
    if not 0 <= token < len(rows):
        return NO_ROW
    i = slot(stage, STAGED_TOKEN | token)
    if stage[i, 0] >= 0:
        return len(rows) + stage[i, 1]
    return token if rows[token, 0] >= 0 else NO_ROW


@compiled
def successor(table: SuccessorTable, row: int, r: int) -> int:
    """The rank-r successor in `find_row`'s row."""
    if row < 0:
        return np.int64(table.pairs[-row - 1, r])
    if row < len(table.table):
        return np.int64(table.table[row, r])
    return table.staged[row - len(table.table), 1 + r]


@compiled
def rates(table: SuccessorTable) -> np.ndarray:
    """The estimated chance that the rank-r successor is the next token, r < k, from the counts
    `hits`, made non-increasing in r (what the best-first growth relies on)."""
    hits, k = table.hits, table.k
    total = hits.sum()
    out = np.empty(k, np.float64)
    for r in range(k):
        out[r] = hits[r] / total
        if r and out[r] > out[r - 1]:
            out[r] = out[r - 1]
    return out


@compiled
def count_ranks(table: SuccessorTable, tokens: np.ndarray) -> None:
    """Each token's rank in its predecessor's row (k: none), counted, for the tokens after the
    first two."""
    for j in range(2, len(tokens)):
        row = find_row(table, tokens[j - 2], tokens[j - 1])
        if row == NO_ROW:
            continue
        r = 0
        while r < table.k and successor(table, row, r) != tokens[j]:
            r += 1
        table.hits[r] += 1


@compiled
def reserve(table: SuccessorTable, rows: int) -> None:
    """Room for the pair rows of `rows` more rows (the hash index at most half full), and for
    staging them (two keys a row, the stage at most half full)."""
    need = table.n_pairs + rows + 1
    if 2 * need > len(table.index):
        old = table.index
        index = np.full((1 << bit_length(2 * need), 2), -1, np.int64)
        for i in range(len(old)):
            if old[i, 0] >= 0:
                _put(index, old[i, 0], old[i, 1])
        table.index = index
    if need > len(table.pairs):
        pairs = np.zeros((2 * need, table.k), np.int32)
        pairs[: table.n_pairs] = table.pairs[: table.n_pairs]
        table.pairs = pairs
    if 4 * rows > len(table.stage):  # replaced while empty: rows are staged after their room is made
        table.stage = np.full((1 << bit_length(4 * rows), 2), -1, np.int64)


@compiled
def stage(table: SuccessorTable, rows: np.ndarray, keys: np.ndarray, first: int) -> None:
    """Stage rows `[n, 1 + k]` for `apply` (their pair keys: `first` row 0's, -1: none; `keys`
    the last len(keys) rows'; successors are tokens, >= 0): every key they write maps to the last
    row that writes it, so `find_row` reads the table as `apply` will leave it."""
    n, m = rows.shape[0], len(keys)
    if first >= 0 and n:
        _put(table.stage, first, 0)
    for j in range(m):
        _put(table.stage, keys[j], n - m + j)
    for j in range(n):
        if not 0 <= rows[j, 0] < len(table.table):
            raise LPError("a successor row's input token is not in the table's vocabulary")
        _put(table.stage, STAGED_TOKEN | rows[j, 0], j)
    table.staged, table.staged_keys, table.staged_first = rows, keys, first


@compiled
def apply(table: SuccessorTable) -> None:
    """Write the staged rows in order (a token's last row wins), in the room `reserve` made before
    they were staged, and empty the stage."""
    staged, pair_keys, first_key = table.staged, table.staged_keys, table.staged_first
    n, m = staged.shape[0], len(pair_keys)
    if not n:
        return
    need = table.n_pairs + n + 1
    if 2 * need > len(table.index) or need > len(table.pairs):
        raise LPError("staged successor rows without room: reserve() before they are staged")
    if first_key >= 0:
        _set_pair(table, first_key, staged, 0)
    for j in range(m):
        _set_pair(table, pair_keys[j], staged, n - m + j)
    for j in range(n):
        _copy(table.table, staged[j, 0], staged, j)
    table.staged = np.zeros((0, 1 + table.k), np.int64)
    table.staged_keys, table.staged_first = np.zeros(0, np.int64), -1
    table.stage[:] = -1


@compiled
def _set_pair(table: SuccessorTable, key: int, rows: np.ndarray, j: int) -> None:
    """Key `key`'s pair row is now row j's successors (a new key takes the next pair row)."""
    i = slot(table.index, key)
    if table.index[i, 0] < 0:
        table.index[i, 0], table.index[i, 1] = key, table.n_pairs
        table.n_pairs += 1
    _copy(table.pairs, table.index[i, 1], rows, j)


@compiled
def _copy(to: np.ndarray, i: int, rows: np.ndarray, j: int) -> None:
    """`to[i] = rows[j, 1:]`, element by element: numba's row views and slice assignment cost
    about a hundred nanoseconds a row, twenty times the copy."""
    for c in range(to.shape[1]):
        to[i, c] = rows[j, 1 + c]


@compiled
def _row(table: SuccessorTable, before: int, token: int) -> np.ndarray:
    row = find_row(table, before, token)
    if row == NO_ROW:
        return np.full(1, NO_ROW, np.int64)
    return np.array([successor(table, row, r) for r in range(table.k)], np.int64)


@compiled
def _hits(table: SuccessorTable) -> np.ndarray:
    return table.hits


@compiled
def _n_pairs(table: SuccessorTable) -> int:
    return table.n_pairs


__all__ = [
    "NO_ROW", "SuccessorTable", "apply", "count_ranks", "find_row", "pair_key", "rates", "reserve", "stage",
    "successor",
]  # fmt: skip

"""One verification tree grown best first across all draft sources: each node's estimated chance of
being right is its parent's times its source's rate, and the tree takes the likeliest nodes below
x0 until its budget is spent. Three kinds of entry compete on that one scale:
  * chains: drafts (the text's continuations, pool n-grams, the window's row 0,
    lp/lookahead/drafts.py), token i of a draft right with chance `chances[source, i]` when the
    tokens before it are (the rates that lp/lookahead/rates.py counts);
  * successor rows (lp/lookahead/successors.py): the k tokens expected after a node's token, the
    rank-r one right with chance `rates[r]` (non-increasing in r), below every node, at most
    `depth` deep;
  * continuations: below a new node (not itself made by one), the text after an earlier
    occurrence of its token: of its newest few (WALK + 1), the one whose tokens before it match
    the node's path (its ancestors, x0, the text before x0) longest, up to MATCHED tokens, each
    match length a source of its own; while it makes new nodes, at most `continuation_len` tokens.
Nodes that several entries make are made once (the first, likeliest, maker's chance counts) and
grown on. Entries of equal chance leave in the order they were offered: the chains in order, then
x0's row; a taken row offers its next sibling, then its node's successors; a taken chain token
its node's continuation, its successors, then the chain's next token.

A step grows up to a thousand nodes after its message is read, so the growth is compiled (a
microsecond a node in Python)."""

from __future__ import annotations

import numpy as np
from numba.experimental import structref

from lp.errors import LPError
from lp.jit import State, compiled
from lp.lookahead.chains import Chains
from lp.lookahead.drafts import CONTINUATION_SOURCE, MATCHED
from lp.lookahead.successors import NO_ROW, SuccessorTable, find_row, rates, successor
from lp.lookahead.text import TextIndex

# an entry's kind: a successor row, a chain, a node's own row not yet looked up, or the text after
# an earlier occurrence of a node's token (CONTINUATION + m: matching m of its path's tokens too)
ROW, CHAIN, LATER, CONTINUATION = 0, 1, 2, 3
WALK = 8  # earlier occurrences of a node's token searched for the longest match, after the newest


@structref.register
class GrowthType(State):
    pass


class Growth(structref.StructRefProxy):
    """A tree being grown: its nodes (token, parent, root, label, chance made at, first child and
    next sibling: `first_child[p + 1]`, x0's at 0) and the entries waiting to make more (each
    (parent, kind, row or chain or text position, position i in it, depth) in `entry`, in the
    order offered; a heap of their indices `waiting[:heap]` keyed by negated chance `keys`)."""


structref.define_proxy(
    Growth,
    GrowthType,
    [
        "tokens", "parents", "roots", "labels", "made", "first_child", "sibling", "size",
        "entry", "offered", "keys", "waiting", "heap",
    ],
)  # fmt: skip


@compiled
def _new_growth(budget: int, entries: int) -> Growth:
    return Growth(
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.int64),
        np.empty(budget, np.float64),
        np.full(budget + 1, -1, np.int64),
        np.full(budget, -1, np.int64),
        0,
        np.empty((entries, 5), np.int64),
        0,
        np.empty(entries, np.float64),
        np.empty(entries, np.int64),
        0,
    )


@compiled
def _wait(g: Growth, key: float, parent: int, kind: int, seq: int, i: int, d: int) -> None:
    """Offer an entry of negated chance `key`: it waits in the heap (an entry leaves before another
    if likelier, or as likely and offered first)."""
    e = g.offered
    g.entry[e, 0], g.entry[e, 1], g.entry[e, 2], g.entry[e, 3], g.entry[e, 4] = parent, kind, seq, i, d
    g.offered += 1
    keys, waiting = g.keys, g.waiting
    j = g.heap
    while j > 0:  # a hole moves up from the end until its parent leaves first
        p = (j - 1) >> 1
        if keys[p] < key or (keys[p] == key and waiting[p] < e):
            break
        keys[j], waiting[j] = keys[p], waiting[p]
        j = p
    keys[j], waiting[j] = key, e
    g.heap += 1


@compiled
def _next(g: Growth) -> int:
    """The likeliest waiting entry, taken from the heap: the last one's hole moves down from the top."""
    keys, waiting = g.keys, g.waiting
    top = waiting[0]
    g.heap -= 1
    h = g.heap
    key, e = keys[h], waiting[h]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= h:
            break
        if c + 1 < h and (keys[c + 1] < keys[c] or (keys[c + 1] == keys[c] and waiting[c + 1] < waiting[c])):
            c += 1
        if not (keys[c] < key or (keys[c] == key and waiting[c] < e)):
            break
        keys[j], waiting[j] = keys[c], waiting[c]
        j = c
    keys[j], waiting[j] = key, e
    return top


@compiled
def _waits_first(g: Growth, key: float) -> bool:
    """Whether a waiting entry is at least as likely as one of negated chance `key`."""
    return g.heap > 0 and g.keys[0] <= key


@compiled
def _child(g: Growth, parent: int, token: int) -> int:
    """Node `parent`'s child of `token`, or -1."""
    node = g.first_child[parent + 1]
    while node >= 0 and g.tokens[node] != token:
        node = g.sibling[node]
    return node


@compiled
def _add(g: Growth, parent: int, token: int, label: int, key: float) -> int:
    """A new node of `token` below `parent`, made at negated chance `key`."""
    node = g.size
    g.size += 1
    g.tokens[node], g.parents[node], g.labels[node], g.made[node] = token, parent, label, key
    g.roots[node] = node if parent < 0 else g.roots[parent]
    g.sibling[node] = g.first_child[parent + 1]
    g.first_child[parent + 1] = node
    return node


@compiled
def _matched(g: Growth, text: TextIndex, parent: int, at: int) -> int:
    """How many of the tokens before a node (its parent's, up the tree to x0, then the text's
    before x0) the tokens before position `at` of the text match, at most MATCHED."""
    seq, n = text.seq, text.n
    m, p, back = 0, parent, 0
    while m < MATCHED and at - 1 - m >= 0:
        if p >= 0:
            up, p = g.tokens[p], g.parents[p]
        else:
            if n - 1 - back < 0:
                break
            up, back = seq[n - 1 - back], back + 1
        if seq[at - 1 - m] != up:
            break
        m += 1
    return m


@compiled
def _offer_continuation(
    g: Growth, text: TextIndex, chances: np.ndarray, node: int, parent: int, token: int, key: float, d: int
) -> None:
    """Offer the text after the earlier occurrence of `token` (new node `node`'s, below `parent`,
    made at negated chance `key`) whose tokens before it match the node's path longest (of the
    newest few; the newest of those), from the source of its match's length."""
    at, best, matched, walk = text.latest[token], -1, -1, 0
    while at >= 0 and walk <= WALK and matched < MATCHED:
        m = _matched(g, text, parent, at)
        if m > matched:
            best, matched = at, m
        at, walk = text.earlier[at], walk + 1
    _wait(g, key * chances[CONTINUATION_SOURCE + matched, 0], node, CONTINUATION + matched, best + 1, 0, d + 1)


@compiled
def _in_subtree_order(g: Growth) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The nodes in subtree order (grouped by their root, roots by index, each group in growth
    order, lp/lookahead/tree.py): tokens, parents, labels, each one's place in the growth, and
    the node counts of the root subtrees."""
    size, roots = g.size, g.roots
    count = np.zeros(size, np.int64)
    for v in range(size):
        count[roots[v]] += 1
    offset = np.zeros(size, np.int64)
    total = groups = 0
    for r in range(size):
        offset[r] = total
        total += count[r]
        groups += count[r] > 0
    order = np.empty(size, np.int64)
    for v in range(size):
        order[offset[roots[v]]] = v
        offset[roots[v]] += 1
    where = np.empty(size, np.int64)
    for j in range(size):
        where[order[j]] = j
    tokens, parents, labels = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
    for j in range(size):
        v = order[j]
        tokens[j], labels[j] = g.tokens[v], g.labels[v]
        parents[j] = where[g.parents[v]] if g.parents[v] >= 0 else -1
    sizes = np.empty(groups, np.int64)
    g_ = 0
    for r in range(size):
        if count[r]:
            sizes[g_] = count[r]
            g_ += 1
    return tokens, parents, labels, order, sizes


@compiled
def grow(
    text: TextIndex,
    chains: Chains,
    chances: np.ndarray,
    table: SuccessorTable,
    budget: int,
    depth: int,
    continuation_len: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The likeliest nodes below x0 (the text's last token), at most `budget`: from `chains` (token
    i of a draft from source s right with chance `chances[s, i]` when the ones before it are),
    from `table`'s successor rows (none with k = 0) and, with `continuation_len`, from the text's
    continuations, at most `depth` deep. In subtree order: each node's token, parent and label
    (source s's token i: s * depth + i, the counted rate's index; -1: the successor table's), its
    place in the growth (most likely first), and the node counts of the root subtrees."""
    D, seq, n = chances.shape[1], text.seq, text.n
    x0, before = seq[n - 1], seq[n - 2] if n > 1 else -1
    if continuation_len and (CONTINUATION_SOURCE + MATCHED >= chances.shape[0] or continuation_len > D):
        raise LPError("the text's continuations have no rows of chances, or are longer than them")
    for c in range(chains.count):
        if not (0 <= chains.sources[c] < chances.shape[0] and chains.starts[c + 1] - chains.starts[c] <= D):
            raise LPError("a chain's source has no row of chances, or is longer than that row")
    q = rates(table)
    k = len(q)
    q0 = q[0] if k else 0.0
    follows = continuation_len > 0 and len(text.latest) > 0
    flat, starts, sources = chains.tokens, chains.starts, chains.sources
    # a chain offers each of its tokens once at most, a row (x0's, a new node's) each of its k
    g = _new_growth(budget, starts[chains.count] + (budget + 1) * k + 1 + (2 * budget + 2 if follows else 0))
    for c in range(chains.count):
        if starts[c + 1] > starts[c]:
            _wait(g, -chances[sources[c], 0], -1, CHAIN, c, 0, 1)
    if k and depth >= 1:
        row = find_row(table, before, x0)
        if row != NO_ROW:
            _wait(g, -q0, -1, ROW, row, 0, 1)

    while g.heap:
        key = g.keys[0]
        e = _next(g)
        parent, kind, at, i, d = g.entry[e, 0], g.entry[e, 1], g.entry[e, 2], g.entry[e, 3], g.entry[e, 4]
        if kind == LATER:  # node `parent`'s own row, looked up once it is the likeliest entry
            up = g.parents[parent]
            at, kind = find_row(table, g.tokens[up] if up >= 0 else x0, g.tokens[parent]), ROW
            if at == NO_ROW:
                continue
        while True:  # an entry that would leave next is taken at once, without waiting
            if kind == ROW:
                token = successor(table, at, i)
            elif kind >= CONTINUATION:
                token = seq[at + i]
            else:
                token = flat[starts[at] + i]
            node = _child(g, parent, token)
            new = node < 0
            if new:
                if g.size >= budget:
                    g.heap = 0
                    break
                if kind == ROW:
                    label = -1
                else:
                    source = CONTINUATION_SOURCE + kind - CONTINUATION if kind >= CONTINUATION else sources[at]
                    label = source * D + i
                node = _add(g, parent, token, label, key)
            # a node is grown on once, where it is made, from its own row: looked up where it may
            # go on at once, else waiting as LATER (most waiting rows never leave the heap, and
            # each lookup reads a random line or two of the table); a row that proves missing
            # leaves no node, so the tree is the same as with every row looked up here
            below, grows = NO_ROW, LATER if k and d < depth and new else -1
            if follows and new and kind < CONTINUATION and d < depth and token < len(text.latest):
                if text.latest[token] >= 0:
                    _offer_continuation(g, text, chances, node, parent, token, key, d)
            child = key * q0
            has_sibling = kind == ROW and i + 1 < k
            sibling = key / q[i] * q[i + 1] if has_sibling else 0.0
            if grows >= 0 and kind == ROW and (not has_sibling or child < sibling):
                below = find_row(table, g.tokens[parent] if parent >= 0 else x0, token)
                grows = ROW if below != NO_ROW else -1
            if kind == ROW:
                # a row offers its next sibling, then the node's successors: the likelier of the
                # two goes on at once when nothing waiting is as likely (the sibling first at equal
                # chances, as it came first), the other waits
                if grows == ROW:  # looked up only where the node's successors go before its sibling
                    if has_sibling:
                        _wait(g, sibling, parent, ROW, at, i + 1, d)
                    if _waits_first(g, child):
                        _wait(g, child, node, ROW, below, 0, d + 1)
                        break
                    parent, at, i, d, key = node, below, 0, d + 1, child
                elif has_sibling:
                    if _waits_first(g, sibling):
                        _wait(g, sibling, parent, ROW, at, i + 1, d)
                        if grows >= 0:
                            _wait(g, child, node, grows, below, 0, d + 1)
                        break
                    if grows >= 0:
                        _wait(g, child, node, grows, below, 0, d + 1)
                    i, key = i + 1, sibling
                else:
                    break
                continue
            if grows >= 0:
                _wait(g, child, node, grows, below, 0, d + 1)
            # a chain goes on from its node's chance: another source's, if it made the node first;
            # the text's continuation only while it makes new nodes (an old one grows on from its
            # own maker)
            if kind >= CONTINUATION:
                source = CONTINUATION_SOURCE + kind - CONTINUATION
                if not new or i + 1 >= continuation_len or at + i + 1 >= n or d >= depth:
                    break
            else:
                source = sources[at]
                if starts[at] + i + 1 >= starts[at + 1]:
                    break
            key = (key if new else g.made[node]) * chances[source, i + 1]
            parent, i, d = node, i + 1, d + 1
            if _waits_first(g, key):
                _wait(g, key, parent, kind, at, i, d)
                break
    return _in_subtree_order(g)


__all__ = ["CONTINUATION", "grow"]

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

from lp.errors import LPError
from lp.jit import compiled
from lp.lookahead.chains import Chains
from lp.lookahead.growing_tree import (
    GrowingTree,
    add_node,
    child_of,
    in_subtree_order,
    new_growing_tree,
    offer,
    take,
    waits_first,
)
from lp.lookahead.sources import CONTINUATION_SOURCE, MATCHED
from lp.lookahead.successors import NO_ROW, SuccessorTable, find_row, rates, successor
from lp.lookahead.text import TextIndex

# an entry's kind: a successor row, a chain, a node's own row not yet looked up, or the text after
# an earlier occurrence of a node's token (CONTINUATION + m: matching m of its path's tokens too)
ROW, CHAIN, LATER, CONTINUATION = 0, 1, 2, 3
WALK = 8  # earlier occurrences of a node's token searched for the longest match, after the newest


@compiled
def _matched(g: GrowingTree, text: TextIndex, parent: int, at: int) -> int:
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
    g: GrowingTree, text: TextIndex, chances: np.ndarray, node: int, parent: int, token: int, key: float, d: int
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
    offer(g, key * chances[CONTINUATION_SOURCE + matched, 0], node, CONTINUATION + matched, best + 1, 0, d + 1)


@compiled
def grow(
    text: TextIndex,
    chains: Chains,
    chances: np.ndarray,
    table: SuccessorTable,
    budget: int,
    depth: int,
    continuation_len: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The likeliest nodes below x0 (the text's last token), at most `budget`: from `chains` (token
    i of a draft from source s right with chance `chances[s, i]` when the ones before it are),
    from `table`'s successor rows (none with k = 0) and, with `continuation_len`, from the text's
    continuations, at most `depth` deep. In subtree order: each node's token, parent and label
    (source s's token i: s * depth + i, the counted rate's index; -1: the successor table's), its
    place in the growth (most likely first), the node counts of the root subtrees, and each node's
    chance in growth order."""
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
    g = new_growing_tree(budget, starts[chains.count] + (budget + 1) * k + 1 + (2 * budget + 2 if follows else 0))
    for c in range(chains.count):
        if starts[c + 1] > starts[c]:
            offer(g, -chances[sources[c], 0], -1, CHAIN, c, 0, 1)
    if k and depth >= 1:
        row = find_row(table, before, x0)
        if row != NO_ROW:
            offer(g, -q0, -1, ROW, row, 0, 1)

    while g.heap:
        key = g.keys[0]
        e = take(g)
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
            node = child_of(g, parent, token)
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
                node = add_node(g, parent, token, label, key)
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
                        offer(g, sibling, parent, ROW, at, i + 1, d)
                    if waits_first(g, child):
                        offer(g, child, node, ROW, below, 0, d + 1)
                        break
                    parent, at, i, d, key = node, below, 0, d + 1, child
                elif has_sibling:
                    if waits_first(g, sibling):
                        offer(g, sibling, parent, ROW, at, i + 1, d)
                        if grows >= 0:
                            offer(g, child, node, grows, below, 0, d + 1)
                        break
                    if grows >= 0:
                        offer(g, child, node, grows, below, 0, d + 1)
                    i, key = i + 1, sibling
                else:
                    break
                continue
            if grows >= 0:
                offer(g, child, node, grows, below, 0, d + 1)
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
            if waits_first(g, key):
                offer(g, key, parent, kind, at, i, d)
                break
    return in_subtree_order(g)


__all__ = ["CONTINUATION", "grow"]

"""The compiled loops of the host's drafting state (numba): the successor table's hash of pair
rows and its updates (lp/lookahead/successors.py), the best-first growth of a step's tree
(lp/lookahead/grow.py) and the counting of the drafts' rates (lp/lookahead/rates.py).

A step runs them after its message is read, over a few hundred rows and nodes each: in Python
they cost about a microsecond per row or node, and whole-array ops cannot express a best-first
search. They live in one module because numba's on-disk cache of a function does not notice a
change in another module's function it calls: one file, one cache that goes stale together.
numba installs as wheels (no toolchain); each loop compiles once, at first use, into
__pycache__."""

from __future__ import annotations

import numpy as np
from numba import njit

NO_ROW = -(1 << 62)  # `find_row`'s answer where neither table has a row
STAGED_TOKEN = 1 << 62  # a staged token row's key (`stage_rows`), apart from every pair key
# a growth entry's kind: a successor row, a chain, a node's own row not yet looked up, or the text
# after an earlier occurrence of a node's token (FOLLOW + c: after c of its path's tokens too,
# at most MATCHED) (`grow_tree`)
ROW, CHAIN, LATER, FOLLOW = 0, 1, 2, 3
MATCHED = 2  # the path's tokens before a node that an earlier occurrence's must match, at most
WALK = 8  # earlier occurrences of a node's token searched for the longest match, after the newest


@njit(cache=True)
def slot(index: np.ndarray, key: int) -> int:
    """The slot of `key` in an open-addressing hash `index` `[size, 2]` of (non-negative int64
    key (-1: empty), value), size a power of two, or the empty slot where it would go. A slot's
    key and value share a cache line: a step probes a few hundred slots at random."""
    mask = len(index) - 1
    # Fibonacci hashing of the key's bits, then linear probing
    s = ((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)) & np.uint64(mask)
    i = np.int64(s)
    while index[i, 0] != key and index[i, 0] != -1:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def find_row(table: np.ndarray, index: np.ndarray, stage: np.ndarray, before: int, token: int) -> int:
    """Where the successors of `token` after `before` are (lp/lookahead/successors.py): the pair
    row of (`before`, `token`), else `token`'s own row, else NO_ROW; each looked up first among
    the rows staged but not yet written (`stage_rows`: row j as len(table) + j), then in
    `index` (pair key -> p: pair row p as -p - 1) or `table`."""
    if before >= 0:
        key = (before << 32) | token  # pair_key
        i = slot(stage, key)
        if stage[i, 0] >= 0:
            return len(table) + stage[i, 1]
        i = slot(index, key)
        if index[i, 0] >= 0:
            return -index[i, 1] - 1
    if not 0 <= token < len(table):
        return NO_ROW
    i = slot(stage, STAGED_TOKEN | token)
    if stage[i, 0] >= 0:
        return len(table) + stage[i, 1]
    return token if table[token, 0] >= 0 else NO_ROW


@njit(cache=True)
def successor(table: np.ndarray, pairs: np.ndarray, staged: np.ndarray, row: int, r: int) -> int:
    """The rank-r successor in `find_row`'s row (`staged`: the staged rows, input token first)."""
    if row < 0:
        return np.int64(pairs[-row - 1, r])
    if row < len(table):
        return np.int64(table[row, r])
    return staged[row - len(table), 1 + r]


@njit(cache=True)
def stage_rows(stage: np.ndarray, rows: np.ndarray, row_keys: np.ndarray, first: int, vocab: int) -> None:
    """Stage rows `[n, 1 + k]` for `update_rows` (same arguments; successors are tokens, >= 0) in
    the empty hash `stage` (room for two keys a row): every key they write, its pair key or its
    input token's, maps to the last row that writes it, so `find_row` reads the table as
    `update_rows` would leave it. A step's rows are written into the table's scattered lines
    after the next forward is queued (`SuccessorTable.apply`); staged, they cost the step a few
    probes of a small hash each."""
    n, m = rows.shape[0], len(row_keys)
    if first >= 0 and n:
        _put_key(stage, first, 0)
    for j in range(m):
        _put_key(stage, row_keys[j], n - m + j)
    for j in range(n):
        if not 0 <= rows[j, 0] < vocab:
            raise ValueError("a successor row's input token is not in the table's vocabulary")
        _put_key(stage, STAGED_TOKEN | rows[j, 0], j)


@njit(cache=True)
def _put_key(index: np.ndarray, key: int, value: int) -> None:
    """`index`'s `key` maps to `value` now."""
    i = slot(index, key)
    index[i, 0], index[i, 1] = key, value


@njit(cache=True)
def successor_rates(hits: np.ndarray) -> np.ndarray:
    """The estimated chance that the rank-r successor is the next token, for r < k, from the
    counts `hits` (`SuccessorTable.hits`), made non-increasing in r (what the best-first search
    relies on)."""
    k = len(hits) - 1
    total = hits.sum()
    rates = np.empty(k, np.float64)
    for r in range(k):
        rates[r] = hits[r] / total
        if r and rates[r] > rates[r - 1]:
            rates[r] = rates[r - 1]
    return rates


@njit(cache=True)
def set_pair(pairs: np.ndarray, index: np.ndarray, n_pairs: int, key: int, rows, j: int) -> int:
    """Key `key`'s pair row is now row j's successors (a new key takes the next pair row)."""
    i = slot(index, key)
    if index[i, 0] < 0:
        index[i, 0], index[i, 1] = key, n_pairs
        n_pairs += 1
    copy_row(pairs, index[i, 1], rows, j)
    return n_pairs


@njit(cache=True)
def copy_row(to: np.ndarray, i: int, rows: np.ndarray, j: int) -> None:
    """`to[i] = rows[j, 1:]` (an input token's successors), element by element: numba's row views
    and slice assignment cost about a hundred nanoseconds a row, twenty times the copy."""
    for c in range(to.shape[1]):
        to[i, c] = rows[j, 1 + c]


@njit(cache=True)
def update_rows(
    table: np.ndarray,
    pairs: np.ndarray,
    index: np.ndarray,
    n_pairs: int,
    rows: np.ndarray,
    row_keys: np.ndarray,
    first: int,
) -> int:
    """`SuccessorTable.update`'s writes, in its order; the number of pair rows after them."""
    n, m = rows.shape[0], len(row_keys)
    if first >= 0:
        n_pairs = set_pair(pairs, index, n_pairs, first, rows, 0)
    for j in range(m):
        n_pairs = set_pair(pairs, index, n_pairs, row_keys[j], rows, n - m + j)
    for j in range(n):
        if not 0 <= rows[j, 0] < len(table):
            raise ValueError("a successor row's input token is not in the table's vocabulary")
        copy_row(table, rows[j, 0], rows, j)
    return n_pairs


@njit(cache=True)
def rehash(index: np.ndarray, size: int) -> np.ndarray:
    """The same keys and values in a hash index (`slot`) of `size` slots."""
    new = np.full((size, 2), -1, np.int64)
    for i in range(len(index)):
        if index[i, 0] >= 0:
            j = slot(new, index[i, 0])
            new[j, 0], new[j, 1] = index[i, 0], index[i, 1]
    return new


@njit(cache=True)
def count_ranks(
    table: np.ndarray, pairs: np.ndarray, index: np.ndarray, stage: np.ndarray, staged: np.ndarray,
    tokens: np.ndarray, hits: np.ndarray,
) -> None:  # fmt: skip
    """`SuccessorTable.observe`: each token's rank in its predecessor's row (k: none), counted."""
    k = table.shape[1]
    for j in range(2, len(tokens)):
        row = find_row(table, index, stage, tokens[j - 2], tokens[j - 1])
        if row == NO_ROW:
            continue
        r = 0
        while r < k and successor(table, pairs, staged, row, r) != tokens[j]:
            r += 1
        hits[r] += 1


@njit(cache=True)
def observe_step(
    tree, parents, labels, accepted, rate_hits, offered, chances,
    table, pairs, index, stage, seq, n, new, hits, rows, row_keys, first,
):  # fmt: skip
    """A step's outcome counted and recorded in one call, in `DraftSources.observe`'s order:
    the grown tree's nodes against its accepted draft tokens (`count_rates`), each new token's
    rank in its predecessor's successor row (`count_ranks`, over the sequence's last two tokens
    `seq[n-2:n]` and the committed `new`, on the table the drafts used: the last step's rows
    written, `stage` empty), then the step's successor rows staged (`stage_rows`; written later,
    `SuccessorTable.apply`). One call rather than three: each costs microseconds of dispatch
    and Python between the message read and the next forward."""
    count_rates(tree, parents, labels, accepted, rate_hits, offered, chances)
    a = max(n - 2, 0)
    tail = np.empty(n - a + len(new), np.int64)
    for j in range(n - a):
        tail[j] = seq[a + j]
    for j in range(len(new)):
        tail[n - a + j] = new[j]
    count_ranks(table, pairs, index, stage, rows, tail, hits)  # the stage is empty: reads no row of `rows`
    stage_rows(stage, rows, row_keys, first, len(table))


@njit(cache=True)
def _push(keys: np.ndarray, entries: np.ndarray, h: int, key: float, e: int) -> int:
    """Add entry e of negated chance `key` to a heap of h entries; the new size. The heap keeps
    each entry's key beside it (`keys[j]`, `entries[j]`): a comparison reads no other array. An
    entry leaves before another if likelier, or as likely and offered first (a lower e)."""
    i = h
    while i > 0:  # a hole moves up from the end until the parent leaves first
        p = (i - 1) >> 1
        if keys[p] < key or (keys[p] == key and entries[p] < e):
            break
        keys[i], entries[i] = keys[p], entries[p]
        i = p
    keys[i], entries[i] = key, e
    return h + 1


@njit(cache=True)
def _wait(keys, entries, h, entry, n, neg, parent, kind, seq, i, d):
    """Entry n (chance `-neg`; parent node, kind, row or chain, position i in it, depth) waits in
    the heap of h entries: the new heap size and entry count."""
    entry[n, 0], entry[n, 1], entry[n, 2], entry[n, 3], entry[n, 4] = parent, kind, seq, i, d
    return _push(keys, entries, h, neg, n), n + 1


@njit(cache=True)
def _pop(keys: np.ndarray, entries: np.ndarray, h: int) -> int:
    """Remove the first entry of a heap of h entries (h - 1 remain): the last one's hole moves
    down from the top."""
    top = entries[0]
    h -= 1
    key, e = keys[h], entries[h]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= h:
            break
        if c + 1 < h and (keys[c + 1] < keys[c] or (keys[c + 1] == keys[c] and entries[c + 1] < entries[c])):
            c += 1
        if not (keys[c] < key or (keys[c] == key and entries[c] < e)):
            break
        keys[i], entries[i] = keys[c], entries[c]
        i = c
    keys[i], entries[i] = key, e
    return top


@njit(cache=True)
def _matched(text, n_text, tokens, parents, parent, at):
    """How many of the tokens before a node (its parent's, up the tree to x0, then the text's
    before x0: `text[n_text - 1]` is x0) the tokens before position `at` of the text match, at
    most MATCHED."""
    m, p, back = 0, parent, 0
    while m < MATCHED and at - 1 - m >= 0:
        if p >= 0:
            up, p = tokens[p], parents[p]
        else:
            if n_text - 1 - back < 0:
                break
            up, back = text[n_text - 1 - back], back + 1
        if text[at - 1 - m] != up:
            break
        m += 1
    return m


@njit(cache=True)
def grow_tree(
    budget, x0, before, depth, flat, starts, sources, chances, hits, table, pairs, index, staged, stage,
    text, n_text, latest, earlier, follow, follow_source,
):  # fmt: skip
    """`lp.lookahead.grow.grow`'s loop: the tree's nodes in subtree order (tokens, parents, labels),
    each one's place in the growth, and the node counts of the root subtrees."""
    # each token's newest position before the last (`latest`, -1: none; its follower is known)
    # and each position's token's one before (`earlier`), brought up to date with the text's new
    # tokens (`latest[-1]`: the positions seen)
    if follow:
        if n_text - 1 > len(earlier):
            raise ValueError("the text is longer than its index of earlier occurrences")
        if follow_source + MATCHED >= chances.shape[0] or follow > chances.shape[1]:
            raise ValueError("the text's continuations have no rows of chances, or are longer than them")
        for e in range(latest[-1], n_text - 1):
            if not 0 <= text[e] < len(latest) - 1:
                raise ValueError("a text token is not in the occurrences' vocabulary")
            earlier[e] = latest[text[e]]
            latest[text[e]] = e
        latest[-1] = max(latest[-1], n_text - 1)
    rates = successor_rates(hits)
    k, n_chains, D = len(rates), len(starts) - 1, chances.shape[1]
    q0 = rates[0] if k else 0.0
    tokens = np.empty(budget, np.int64)
    parents = np.empty(budget, np.int64)
    roots = np.empty(budget, np.int64)
    labels = np.empty(budget, np.int64)
    made = np.empty(budget, np.float64)  # each node's chance (negated): the best estimate, it came first
    first_child = np.full(budget + 1, -1, np.int64)  # of node p at p + 1 (x0 at 0)
    sibling_of = np.full(budget, -1, np.int64)
    for c in range(n_chains):
        if not (0 <= sources[c] < chances.shape[0] and starts[c + 1] - starts[c] <= D):
            raise ValueError("a chain's source has no row of chances, or is longer than that row")
    # entries (parent, kind, row or chain, position i in it, depth), kept in arrival order; a heap
    # of their indices keyed by negated chance (`_push`). A chain offers each of its tokens once
    # at most, a row (x0's, a new node's) each of its k
    cap = len(flat) + (budget + 1) * k + 1 + (2 * budget + 2 if follow else 0)
    entry = np.empty((cap, 5), np.int64)
    keys, entries = np.empty(cap, np.float64), np.empty(cap, np.int64)
    h = n = size = 0

    for c in range(n_chains):
        if starts[c + 1] > starts[c]:
            h, n = _wait(keys, entries, h, entry, n, -chances[sources[c], 0], -1, CHAIN, c, 0, 1)
    if k and depth >= 1:
        row = find_row(table, index, stage, before, x0)
        if row != NO_ROW:
            h, n = _wait(keys, entries, h, entry, n, -q0, -1, ROW, row, 0, 1)

    while h:
        neg = keys[0]
        e = _pop(keys, entries, h)
        h -= 1
        parent, kind, seq, i, d = entry[e, 0], entry[e, 1], entry[e, 2], entry[e, 3], entry[e, 4]
        if kind == LATER:  # node `parent`'s own row, looked up once it is the likeliest entry
            up = parents[parent]
            seq, kind = find_row(table, index, stage, tokens[up] if up >= 0 else x0, tokens[parent]), ROW
            if seq == NO_ROW:
                continue
        while True:  # an entry that would leave next is taken at once, without waiting
            if kind == ROW:
                token = successor(table, pairs, staged, seq, i)
            elif kind >= FOLLOW:
                token = text[seq + i]
            else:
                token = flat[starts[seq] + i]
            node = first_child[parent + 1]
            while node >= 0 and tokens[node] != token:
                node = sibling_of[node]
            new = node < 0
            if new:
                if size >= budget:
                    h = 0
                    break
                node = size
                size += 1
                tokens[node], parents[node] = token, parent
                roots[node] = node if parent < 0 else roots[parent]
                if kind == ROW:
                    labels[node] = -1
                else:
                    labels[node] = (follow_source + kind - FOLLOW if kind >= FOLLOW else sources[seq]) * D + i
                made[node] = neg
                sibling_of[node] = first_child[parent + 1]
                first_child[parent + 1] = node
            # a node is grown on once, where it is made, from its own row: looked up where it may
            # go on at once, else waiting as LATER (most waiting rows never leave the heap, and
            # each lookup reads a random line or two of the table); a row that proves missing
            # leaves no node, so the tree is the same as with every row looked up here
            below, grows = NO_ROW, LATER if k and d < depth and new else -1
            if follow and new and kind < FOLLOW and d < depth and token < len(latest) - 1 and latest[token] >= 0:
                # the text after the token's occurrence whose tokens before it match the node's
                # path longest (of the newest few; the newest of those), each match length a
                # source of its own: more matched tokens predict better
                at, best, matched, walk = latest[token], -1, -1, 0
                while at >= 0 and walk <= WALK and matched < MATCHED:
                    m = _matched(text, n_text, tokens, parents, parent, at)
                    if m > matched:
                        best, matched = at, m
                    at, walk = earlier[at], walk + 1
                chance = neg * chances[follow_source + matched, 0]
                h, n = _wait(keys, entries, h, entry, n, chance, node, FOLLOW + matched, best + 1, 0, d + 1)
            child = neg * q0
            has_sibling = kind == ROW and i + 1 < k
            sibling = neg / rates[i] * rates[i + 1] if has_sibling else 0.0
            if grows >= 0 and kind == ROW and (not has_sibling or child < sibling):
                below = find_row(table, index, stage, tokens[parent] if parent >= 0 else x0, token)
                grows = ROW if below != NO_ROW else -1
            if kind == ROW:
                # a row offers its next sibling, then the node's successors: the likelier of the
                # two goes on at once when nothing waiting is as likely (the sibling first at equal
                # chances, as it came first), the other waits
                if grows == ROW:  # looked up only where the node's successors go before its sibling
                    if has_sibling:
                        h, n = _wait(keys, entries, h, entry, n, sibling, parent, ROW, seq, i + 1, d)
                    if h and keys[0] <= child:
                        h, n = _wait(keys, entries, h, entry, n, child, node, ROW, below, 0, d + 1)
                        break
                    parent, seq, i, d, neg = node, below, 0, d + 1, child
                elif has_sibling:
                    if h and keys[0] <= sibling:
                        h, n = _wait(keys, entries, h, entry, n, sibling, parent, ROW, seq, i + 1, d)
                        if grows >= 0:
                            h, n = _wait(keys, entries, h, entry, n, child, node, grows, below, 0, d + 1)
                        break
                    if grows >= 0:
                        h, n = _wait(keys, entries, h, entry, n, child, node, grows, below, 0, d + 1)
                    i, neg = i + 1, sibling
                else:
                    break
                continue
            if grows >= 0:
                h, n = _wait(keys, entries, h, entry, n, child, node, grows, below, 0, d + 1)
            # a chain goes on from its node's chance: another source's, if it made the node first;
            # the text's continuation only while it makes new nodes (an old one grows on from its
            # own maker)
            if kind >= FOLLOW:
                source = follow_source + kind - FOLLOW
                if not new or i + 1 >= follow or seq + i + 1 >= n_text or d >= depth:
                    break
            else:
                source = sources[seq]
                if starts[seq] + i + 1 >= starts[seq + 1]:
                    break
            neg = (neg if new else made[node]) * chances[source, i + 1]
            parent, i, d = node, i + 1, d + 1
            if h and keys[0] <= neg:
                h, n = _wait(keys, entries, h, entry, n, neg, parent, kind, seq, i, d)
                break

    # subtree order: nodes grouped by their root (roots by index), each group in growth order
    count = np.zeros(size, np.int64)
    for v in range(size):
        count[roots[v]] += 1
    offset = np.zeros(size, np.int64)
    total = 0
    groups = 0
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
    out_tokens = np.empty(size, np.int64)
    out_parents = np.empty(size, np.int64)
    out_labels = np.empty(size, np.int64)
    for j in range(size):
        v = order[j]
        out_tokens[j], out_labels[j] = tokens[v], labels[v]
        out_parents[j] = where[parents[v]] if parents[v] >= 0 else -1
    out_groups = np.empty(groups, np.int64)
    g = 0
    for r in range(size):
        if count[r]:
            out_groups[g] = count[r]
            g += 1
    return out_tokens, out_parents, out_labels, order, out_groups


@njit(cache=True)
def count_rates(tokens, parents, labels, accepted, hits, offered, chances):
    """`DraftRates.observe`'s counts: labelled nodes whose parent was right are offered, and hit
    where right too; their chances updated."""
    n = len(tokens)
    right = np.zeros(n + 1, np.bool_)  # node v's at v + 1; x0's at 0
    right[0] = True
    node = -1
    for token in accepted:  # the accepted path: the child of the last node with the next token
        child = -1
        for v in range(n):
            if parents[v] == node and tokens[v] == token:
                child = v
                break
        if child < 0:
            break
        right[child + 1] = True
        node = child
    for v in range(n):
        label = labels[v]
        if label >= 0 and right[parents[v] + 1]:
            offered[label] += 1
            if right[v + 1]:
                hits[label] += 1
            chances[label] = hits[label] / offered[label]

"""The tree grown best first across drafts, recycled successors and the text's continuations
(lp/lookahead/grow.py), against a plain heap-and-dicts reference (tests/reference_grow.py) on
random sources with tied chances."""

from __future__ import annotations

import numpy as np
import pytest

from lp.errors import LPError
from lp.lookahead.sources import CONTINUATION_SOURCE, SOURCES
from lp.lookahead.successors import SuccessorTable, rates
from tests.reference_grow import DictTable, chains_of, lp_grow, reference_grow, subtree_order


def random_sources(rng: np.random.Generator, vocab: int, k: int):
    """A successor table (and its dict twin) from random updates with pair keys, random
    observed tokens, and random drafts with chances of a few distinct values (ties)."""
    table, twin = SuccessorTable(k, vocab), DictTable(k)
    for _ in range(int(rng.integers(0, 4))):
        n = int(rng.integers(1, 25))
        tokens = rng.integers(0, vocab, n)
        rows = np.concatenate([tokens[:, None], np.stack([rng.permutation(vocab)[:k] for _ in range(n)])], axis=1)
        m = int(rng.integers(0, n))
        keys = (rng.integers(0, vocab, m) << 32 | tokens[n - m :]).astype(np.int64)
        first = int(rng.integers(0, vocab)) << 32 | int(tokens[0]) if rng.random() < 0.5 else -1
        table.update(rows, keys, first)
        twin.update(rows, keys.tolist(), first)
        seen = rng.integers(0, vocab, int(rng.integers(0, 12))).tolist()
        table.observe(seen)
        twin.observe(seen)
    drafts = [rng.integers(0, vocab, int(rng.integers(0, 6))).tolist() for _ in range(int(rng.integers(0, 8)))]
    sources = rng.integers(0, SOURCES, len(drafts)).tolist()
    chances = rng.choice([0.25, 0.5, 0.5, 0.75, 1.0], size=(SOURCES, 6))
    return table, twin, drafts, sources, chances


@pytest.mark.parametrize("seed", range(300))
def test_growth_equals_the_reference(seed):
    """Same nodes in the same order and labels, same subtree layout, same tables."""
    rng = np.random.default_rng(seed)
    vocab, k = int(rng.integers(8, 40)), int(rng.integers(1, 9))
    table, twin, drafts, sources, chances = random_sources(rng, vocab, k)
    for t in range(vocab):
        assert table.row(-1, t) == (list(twin.next[t]) if t in twin.next else None)
    assert table.hits.tolist() == twin.hits and rates(table).tolist() == twin.rates()
    budget, depth = int(rng.integers(0, 60 if seed % 4 else 400)), int(rng.integers(1, 8))
    x0, before = int(rng.integers(vocab)), int(rng.integers(-1, vocab))
    with_table = rng.random() < 0.8
    # the text before x0 (its last token the pair rows' context); half the growths follow it too
    text = [*rng.integers(0, vocab, int(rng.integers(0, 30))).tolist(), before, x0] if before >= 0 else [x0]
    follow = int(rng.integers(1, chances.shape[1] + 1)) if seed % 2 else 0
    got = lp_grow(
        budget, text, depth, chains_of(drafts, sources), chances, table if with_table else None, follow, vocab
    )
    tokens, parents, labels = reference_grow(
        budget, x0, depth, drafts, sources, chances, twin if with_table else None, before, text, follow,
        CONTINUATION_SOURCE,
    )  # fmt: skip
    want = subtree_order(tokens, parents)
    assert got.tree.tokens.tolist() == want.tokens.tolist() and got.tree.parents == want.parents
    assert got.tree.groups() == want.groups()
    # the growth order (`order`: each node's place in it) gives back the reference's nodes in order
    made = np.argsort(got.order)  # the nodes in the order they were made
    assert got.tree.tokens[made].tolist() == tokens
    assert [got.order[p] if p >= 0 else -1 for p in got.parents[made].tolist()] == parents
    assert got.labels[made].tolist() == labels


def test_a_chain_beats_a_less_likely_successor():
    """A chain's deep token with a high rate comes before a successor path's first token with a
    lower one, and each node's chance is its parent's times its own rate."""
    table = SuccessorTable(2, 16)
    table.update(np.asarray([[0, 7, 8], [7, 9, 10]]))
    table.hits[:] = [4, 2, 4]  # rates 0.4, 0.2
    chances = np.asarray([[0.9, 0.9, 0.3]])
    got = lp_grow(4, [0], 3, chains_of([(1, 2, 3)], [0]), chances, table)
    # 1 (0.9), 1-2 (0.81), 7 (0.4), 1-2-3 (0.243); not 8 (0.2) nor 7-9 (0.16)
    made = np.argsort(got.order)
    assert got.tree.tokens[made].tolist() == [1, 2, 7, 3]
    assert got.labels[made].tolist() == [0, 1, -1, 2]
    assert got.tree.tokens.tolist() == [1, 2, 3, 7] and got.tree.parents == (-1, 0, 1, -1)  # subtree order


def test_a_node_goes_on_as_the_text_went_on_after_its_token():
    """Below a recycled node, the text after an occurrence of its token before x0, at most
    `length` tokens: of its newest few, the one whose tokens before it match the node's path
    (then the text before x0) longest, labelled by the match's length (CONTINUATION_SOURCE + 0 to
    MATCHED; x0's own position may go on from it); without continuations, none."""
    chances = np.full((SOURCES, 3), 0.5)
    chances[CONTINUATION_SOURCE : CONTINUATION_SOURCE + 3] = [[0.8, 0.6, 0.5], [0.85, 0.7, 0.5], [0.87, 0.7, 0.5]]
    label = 3 * CONTINUATION_SOURCE  # a continuation's first token, its match of 0 tokens

    def grown(text: list[int], length: int = 2) -> tuple[list[int], list[int]]:
        table = SuccessorTable(1, 16)
        table.update(np.asarray([[text[-1], 5]]))  # x0, then 5 (rank 0, rate 0.9)
        table.hits[:] = [9, 1]
        got = lp_grow(8, text, 3, chances=chances, table=table, continuation_len=length, vocab=16)
        made = np.argsort(got.order)
        return got.tree.tokens[made].tolist(), got.labels[made].tolist()

    # 5 at 0, 3 and 6: only at 3 after x0's token 1, so 3 7 go on from a match of 1
    assert grown([5, 2, 1, 5, 3, 7, 5, 4, 1]) == ([5, 3, 7], [-1, label + 3, label + 4])
    # never after 2: the newest, 6, goes on 4 and then x0 itself (a match of 0)
    assert grown([5, 2, 1, 5, 3, 7, 5, 4, 2]) == ([5, 4, 2], [-1, label, label + 1])
    # after 9 1 (the text's token before x0, and x0) at 2, after 2 1 at 7: 2 matches longer
    assert grown([9, 1, 5, 3, 7, 2, 1, 5, 4, 8, 9, 1]) == ([5, 3, 7], [-1, label + 6, label + 7])
    table = SuccessorTable(1, 16)
    table.update(np.asarray([[1, 5]]))
    assert lp_grow(8, [5, 2, 1, 5, 3, 7, 5, 4, 1], 3, chances=chances, table=table).tree.tokens.tolist() == [5]


def test_leaf_paths_come_in_growth_order():
    table = SuccessorTable(2, 16)
    table.update(np.asarray([[1, 2, 3], [2, 4, 5]]))
    table.hits[:] = [6, 3, 1]  # rates 0.6, 0.3
    got = lp_grow(4, [1], 3, table=table)
    # made: 2 (.6), 2-4 (.36), 3 (.3), 2-5 (.18)
    assert got.leaf_paths() == [(2, 4), (3,), (2, 5)]


def test_chains_need_their_rows_of_chances():
    with pytest.raises(LPError, match="row of chances"):
        lp_grow(4, [1], 3, chains_of([(1, 2, 3)], [2]), np.full((2, 3), 0.5))
    with pytest.raises(LPError, match="longer"):
        lp_grow(4, [1], 3, chains_of([(1, 2, 3, 4)], [0]), np.full((1, 3), 0.5))
    with pytest.raises(LPError, match="continuations have no rows"):
        lp_grow(4, [1], 3, chances=np.full((2, 3), 0.5), continuation_len=2)

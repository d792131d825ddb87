"""The drafts' online acceptance rates (lp/lookahead/rates.py) and the one tree grown best first
across all draft sources by those rates (TreeBuilder.grow with chains, lp/decode/policy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.decode.policy import WINDOW_SOURCE, step_builder
from lp.lookahead.drafts import TextIndex
from lp.lookahead.pool import NGramPool
from lp.lookahead.rates import PRIOR_HITS, PRIOR_OFFERED, DraftRates
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import TreeBuilder


def test_rates_count_nodes_whose_parent_was_right():
    rates = DraftRates(2, 3)
    tree = TreeBuilder(10)
    # source 0: (1, 2, 3); source 1: (1, 4) shares node 1, then (5,)
    tree.grow(0, {}, [], 3, [((1, 2, 3), [0.9, 0.8, 0.7], rates.label(0)), ((1, 4), [0.5, 0.5], rates.label(1))])
    tree_labels = dict(zip(zip(tree.parents, tree.tokens), tree.labels))
    assert tree_labels == {(-1, 1): 0, (0, 2): 1, (1, 3): 2, (0, 4): 4}
    rates.offer(tree)
    rates.observe([1, 2])  # 1 and 2 were right, 3 was not; 4 (parent right) was not
    offered = np.asarray(rates.offered) - PRIOR_OFFERED
    hits = np.asarray(rates.hits) - PRIOR_HITS
    assert offered.tolist() == [1, 1, 1, 0, 1, 0]
    assert hits.tolist() == [1, 1, 0, 0, 0, 0]
    assert rates.chances[0] == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    rates.offer(tree)
    rates.observe([])  # nothing accepted: only the roots were offered (their parent is x0)
    assert (np.asarray(rates.offered) - PRIOR_OFFERED).tolist() == [2, 1, 1, 0, 1, 0]


def test_growth_takes_the_likeliest_node_of_any_source():
    """A chain's deep token with a high rate comes before a successor path's first token with a
    lower one, and each node's chance is its parent's times its own rate."""
    table = {0: [7, 8], 7: [9, 10]}
    tree = TreeBuilder(4)
    tree.grow(0, table, [0.4, 0.2], 3, [((1, 2, 3), [0.9, 0.9, 0.3], 0)])
    # 1 (0.9), 1-2 (0.81), 7 (0.4), 1-2-3 (0.243); not 8 (0.2) nor 7-9 (0.16)
    assert list(zip(tree.parents, tree.tokens)) == [(-1, 1), (0, 2), (-1, 7), (1, 3)]
    assert tree.labels == [0, 1, -1, 2]


def setup_sources():
    pool = NGramPool(3, 4)
    pool.add(5, (1, 1))
    table = SuccessorTable(2)
    table.update(np.asarray([[5, 7, 8], [7, 9, 10], [1, 7, 9]], dtype=np.int64))
    return pool, table, TextIndex([4, 5])


def test_the_merged_tree_orders_sources_by_their_counted_rates():
    """The pool's n-gram (1, 1) and the successor paths from x0 = 5 (7 then 9, or 8; table rates
    1/3) share one best-first order: a pool with rate 1/2 goes first, one counted down to 1/10
    after the successor paths."""
    pool, table, text = setup_sources()
    cfg = DecodeConfig(N=3, G=1)
    rates = DraftRates(WINDOW_SOURCE + 1, cfg.max_draft)
    got = step_builder(cfg, 5, pool, text, table, rates)
    # 1 (1/2), 7 (1/3), 8 (1/3), (1, 1) (1/4), 1's successor 7 (1/6)
    assert list(zip(got.parents, got.tokens)) == [(-1, 1), (-1, 7), (-1, 8), (0, 1), (0, 7)]
    tree = got.tree()
    assert tree.tokens.tolist() == [1, 1, 7, 7, 8] and tree.parents == (-1, 0, 0, -1, -1)
    pool_source = 7  # the pool's rank-0 n-grams (after 4 text and 3 context ranks)
    missed = TreeBuilder(1)  # a pool n-gram's first token, offered and wrong 8 times: 1 right of 10
    missed.grow(0, {}, [], 1, [((1,), [0.5], rates.label(pool_source))])
    for _ in range(8):
        rates.offer(missed)
        rates.observe([])
    got = step_builder(cfg, 5, pool, text, table, rates)
    # 7 (1/3), 8 (1/3), 7-9 (1/9), 7-10 (1/9), then 1 (1/10)
    assert list(zip(got.parents, got.tokens)) == [(-1, 7), (-1, 8), (0, 9), (0, 10), (-1, 1)]


def test_window_row_zero_is_a_draft():
    """A ready window's row 0 (its guesses of the tokens after x0) is a chain of its own."""
    from lp.lookahead import JacobiWindow

    window = JacobiWindow(4, 3, [1, 2, 3], seed=0)
    window.update(np.asarray([20, 21, 22, 23]))
    window.update(np.asarray([30, 31, 32, 33]))  # row 0 is the level before: 20 21 22 23
    assert window.ready
    pool, _, text = setup_sources()
    cfg = DecodeConfig(W=4, N=3, G=1, recycle=0)
    got = step_builder(cfg, 10, NGramPool(3, 1), text, None, window=window)
    assert list(zip(got.parents, got.tokens)) == [(-1, 21), (0, 22), (1, 23)]

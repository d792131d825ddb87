"""The drafts' online acceptance rates (lp/lookahead/rates.py) and the one tree grown best first
across all draft sources by those rates (lp/lookahead/drafts.py, lp/lookahead/grow.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.decode.drafter import NO_MEMORY
from lp.lookahead.drafts import step_drafts
from lp.lookahead.grow import grow
from lp.lookahead.pool import NGramPool
from lp.lookahead.rates import PRIOR_HITS, PRIOR_OFFERED, DraftRates
from lp.lookahead.sources import SOURCES
from lp.lookahead.successors import SuccessorTable, new_table
from lp.lookahead.text import TextIndex
from lp.lookahead.tree import DraftTree
from lp.lookahead.window import JacobiWindow
from tests.reference_grow import Grown, chains_of, lp_grow


def step_tree(
    cfg: DecodeConfig,
    budget: int,
    pool: NGramPool,
    text: TextIndex,
    table: SuccessorTable | None,
    rates: DraftRates,
    window: JacobiWindow | None = None,
) -> Grown:
    """The step's tree of `budget` nodes grown from these sources as the drafter grows it."""
    window = window or JacobiWindow(0, cfg.N, [0], 0)
    guesses = cfg.max_draft if window.rows.shape[1] > 1 and window.ready else 0
    context, frequent = cfg.pool_order == "context" and cfg.N > 2, cfg.pool_order == "frequent"
    chains = step_drafts(
        text, pool, window, NO_MEMORY, cfg.draft_len, cfg.text_drafts, context, frequent, guesses, 0, 0
    )
    table = table or new_table(0, 1, 1)
    tokens, parents, labels, order, groups, _ = grow(text, chains, rates.chances, table, budget, cfg.max_draft, 0)
    return Grown(DraftTree(tokens, parents, groups), labels, order)


def made(grown: Grown) -> list[tuple[int, int]]:
    """(parent's token or -1, token) of each node, in the order the nodes were grown."""
    tree, order = grown.tree, np.argsort(grown.order).tolist()
    return [(int(tree.tokens[tree.parents[v]]) if tree.parents[v] >= 0 else -1, int(tree.tokens[v])) for v in order]


def test_rates_count_nodes_whose_parent_was_right():
    rates = DraftRates(2, 3)
    # source 0: (1, 2, 3); source 1: (1, 4) shares node 1
    tree = lp_grow(10, [0], 3, chains_of([(1, 2, 3), (1, 4)], [0, 1]), np.asarray([[0.9, 0.8, 0.7], [0.5, 0.5, 0.5]]))
    t = tree.tree
    tree_labels = dict(zip(zip(t.parents, t.tokens.tolist()), tree.labels.tolist()))
    assert tree_labels == {(-1, 1): 0, (0, 2): 1, (1, 3): 2, (0, 4): 4}
    rates.observe(
        t.tokens, t.parent_array, tree.labels, [1, 2]
    )  # 1 and 2 were right, 3 was not; 4 (parent right) was not
    offered = np.asarray(rates.offered) - PRIOR_OFFERED
    hits = np.asarray(rates.hits) - PRIOR_HITS
    assert offered.tolist() == [1, 1, 1, 0, 1, 0]
    assert hits.tolist() == [1, 1, 0, 0, 0, 0]
    assert rates.chances[0] == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    rates.observe(
        t.tokens, t.parent_array, tree.labels, []
    )  # nothing accepted: only the roots were offered (their parent is x0)
    assert (np.asarray(rates.offered) - PRIOR_OFFERED).tolist() == [2, 1, 1, 0, 1, 0]


def setup_sources():
    pool = NGramPool(3, 4)
    pool.add(5, (1, 1))
    table = SuccessorTable(2, 16)
    table.update(np.asarray([[5, 7, 8], [7, 9, 10], [1, 7, 9]], dtype=np.int64))
    return pool, table, TextIndex([4, 5])


def test_the_merged_tree_orders_sources_by_their_counted_rates():
    """The pool's n-gram (1, 1) and the successor paths from x0 = 5 (7 then 9, or 8; table rates
    1/3) share one best-first order: a pool with rate 1/2 goes first, one counted down to 1/10
    after the successor paths."""
    pool, table, text = setup_sources()
    cfg = DecodeConfig(N=3, G=1)
    rates = DraftRates(SOURCES, cfg.max_draft)
    got = step_tree(cfg, 5, pool, text, table, rates)
    tree = got.tree
    # 1 (1/2), 7 (1/3), 8 (1/3), (1, 1) (1/4), 1's successor 7 (1/6)
    assert made(got) == [(-1, 1), (-1, 7), (-1, 8), (1, 1), (1, 7)]
    assert tree.tokens.tolist() == [1, 1, 7, 7, 8] and tree.parents == (-1, 0, 0, -1, -1)
    pool_source = 7  # the pool's rank-0 n-grams (after 4 text and 3 context ranks)
    # a pool n-gram's first token, offered and wrong 8 times: 1 right of 10
    missed = lp_grow(1, [0], 1, chains_of([(1,)], [pool_source]), rates.chances).tree
    for _ in range(8):
        rates.observe(missed.tokens, missed.parent_array, np.asarray([pool_source * cfg.max_draft]), [])
    got = step_tree(cfg, 5, pool, text, table, rates)
    # 7 (1/3), 8 (1/3), 7-9 (1/9), 7-10 (1/9), then 1 (1/10)
    assert made(got) == [(-1, 7), (-1, 8), (7, 9), (7, 10), (-1, 1)]


def test_window_row_zero_is_a_draft():
    """A ready window's row 0 (its guesses of the tokens after x0) is a chain of its own."""
    window = JacobiWindow(4, 3, [1, 2, 3], seed=0)
    window.update(np.asarray([20, 21, 22, 23]))
    window.update(np.asarray([30, 31, 32, 33]))  # row 0 is the level before: 20 21 22 23
    assert window.ready
    pool, _, text = setup_sources()
    cfg = DecodeConfig(W=4, N=3, G=1, successors=0)
    got = step_tree(cfg, 10, NGramPool(3, 1), text, None, DraftRates(SOURCES, cfg.max_draft), window)
    assert made(got) == [(-1, 21), (21, 22), (22, 23)]

"""The drafting policy: which candidates a step verifies, and the host-side sources they come from
(the Jacobi window, the n-gram pool, the text's own suffix matches, the successor table of
recycled top-k tokens), kept identical on every rank by feeding them the same merged outcomes."""

from __future__ import annotations

import numpy as np

from lp.config import DecodeConfig
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool
from lp.lookahead.drafts import TextIndex
from lp.lookahead.rates import DraftRates
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import Chain, DraftTree, TreeBuilder, pair_key
from lp.message import Outcome

# the draft sources whose acceptance rates are counted apart (DraftRates): the text drafts, the
# pool's context-matched and plain n-grams, the text drafts of x0's lone matches, each by rank
# (the last bucket takes the ranks after it), and the window's row 0
TEXT_RANKS, POOL_RANKS, LONE_RANKS = 4, 3, 2
KINDS = (TEXT_RANKS, POOL_RANKS, POOL_RANKS, LONE_RANKS)  # text, context-matched pool, pool, lone text
WINDOW_SOURCE = sum(KINDS)


class DraftSources:
    """One sequence's draft sources. `tree()` builds the next step's verification tree;
    `observe` feeds them a step's merged outcome (before the tokens join the text)."""

    def __init__(self, cfg: DecodeConfig, prompt_ids: list[int], vocab_size: int) -> None:
        W, N, G, budget = cfg.step_shape
        k = cfg.successors_sent
        if k > vocab_size:
            raise LPError(f"recycle={k} is more than the model's {vocab_size} tokens")
        self.cfg, self.N, self.G, self.budget = cfg, N, G, budget
        self.successors = SuccessorTable(k) if k else None
        self.window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        # the prompt's n-grams and text index: host work on the prompt's length, which the caller
        # times with the prefill (a GPU prefills meanwhile)
        self.pool = NGramPool(N, cfg.pool_capacity)
        self.rates = DraftRates(WINDOW_SOURCE + 1, cfg.max_draft)
        self._tree: TreeBuilder | None = None  # the last step's, until its outcome is counted
        self._drafted = DraftTree(np.zeros(0, dtype=np.int64), ())  # the last step's tree
        # `prepare`'s: the pair keys of x0's successor row and of the tree's nodes' (last first)
        self._keys: tuple[int, list[int]] = (-1, [])
        self._pending = 1  # tokens the next step re-feeds (the prompt's last; then the last commit)
        self.text = TextIndex(prompt_ids, indexed=cfg.drafts == "pool+text" and budget > 0, lone=cfg.text_match == 1)
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
            self.pool.flush()

    def tree(self) -> DraftTree:
        """The next step's verification tree (`step_builder`)."""
        builder = step_builder(
            self.cfg,
            self.cfg.tree_budget(self._pending),
            self.pool,
            self.text,
            successors=self.successors,
            rates=self.rates,
            window=self.window,
        )
        self._tree = builder if self.cfg.tree else None
        self._drafted = builder.tree()
        return self._drafted

    def prepare(self) -> None:
        """The part of `observe` that needs no outcome, done while the device computes the step's
        forward (lp/decode/loop.py: before the all-gather): the pool's queued n-grams land, the
        tree to count is offered to the rates, and the successor rows' pair keys are made
        (`_pair_keys`)."""
        self.pool.flush()
        if self._tree is not None:
            self.rates.offer(self._tree)
        if self.successors is not None:
            self._keys = self._pair_keys()

    def observe(self, outcome: Outcome, tokens: list[int]) -> None:
        """Feed a step's merged outcome (after `prepare`): the window's new level and its
        n-grams, the successor rows, then the committed `tokens` (and, with `pool_from_output`,
        the n-grams ending in them: free candidates, as in prompt lookup)."""
        out = self.text.tokens
        if self._tree is not None:
            self.rates.observe(outcome.tokens[: outcome.accepted])
            self._tree = None
        if self.window is not None:
            if self.G and self.window.ready:
                self.pool.add_rows(self.window.ngrams(out[-1], outcome.new))
            self.window.update(outcome.new)
        if self.successors is not None:
            self.successors.observe([*out[-2:], *tokens])  # the table the drafts used
            first, nodes = self._keys
            self.successors.update(outcome.successors, nodes, first)
        self.text.extend(tokens)
        self._pending = len(tokens)
        if self.G and self.cfg.pool_from_output:
            length = len(out)
            self.pool.add_sequence(out[max(length - len(tokens) - self.N + 1, 0) : length])

    def _pair_keys(self) -> tuple[int, list[int]]:
        """The pair keys (`pair_key`) of the step's successor rows whose input's
        predecessor is known (lp.message: x0's row, the columns', the tree's nodes' from the
        last to the first): x0's row's (-1 without a token before x0), then the nodes', each
        node's predecessor its parent (x0 for a root)."""
        out, tree = self.text.tokens, self._drafted
        first = pair_key(out[-2], out[-1]) if len(out) > 1 else -1
        parents = tree.parent_array
        before = np.where(parents >= 0, tree.tokens[parents], out[-1])
        return first, pair_key(before[::-1], tree.tokens[::-1]).tolist()


def source_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[list[tuple[int, ...]]]:
    """The step's drafts of each kind (KINDS), best first: the text's longest-suffix
    continuations (with `drafts="pool+text"`); with `order="context"` (the default), the pool's
    n-grams that start with the last two tokens (what follows them, N-2 tokens: two matched
    tokens predict better than one); the pool's n-grams under x0, newest (or most frequent)
    first; with `text_match=1`, the continuations of x0's lone matches (`TextIndex.lone_drafts`)."""
    out = text.tokens
    x0 = out[-1]
    text_on = cfg.drafts == "pool+text"
    texts = text.drafts(cfg.draft_len, cfg.text_drafts) if text_on else []
    context = (
        [t[1:] for t in pool.best(out[-2]) if t[0] == x0]
        if cfg.order == "context" and len(out) > 1 and pool.n > 2
        else []
    )
    lone = text.lone_drafts(cfg.draft_len, cfg.text_drafts) if text_on else []
    return [texts, context, pool.best(x0, cfg.order == "frequent"), lone]


def ranked_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[tuple[int, ...]]:
    """The step's drafts in one list, best first (`source_drafts` in order, duplicates dropped):
    the candidates of a tree without sharing (`tree=False`)."""
    return list(dict.fromkeys(d for drafts in source_drafts(cfg, pool, text) for d in drafts))


def draft_chains(
    cfg: DecodeConfig, pool: NGramPool, text: TextIndex, rates: DraftRates, window: JacobiWindow | None
) -> list[Chain]:
    """Every draft as a chain for TreeBuilder.grow, its tokens' chances its source's rates
    (`source_drafts`, then the window's row 0: its guesses of the next W-1 tokens)."""
    chains: list[Chain] = []
    source = 0
    for ranks, drafts in zip(KINDS, source_drafts(cfg, pool, text)):
        for r, draft in enumerate(drafts):
            s = source + min(r, ranks - 1)
            chains.append((draft, rates.chances[s], rates.label(s)))
        source += ranks
    if window is not None and window.ready and window.W > 1:
        chains.append(
            (window.rows[0, 1 : cfg.max_draft + 1].tolist(), rates.chances[WINDOW_SOURCE], rates.label(WINDOW_SOURCE))
        )
    return chains


def step_builder(
    cfg: DecodeConfig,
    budget: int,
    pool: NGramPool,
    text: TextIndex,
    successors: SuccessorTable | None,
    rates: DraftRates | None = None,
    window: JacobiWindow | None = None,
) -> TreeBuilder:
    """The step's verification tree as built (its `tree()`), within `budget` nodes. As a
    token tree (`cfg.tree`): the likeliest nodes of all drafts (`draft_chains`) and of the successor table's paths, by
    their estimated chances (`rates`: the drafts' counted acceptance; default: fresh ones).
    Without sharing: `ranked_drafts` in order, then the paths to the leaves of the budget's
    likeliest recycled nodes."""
    x0 = text.tokens[-1]
    builder = TreeBuilder(budget, cfg.tree)
    if not budget:
        return builder
    if cfg.tree:
        chains = draft_chains(cfg, pool, text, rates or DraftRates(WINDOW_SOURCE + 1, cfg.max_draft), window)
        if successors is not None:
            successors.grow(builder, x0, cfg.max_draft, chains, text.tokens[-2] if len(text.tokens) > 1 else -1)
        else:
            builder.grow(x0, {}, [], cfg.max_draft, chains)
        return builder
    for draft in ranked_drafts(cfg, pool, text):
        builder.add(draft)
        if builder.full:
            break
    if successors is not None and not builder.full:
        recycled = TreeBuilder(budget)
        successors.grow(recycled, x0, cfg.max_draft)
        for path in recycled.leaf_paths():  # each path to a leaf is a chain of its own
            builder.add(path)
    return builder

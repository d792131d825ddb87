"""The drafting policy: which candidates a step verifies, and the host-side sources they come from
(the Jacobi window, the n-gram pool, the text's own suffix matches, the successor table of
recycled top-k tokens), kept identical on every rank by feeding them the same merged outcomes."""

from __future__ import annotations

import numpy as np

from lp.config import DecodeConfig
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool
from lp.lookahead.drafts import TextIndex, as_tuples, step_drafts
from lp.lookahead.grow import Chains, Grown, grow
from lp.lookahead.rates import DraftRates
from lp.lookahead.successors import SuccessorTable, observe_step
from lp.lookahead.tree import DraftTree, TreeBuilder, pair_key
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
        # every step keys at most a row per tree node and x0's
        self.successors = SuccessorTable(k, vocab_size, cfg.max_new_tokens * (budget + 1) // 4) if k else None
        self.window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        # the prompt's n-grams and text index: host work on the prompt's length, which the caller
        # times with the prefill (a GPU prefills meanwhile)
        self.pool = NGramPool(N, cfg.pool_capacity)
        self.rates = DraftRates(WINDOW_SOURCE + 1, cfg.max_draft)
        self._grown: Grown | None = None  # the last step's growth, until its outcome is counted
        self._drafted = DraftTree(np.zeros(0, dtype=np.int64), ())  # the last step's tree
        # `prepare`'s: the pair keys of x0's successor row and of the tree's nodes' (last first)
        self._keys: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))
        self.text = TextIndex(
            prompt_ids,
            indexed=cfg.drafts == "pool+text" and budget > 0,
            lone=cfg.text_match == 1,
            room=len(prompt_ids) + cfg.max_new_tokens,
        )
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
            self.pool.flush()

    def tree(self, pending: int) -> DraftTree:
        """The next step's verification tree (`step_tree`), for a step that re-feeds `pending`
        tokens (its tree gets what they leave of a `step_limit`)."""
        self._drafted, self._grown = step_tree(
            self.cfg,
            self.cfg.tree_budget(pending),
            self.pool,
            self.text,
            successors=self.successors,
            rates=self.rates,
            window=self.window,
        )
        return self._drafted

    def prepare(self) -> None:
        """The part of `observe` that needs no outcome, done while the device computes the step's
        forward (lp/decode/loop.py: before the all-gather): the pool's queued n-grams land, and
        the successor rows' pair keys are made (`_pair_keys`)."""
        self.pool.flush()
        if self.successors is not None:
            self._keys = self._pair_keys()

    def observe(self, outcome: Outcome, tokens: list[int]) -> None:
        """Feed a step's merged outcome (after `prepare`): the window's new level and its
        n-grams, the successor rows, then the committed `tokens` (and, with `pool_from_output`,
        the n-grams ending in them: free candidates, as in prompt lookup)."""
        grown, self._grown = self._grown, None
        new = np.asarray(tokens, dtype=np.int64)
        if self.successors is not None:
            # before the tokens join the text: x0, the token before it and the new ones are
            # counted on the table the drafts used, then the step's rows land
            first, nodes = self._keys
            observe_step(self.successors, self.rates, grown, outcome, self.text, new, nodes, first)
        elif grown is not None:
            self.rates.observe(grown, outcome.tokens[: outcome.accepted])
        if self.window is not None:
            if self.G and self.window.ready:
                self.pool.add_rows(self.window.ngrams(self.text.tokens[-1], outcome.new))
            self.window.update(outcome.new)
        self.text.extend(new)
        out, n = self.text.tokens, len(tokens)
        if self.G and self.cfg.pool_from_output:  # the n-grams that end in the new tokens
            self.pool.add_sequence(out[-(n + self.N - 1) :])

    def _pair_keys(self) -> tuple[int, np.ndarray]:
        """The pair keys (`pair_key`) of the step's successor rows whose input's
        predecessor is known (lp.message: x0's row, the columns', the tree's nodes' from the
        last to the first): x0's row's (-1 without a token before x0), then the nodes', each
        node's predecessor its parent (x0 for a root)."""
        out, tree = self.text.tokens, self._drafted
        first = pair_key(out[-2], out[-1]) if len(out) > 1 else -1
        parents = tree.parent_array
        before = np.where(parents >= 0, tree.tokens[parents], out[-1])
        return first, pair_key(before[::-1], tree.tokens[::-1])


def source_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[list[tuple[int, ...]]]:
    """The step's drafts of each kind (KINDS), best first: the text's longest-suffix
    continuations (with `drafts="pool+text"`); with `order="context"` (the default), the pool's
    n-grams that start with the last two tokens (what follows them, N-2 tokens: two matched
    tokens predict better than one); the pool's n-grams under x0, newest (or most frequent)
    first; with `text_match=1`, the continuations of x0's lone matches (`TextIndex.lone_drafts`)."""
    tokens, starts, sources = _drafts(cfg, pool, text, _NO_ROW)
    kinds = np.searchsorted(np.cumsum(KINDS), sources, side="right").tolist()
    out: list[list[tuple[int, ...]]] = [[] for _ in KINDS]
    for kind, draft in zip(kinds, as_tuples(tokens, starts)):
        out[kind].append(draft)
    return out


def ranked_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[tuple[int, ...]]:
    """The step's drafts in one list, best first (`source_drafts` in order, duplicates dropped):
    the candidates of a tree without sharing (`tree=False`)."""
    return list(dict.fromkeys(d for drafts in source_drafts(cfg, pool, text) for d in drafts))


def draft_chains(cfg: DecodeConfig, pool: NGramPool, text: TextIndex, window: JacobiWindow | None) -> Chains:
    """Every draft as a chain for `grow`, its source (`source_drafts`, ranked, then the window's
    row 0: its guesses of the next W-1 tokens) naming its row of `DraftRates.chances`."""
    row = window.rows[0, 1 : cfg.max_draft + 1] if window is not None and window.ready and window.W > 1 else _NO_ROW
    return Chains(*_drafts(cfg, pool, text, row))


def _drafts(
    cfg: DecodeConfig, pool: NGramPool, text: TextIndex, row: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`step_drafts` of cfg's kinds, their sources ranked as KINDS says, then `row`."""
    return step_drafts(
        text,
        pool,
        length=cfg.draft_len,
        count=cfg.text_drafts if cfg.drafts == "pool+text" else 0,
        context=cfg.order == "context" and pool.n > 2,
        frequent=cfg.order == "frequent",
        ranks=_RANKS,
        row=row,
        row_source=WINDOW_SOURCE,
    )


_RANKS, _NO_ROW = np.array(KINDS, dtype=np.int64), np.zeros(0, dtype=np.int64)


def step_tree(
    cfg: DecodeConfig,
    budget: int,
    pool: NGramPool,
    text: TextIndex,
    successors: SuccessorTable | None,
    rates: DraftRates | None = None,
    window: JacobiWindow | None = None,
) -> tuple[DraftTree, Grown | None]:
    """The step's verification tree within `budget` nodes, and its growth where grown. As a
    token tree (`cfg.tree`): the likeliest nodes of all drafts (`draft_chains`) and of the
    successor table's paths, by their estimated chances (`rates`: the drafts' counted
    acceptance; default: fresh ones; lp/lookahead/grow.py). Without sharing: `ranked_drafts` in
    order, then the paths to the leaves of the budget's likeliest recycled nodes."""
    if not budget:
        return DraftTree(np.zeros(0, dtype=np.int64), ()), None
    x0 = text.tokens[-1]
    if cfg.tree:
        rates = rates or DraftRates(WINDOW_SOURCE + 1, cfg.max_draft)
        before = text.tokens[-2] if len(text.tokens) > 1 else -1
        chains = draft_chains(cfg, pool, text, window)
        grown = grow(budget, x0, cfg.max_draft, chains, rates.chances, successors, before)
        return grown.tree, grown
    builder = TreeBuilder(budget, share=False)
    for draft in ranked_drafts(cfg, pool, text):
        if builder.full:
            break
        builder.add(draft)
    if successors is not None and not builder.full:
        for path in grow(budget, x0, cfg.max_draft, table=successors).leaf_paths():
            builder.add(path)  # each path to a leaf is a chain of its own
    return builder.tree(), None


def compile_kernels() -> None:
    """Compile the drafting's numba loops (text index, pool, tree growth, successor table,
    rates), or load them from numba's cache, on two steps of a tiny decode: before a decode's
    clock starts rather than in its first step (seconds on a fresh install, once per process)."""
    cfg = DecodeConfig(W=2, N=3, G=2, recycle=2)
    sources = DraftSources(cfg, [1, 2, 1, 2, 1], vocab_size=16)
    for _ in range(2):
        tree = sources.tree(1)
        sources.prepare()
        rows = np.tile(np.arange(3, dtype=np.int64), (1 + cfg.W + tree.size, 1))
        sources.observe(Outcome([1, 2], np.asarray([1, 2], dtype=np.int64), 1, rows), [1, 2])

"""A plain reference of the drafter's per-step work (lp/decode/drafter.py), for randomized equality
tests: its sources as separate objects, each fed by its own Python call in the order the drafter
keeps, and each step's tree grown (or, without sharing, built chain by chain) in Python."""

from __future__ import annotations

import numpy as np

from lp.config import DecodeConfig
from lp.decode.drafter import NO_MEMORY
from lp.decode.plan import Split
from lp.lookahead.chains import new_chains
from lp.lookahead.drafts import step_drafts
from lp.lookahead.grow import grow
from lp.lookahead.pool import NGramPool
from lp.lookahead.rates import DraftRates
from lp.lookahead.sources import SOURCES
from lp.lookahead.successors import SuccessorTable, new_table, pair_key
from lp.lookahead.text import TextIndex
from lp.lookahead.tree import DraftTree, TreeBuilder
from lp.lookahead.window import JacobiWindow
from lp.message import merge
from lp.partition import RankPlan
from tests.reference_plan import first_grown, fitted_size


def window_ngrams(rows: np.ndarray, x0: int, level: np.ndarray) -> np.ndarray:
    """The W n-grams `[W, N]` that a window's trajectory closes with its new `level`: column j's
    x0 (j = 0) or row-0 guess, its levels above, then `level[j]` (lp/lookahead/window.py)."""
    grams = np.concatenate([rows, level[None, :]], axis=0).T.copy()
    grams[0, 0] = x0
    return grams


class PlainSources:
    """One sequence's draft sources, as the drafter makes them, each its own object."""

    def __init__(self, cfg: DecodeConfig, prompt: list[int], vocab: int) -> None:
        W, N, G, limit = cfg.step_shape
        self.cfg, self.N, self.k = cfg, N, cfg.successors_sent
        self.text = TextIndex(
            prompt,
            cfg.drafts == "pool+text" and limit > 0,
            cfg.lone_matches,
            0,
            vocab if cfg.longest_continuation else 0,
        )
        self.pool = NGramPool(N, cfg.pool_capacity)
        self.pooled = G > 0 and cfg.pool_capacity > 0
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt)
        self.table = SuccessorTable(self.k, vocab) if self.k else new_table(0, 1, 1)
        self.rates = DraftRates(SOURCES, cfg.max_draft)
        self.window = JacobiWindow(W, N, prompt, cfg.seed)
        self.tree = DraftTree(np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.labels = np.zeros(0, np.int64)

    def grow(self, pending: int, split: Split) -> DraftTree:
        """The step's tree (kept as the current step's) for a step that feeds `pending` tokens,
        cut to the shares of `split` (lp/decode/shares.py)."""
        cfg, W = self.cfg, self.window.rows.shape[1]
        budget = cfg.tree_budget(pending)
        count = cfg.text_drafts if cfg.drafts == "pool+text" else 0
        context, frequent = cfg.pool_order == "context" and self.N > 2, cfg.pool_order == "frequent"
        if not budget:
            tokens = parents = labels = groups = np.zeros(0, np.int64)
        elif cfg.tree:
            guesses = cfg.max_draft if W > 1 and self.window.ready else 0
            chains = step_drafts(
                self.text, self.pool, self.window, NO_MEMORY, cfg.draft_len, count, context, frequent, guesses, 0, 0
            )
            chances = self.rates.chances
            grown = grow(self.text, chains, chances, self.table, budget, cfg.max_draft, cfg.longest_continuation)
            tokens, parents, labels, growth, groups, _ = grown
        else:  # the drafts in order, each a chain; then the recycled leaves' paths
            chains = step_drafts(
                self.text, self.pool, self.window, NO_MEMORY, cfg.draft_len, count, context, frequent, 0, 0, 0
            )
            builder = TreeBuilder(budget, share=False)
            for draft in dict.fromkeys(chains.drafts):
                builder.add(draft)
            if self.k:
                grown = grow(self.text, new_chains(0, 0), self.rates.chances, self.table, budget, cfg.max_draft, 0)
                for path in leaf_paths(*grown[:2], grown[3]):
                    builder.add(path)
            tree = builder.tree()
            tokens, parents, groups = tree.tokens, tree.parent_array, np.asarray(tree.groups(), np.int64)
            labels, growth = np.full(len(tokens), -1, np.int64), np.arange(len(tokens))
        if budget and split.P > 1 and split.share:
            cap = split.share - (pending - 1)
            size = fitted_size(split.W, split.N, split.P, cap, tuple(parents.tolist()), growth.tolist())
            nodes, kept = first_grown(tuple(parents.tolist()), growth.tolist(), size)
            tokens, parents, labels, groups = tokens[nodes], np.asarray(kept, np.int64), labels[nodes], None
        self.tree, self.labels = DraftTree(tokens, parents, groups), labels
        return self.tree

    def observe(
        self, gathered: np.ndarray, plans: tuple[RankPlan, ...], order: np.ndarray, remaining: int, eos: set[int]
    ) -> tuple[list[int], bool]:
        """A step's messages merged (its shares `plans`, counting nodes in `order`) and fed to the
        sources one at a time."""
        cfg, text, pool, table = self.cfg, self.text, self.pool, self.table
        outcome = merge(gathered, plans, cfg.max_commit, self.k, order)
        tokens, stopped = outcome.tokens[:remaining], False
        ends = [i for i, t in enumerate(tokens) if t in eos]
        if ends:
            tokens, stopped = tokens[: ends[0] + 1], True
        self.rates.observe(self.tree.tokens, self.tree.parent_array, self.labels, outcome.tokens[: outcome.accepted])
        out = text.tokens
        if self.k:
            table.observe([*out[-2:].tolist(), *tokens])
            before = [int(self.tree.tokens[p]) if p >= 0 else int(out[-1]) for p in self.tree.parents]
            keys = [pair_key(b, int(t)) for b, t in zip(before, self.tree.tokens)][::-1]
            table.update(
                outcome.successors,
                np.asarray(keys, np.int64),
                pair_key(int(out[-2]), int(out[-1])) if len(out) > 1 else -1,
            )
        W = self.window.rows.shape[1]
        if self.pooled and W and self.window.ready:
            pool.add_rows(window_ngrams(self.window.rows, int(out[-1]), outcome.new))
        text.extend(tokens)
        if self.pooled and cfg.pool_from_output:
            pool.add_sequence(text.tokens[-(len(tokens) + self.N - 1) :])
        if W:
            self.window.update(outcome.new)
        return tokens, stopped


def leaf_paths(tokens: np.ndarray, parents: np.ndarray, order: np.ndarray) -> list[tuple[int, ...]]:
    """The token path from x0 to each leaf of a grown tree, leaves in the order they were grown."""
    paths: list[tuple[int, ...]] = []
    for p, token in zip(parents.tolist(), tokens.tolist()):
        paths.append((paths[p] if p >= 0 else ()) + (token,))
    inner = set(parents.tolist())
    return [paths[v] for v in sorted((v for v in range(len(paths)) if v not in inner), key=order.__getitem__)]

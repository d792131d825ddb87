"""The drafting policy: which candidates a step verifies, and the host-side sources they come from
(the Jacobi window, the n-gram pool, the text's own suffix matches, the successor table of
recycled top-k tokens), kept identical on every rank by feeding them the same merged outcomes."""

from __future__ import annotations

from lp.config import DecodeConfig
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool
from lp.lookahead.drafts import TextIndex
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import DraftTree, TreeBuilder
from lp.message import Outcome


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
        self.text = TextIndex(prompt_ids, indexed=cfg.drafts == "pool+text" and budget > 0)
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
            self.pool.flush()

    def tree(self) -> DraftTree:
        """The next step's verification tree (`step_tree`)."""
        return step_tree(self.cfg, self.budget, self.pool, self.text, successors=self.successors)

    def observe(self, outcome: Outcome, tokens: list[int]) -> None:
        """Feed a step's merged outcome: the window's new level and its n-grams, the successor
        rows, then the committed `tokens` (and, with `pool_from_output`, the n-grams ending in
        them: free candidates, as in prompt lookup)."""
        out = self.text.tokens
        if self.window is not None:
            if self.G and self.window.ready:
                self.pool.add_rows(self.window.ngrams(out[-1], outcome.new))
            self.window.update(outcome.new)
        if self.successors is not None:
            self.successors.observe([out[-1], *tokens])  # the table the drafts used
            self.successors.update(outcome.successors)
        self.text.extend(tokens)
        if self.G and self.cfg.pool_from_output:
            length = len(out)
            self.pool.add_sequence(out[max(length - len(tokens) - self.N + 1, 0) : length])


def ranked_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[tuple[int, ...]]:
    """The step's candidates, best first: the text's longest-suffix continuations (with
    `drafts="pool+text"`), then the pool's n-grams under x0, newest (or most frequent) first
    (duplicates dropped). With `order="context"` (the default), the pool's n-grams that start
    with the last two tokens come first (what follows them, N-2 tokens): two matched tokens
    predict better than one. The successor table's paths fill what the budget has left
    (`step_tree`)."""
    out = text.tokens
    x0 = out[-1]
    ranked = text.drafts(cfg.draft_len, cfg.text_drafts) if cfg.drafts == "pool+text" else []
    if cfg.order == "context" and len(out) > 1 and pool.n > 2:
        ranked += [t[1:] for t in pool.best(out[-2]) if t[0] == x0]
    ranked += pool.best(x0, cfg.order == "frequent")
    return list(dict.fromkeys(ranked))


def step_tree(
    cfg: DecodeConfig, budget: int, pool: NGramPool, text: TextIndex, successors: SuccessorTable | None
) -> DraftTree:
    """The step's verification tree: `ranked_drafts`, then the likeliest paths through the
    successor table, within `budget` nodes (without sharing: the paths to its leaves)."""
    builder = TreeBuilder(budget, cfg.tree)
    for draft in ranked_drafts(cfg, pool, text) if budget else ():
        builder.add(draft)
        if builder.full:
            break
    if successors is not None and not builder.full:
        x0 = text.tokens[-1]
        if cfg.tree:
            successors.grow(builder, x0, cfg.max_draft)
        else:  # each path to a leaf of the budget's likeliest recycled nodes is a chain of its own
            recycled = TreeBuilder(budget)
            successors.grow(recycled, x0, cfg.max_draft)
            for path in recycled.leaf_paths():
                builder.add(path)
    return builder.tree()

"""The drafter: one sequence's draft sources and the host's work of each step, as the batch
(lp/decode/batch.py) sees it, each a compiled call on the sequence's drafting state
(lp/decode/phases.py): `before_read` while the device computes the forward; once the step's
messages are read, `after_read` (merge, observe), `grow` (the next tree, its chances for the
step's budget) and `plan` (the nodes the budget gives it, split and laid out).

Without sharing (`tree=False`: one chain per draft, the classic verification branch) the tree is
built in Python between a compiled observe and a compiled plan (`_unshared_tree`)."""

from __future__ import annotations

import numpy as np

from lp.config import DecodeConfig
from lp.decode import phases
from lp.decode.phases import DraftShape
from lp.decode.plan import Split, StepPlan
from lp.decode.shares import share_cap
from lp.errors import LPError
from lp.lookahead.chains import new_chains
from lp.lookahead.grow import grow
from lp.lookahead.memory import DraftMemory, learn, seed
from lp.lookahead.pool import NGramPool
from lp.lookahead.rates import DraftRates
from lp.lookahead.sources import SOURCES
from lp.lookahead.successors import SuccessorTable, new_table
from lp.lookahead.text import TextIndex
from lp.lookahead.tree import DraftTree, TreeBuilder
from lp.lookahead.window import JacobiWindow
from lp.message import merge, step_message_size

NO_MEMORY = DraftMemory(0)  # the memory of a drafter that has none: it holds nothing


class Drafter:
    """The draft sources of one sequence decoded with `cfg` by rank `rank` of P (`keep`: its
    accepted drafts' KV is kept, lp/worker.py, so every step feeds x0 alone); `memory`: the draft
    memory of earlier decodes it draws on (lp/lookahead/memory.py; None: none)."""

    def __init__(
        self,
        cfg: DecodeConfig,
        prompt: list[int],
        vocab: int,
        *,
        P: int = 1,
        rank: int = 0,
        keep: bool = False,
        memory: DraftMemory | None = None,
    ) -> None:
        W, N, G, limit = cfg.step_shape
        k, pooled = cfg.successors_sent, G > 0 and cfg.pool_capacity > 0
        if k > vocab:
            raise LPError(f"successors={k} is more than the model's {vocab} tokens")
        self.shape = DraftShape(
            split=Split(W, N, P, rank, share_cap(cfg, P)),
            k=k,
            depth=cfg.max_draft,
            draft_len=cfg.draft_len,
            text_drafts=cfg.text_drafts if cfg.drafts == "pool+text" else 0,
            remembered=cfg.text_drafts if memory is not None and memory.budget and cfg.memory and limit > 0 else 0,
            context=cfg.pool_order == "context" and N > 2,
            frequent=cfg.pool_order == "frequent",
            continuation_len=cfg.longest_continuation,
            max_commit=cfg.max_commit,
            keep=keep,
            pooled=pooled,
            from_text=pooled and cfg.pool_from_output,
            shared=cfg.tree,
        )
        # the prompt's n-grams and text index: host work on the prompt's length, which the caller
        # times with the prefill (a GPU prefills meanwhile)
        room = len(prompt) + cfg.max_new_tokens
        indexed, vocab_seen = cfg.drafts == "pool+text" and limit > 0, vocab if self.shape.continuation_len else 0
        # the sources: held here too, the same objects as the state's
        self.text = TextIndex(prompt, indexed, cfg.lone_matches, room, vocab_seen)
        self.pool = NGramPool(N, cfg.pool_capacity)
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt)
            self.pool.flush()
        # every step keys at most a successor row per tree node and x0's
        self.table = SuccessorTable(k, vocab, cfg.max_new_tokens * (limit + 1)) if k else new_table(0, 1, 1)
        self.rates = DraftRates(SOURCES, cfg.max_draft)
        self.window = JacobiWindow(W, N, prompt, cfg.seed)
        # the tree of a step that feeds p pending tokens (at most a step's commit)
        self.budgets = np.array([cfg.tree_budget(p) for p in range(1, cfg.max_commit + 1)], np.int64)
        self.memory = memory if memory is not None else NO_MEMORY
        # the counts start where the earlier decodes' left them (where it draws on the memory)
        self._seeded = seed(self.memory, self.rates, self.table) if self.memory.budget and cfg.memory else None
        sources = (self.text, self.pool, self.table, self.rates, self.window, self.memory)
        self.state = phases.new_state(*sources, self.shape, self.budgets)

    def teach(self, prompt: list[int], output: list[int]) -> None:
        """At the decode's end: its text, and its counts of its sources' rates, to the memory."""
        self.memory.add(prompt, output)
        if self._seeded is not None:
            learn(self.memory, self.rates, self.table, self._seeded)

    def before_read(self, rehearse: bool = False) -> None:
        """The step's work that its outcome does not decide (`phases.before_read`); with
        `rehearse`, a plan rehearsed (an asynchronous device's host: lp/decode/batch.py)."""
        phases.before_read(self.state, rehearse)

    def after_read(
        self, gathered: np.ndarray, step: StepPlan, remaining: int, eos: np.ndarray
    ) -> tuple[list[int], bool]:
        """The step's gathered messages `[P, K]` (of ranks whose shares are `step`'s) merged and fed
        to the sources (`phases.after_read`): the committed tokens (at most `remaining`) and
        whether an EOS ended them."""
        new, stopped = phases.after_read(self.state, gathered, step.bounds, step.order, remaining, eos)
        return new.tolist(), stopped

    def cap(self, pending: int) -> int:
        """The most nodes the tree of a step that feeds `pending` tokens first may have."""
        return int(self.budgets[pending - 1]) if 1 <= pending <= len(self.budgets) else 0

    def grow(self, pending: int, nodes: int | None = None) -> np.ndarray | None:
        """Grow the tree of the next step, which feeds `pending` tokens first, to at most `nodes`
        nodes (None: its cap; 0: none, the step's budget gives it none): its nodes' chances in
        growth order, for the step's budget (lp/decode/budget.py); None for drafts of one chain each
        (`tree=False`), which the budget does not cut."""
        if not self.shape.shared:
            return None
        return phases.grow_next(self.state, pending, self.cap(pending) if nodes is None else nodes)

    def plan(self, pending: list[int], k: int | None = None) -> StepPlan:
        """The next step's plan: it feeds `pending` (x0 last) and verifies the first `k` nodes of
        its grown tree (None: all of them); given no node (k 0), it feeds `pending` alone: its
        window waits for a step that verifies drafts (lp/decode/budget.py)."""
        fed = np.asarray(pending, dtype=np.int64)
        if not self.shape.shared:
            return self._unshared_step(fed)
        every = np.iinfo(np.int64).max
        planned = phases.plan(self.state, fed, every if k is None else k, k != 0)
        return StepPlan(planned, len(fed), self.shape.split)

    def next_step(self, pending: list[int], k: int | None = None) -> StepPlan:
        """`grow` then `plan`: the next step, verifying the first `k` nodes of its tree (None: all;
        0: none, and no window)."""
        self.grow(len(pending))
        return self.plan(pending, k)

    def _unshared_step(self, pending: np.ndarray) -> StepPlan:
        """The plan of a step whose drafts are one chain each (`tree=False`)."""
        tree = self._unshared_tree(pending)
        groups = np.asarray(tree.groups(), dtype=np.int64)
        planned = phases.plan_given(self.state, pending, tree.tokens, tree.parent_array, groups)
        return StepPlan(planned, len(pending), self.shape.split)

    def _unshared_tree(self, pending: np.ndarray) -> DraftTree:
        """The step's drafts in order, best first by kind, each a chain of its own, then the paths
        to the leaves of the budget's likeliest recycled nodes, within the budget."""
        s = self.shape
        budget = int(self.budgets[len(pending) - 1])
        builder = TreeBuilder(budget, share=False)
        if not budget:
            return builder.tree()
        for draft in dict.fromkeys(phases.step_chains(self.state).drafts):
            if builder.full:
                break
            builder.add(draft)
        if s.k and not builder.full:
            chances, no_chains = self.rates.chances, new_chains(0, 0)
            tokens, parents, _, order, _, _ = grow(self.text, no_chains, chances, self.table, budget, s.depth, 0)
            paths: list[tuple[int, ...]] = []
            for p, token in zip(parents.tolist(), tokens.tolist()):  # parents precede their children
                paths.append((paths[p] if p >= 0 else ()) + (token,))
            inner = set(parents.tolist())
            for leaf in sorted((v for v in range(len(paths)) if v not in inner), key=order.__getitem__):
                builder.add(paths[leaf])
        return builder.tree()


def warm_up() -> None:
    """Compile the drafter's calls, or load them from numba's cache, on two steps of tiny decodes
    (with successors, continuations and a draft memory they then teach, and with one chain per
    draft over two ranks), so that no decode compiles in its first steps (tens of seconds on a
    fresh install, once per process)."""
    shared, unshared = (
        DecodeConfig(W=2, N=3, G=2, successors=2, continuation_len=2),
        DecodeConfig(W=2, N=3, G=2, tree=False),
    )
    memory = DraftMemory(64)
    memory.add([1, 2], [1, 2, 3])
    for cfg, P in ((shared, 1), (unshared, 2)):
        drafter = Drafter(cfg, [1, 2, 1, 2, 1], vocab=16, P=P, memory=memory)
        step = drafter.next_step([1], 2)
        gathered = np.zeros((P, step_message_size(cfg)), np.int64)
        for rehearse in (False, True):
            drafter.before_read(rehearse)
            tokens, _ = drafter.after_read(gathered, step, 3, np.zeros(0, np.int64))
            step = drafter.next_step(tokens)
        drafter.teach([1, 2, 1, 2, 1], tokens)
    merge(gathered, step.plans, unshared.max_commit, unshared.successors_sent)


__all__ = ["Drafter", "warm_up"]

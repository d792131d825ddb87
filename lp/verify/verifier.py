"""Verifiers: what a step accepts, given its logits. The decoder hands a verifier the step's
rows (x0's, the window columns', the tree nodes') and gets back the next token after x0 and
this rank's acceptance; everything about the rule (argmax or sampling, warping, random
numbers) lives here, so the decoder never sees temperature, top-k or top-p, and a test passes
its own verifier instead of patching one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from lp.lookahead.mask import StepLayout
from lp.lookahead.tree import DraftTree
from lp.verify.distribution import uniforms, warp
from lp.verify.greedy import Acceptance, greedy_accept
from lp.verify.sampling import Sampled, sample_continue, sample_first_level, uniforms_needed


@dataclass(frozen=True)
class StepRows:
    """One rank's step as a verifier reads it: `logits` `[R, V]` and their `argmax` (computed once
    per step) in `layout`'s row order (x0's row, the window columns', the tree nodes'), and the
    nodes' draft tokens `nodes` (device tensor). `mine` counts the tree's nodes in `order` where
    it is not empty (a greedy step split over ranks, lp/decode/shares.py: its pre-order)."""

    logits: torch.Tensor
    argmax: torch.Tensor
    layout: StepLayout
    tree: DraftTree  # the whole step's tree (the same on every rank)
    mine: range  # this rank's nodes in `tree`
    nodes: torch.Tensor
    parents: torch.Tensor  # [n] device: this rank's parent pointers (-1: x0)
    depth: torch.Tensor  # [n] device: node depths (1: x0's children)
    ancestors: torch.Tensor  # [n, n] device bool: [i, j] iff j is i or an ancestor of i
    step: int  # steps done so far in this sequence
    max_commit: int  # message token slots: the most tokens a step commits
    owned: int = 0  # this rank's own nodes start here: those before are another's, fed again (lp/decode/shares.py)
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # `mine` counts `tree`'s nodes so

    @property
    def x0_logits(self) -> torch.Tensor:
        return self.logits[self.layout.X0_ROW]

    @property
    def node_logits(self) -> torch.Tensor:
        return self.logits[self.layout.node_rows]

    @property
    def node_argmax(self) -> torch.Tensor:
        return self.argmax[self.layout.node_rows]


class GreedyVerifier:
    """Paper Algorithm 3 on a tree: the deepest path the model's argmax would generate."""

    def __call__(self, s: StepRows) -> tuple[torch.Tensor, Acceptance]:
        y1 = s.argmax[s.layout.X0_ROW]
        return y1, greedy_accept(
            y1,
            s.nodes,
            s.parents,
            s.depth,
            ancestors=s.ancestors,
            preds=s.node_argmax,
            max_commit=s.max_commit,
            owned=s.owned,
        )


ContinueRule = Callable[[int, DraftTree, torch.Tensor, torch.Tensor, int], Sampled]


class SamplingVerifier:
    """Paper Algorithm 4 on a tree, with the warped distribution of `model.generate(do_sample=
    True, temperature, top_k, top_p)`. Its random numbers are a pure function of (seed,
    stream, step), so every rank draws the same ones. `rule`: the walk below the first token
    (tests swap in a wrong one to check that the distribution tests catch it)."""

    def __init__(
        self, temperature: float, top_k: int, top_p: float, seed: int, stream: int, rule: ContinueRule = sample_continue
    ) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.seed, self.stream, self.rule = seed, stream, rule

    def _warp(self, logits: torch.Tensor) -> torch.Tensor:
        return warp(logits, self.temperature, self.top_k, self.top_p)

    def __call__(self, s: StepRows) -> tuple[torch.Tensor, Acceptance]:
        """Every rank decides the first token from the tree's root tokens (the drafts are
        replicated); the rank holding the accepted roots' subtrees walks on."""
        u = uniforms(self.seed, self.stream, s.step, uniforms_needed(s.max_commit - 1))
        roots = s.tree.roots
        first = sample_first_level(self._warp(s.x0_logits), torch.from_numpy(s.tree.tokens[roots]), u)
        token = s.logits.new_tensor(first.token, dtype=torch.long)
        mine = (roots >= s.mine.start) & (roots < s.mine.stop)
        alive = roots[(s.tree.tokens[roots] == first.token) & mine] if first.accepted else roots[:0]
        if len(alive) == 0:  # the step commits the first token alone: the no-candidate result
            none = token.new_zeros(0)
            return token, greedy_accept(
                token, none, none, none, ancestors=none.bool().view(0, 0), preds=none, max_commit=s.max_commit
            )
        # the alive roots are adjacent (a tree groups them) and their subtrees whole on this rank
        start = int(alive[0])
        stop = int(roots[roots > alive[-1]][0]) if (roots > alive[-1]).any() else s.tree.size
        p_nodes = self._warp(s.node_logits[start - s.mine.start : stop - s.mine.start])
        result = self.rule(first.token, s.tree.slice(start, stop), p_nodes, u, s.max_commit)
        # The lowest alive root stands for the group: a rule fixed before the outcome is seen.
        local = start - s.mine.start
        path = [local + node for node in result.path] + [-1] * (s.max_commit - 1 - len(result.path))
        return token, Acceptance(
            token.new_tensor(local), token.new_tensor(result.n - 1), result.tokens, token.new_tensor(path)
        )


Verifier = Callable[[StepRows], tuple[torch.Tensor, Acceptance]]


def verifier_for(temperature: float, top_k: int, top_p: float, seed: int, stream: int) -> Verifier:
    """Greedy at temperature 0, else sampling with these settings."""
    if temperature > 0:
        return SamplingVerifier(temperature, top_k, top_p, seed, stream=stream)
    return GreedyVerifier()

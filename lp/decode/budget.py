"""One budget for a step over many sequences: how many of its grown tree's nodes each sequence's
next step verifies (docs/design.md section 3).

Every sequence of a step feeds its pending tokens (and its window, if its shape has one); what the
step spends beyond them goes to tree nodes. Each sequence's tree was grown best first, and each
node carries its estimated chance of being on the accepted path (its parent's times its source's
counted rate: lp/lookahead/rates.py), so a sequence's expected tokens from a step are 1 plus the
chances of the nodes it verifies. The shared budget therefore takes the likeliest nodes of all
sequences together: a sequence verifies the first k of its nodes in growth order (a tree: a node
grows after its parent), and the k's are those of the step's likeliest nodes overall.

How many nodes the step takes in all:
* `auto`: the count that maximises the step's expected tokens per second, its cost measured on
  this machine (lp/decode/auto.py `CostCurve`: one forward of T tokens); the tokens every step
  feeds anyway (prompt chunks, pending tokens, windows) are the base it adds to. One sequence on a
  GPU gets the whole tree where a bucket has room; many sequences on a CPU, where a step of more
  tokens costs more at once, get only the drafts that pay. Nothing depends on the batch's size.
* `shared` / `even` (measurements): a step of `step_tokens` tokens, its nodes taken best first
  across sequences, or split evenly among them.
* `none`: no nodes (plain batched decoding).
Sequences whose trees are not `shared` (a shape the caller fixed, drafts of one chain each) verify
their whole tree and are part of the base.

The chances are estimates: each sequence's rates start from a prior, and nodes of one tree are not
independent. So `auto` prices them with a correction counted over the batch's steps
(`Calibration`: the drafts accepted over the drafts the verified nodes' chances promised), which
every rank counts alike from the same outcomes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lp.decode.auto import CostCurve
from lp.errors import LPError

POLICIES = ("auto", "shared", "even", "none")


@dataclass(frozen=True)
class Claim:
    """One sequence's part in the next step: the tokens it feeds whatever its tree (`fixed`: its
    pending tokens and window, this rank's share), its grown tree's chances in growth order, and
    whether those nodes compete for the step's budget (`shared`; else all of them are verified)."""

    fixed: int
    chances: np.ndarray
    shared: bool


@dataclass(frozen=True)
class Budget:
    """How a step's nodes are shared (module docstring). `step_tokens`: the step's size for
    `shared` and `even`; `cost`: the machine's step costs for `auto`; `P`: the replicas that
    split each tree (a rank's share of the nodes is 1/P of them)."""

    policy: str = "auto"
    step_tokens: int | None = None
    cost: CostCurve | None = None
    P: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise LPError(f"budget must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.policy in ("shared", "even") and not self.step_tokens:
            raise LPError(f"budget={self.policy} needs the step's tokens")
        if self.policy == "auto" and self.cost is None:
            raise LPError("budget=auto needs the machine's step costs")

    def allocate(self, claims: list[Claim], base: int = 0, factor: float = 1.0) -> list[int]:
        """The nodes each claim's next step verifies; `base`: the step's other tokens (prompt chunks);
        `factor`: what a promised draft is worth (`Calibration.factor`)."""
        counts = [len(c.chances) for c in claims]
        shared = [i for i, c in enumerate(claims) if c.shared and len(c.chances)]
        if not shared:
            return counts
        competing = set(shared)
        own = sum(n for i, n in enumerate(counts) if i not in competing)
        fixed = base + sum(c.fixed for c in claims) + math.ceil(own / self.P)
        for i in shared:
            counts[i] = 0
        if self.policy == "none":
            return counts
        total = sum(len(claims[i].chances) for i in shared)
        if self.policy == "even":
            room = max(0, (self.step_tokens - fixed) * self.P)
            for j, i in enumerate(shared):
                counts[i] = min(len(claims[i].chances), room // len(shared) + (j < room % len(shared)))
            return counts
        # the shared nodes best first: each sequence's in growth order (its chances made
        # non-increasing, so the step's likeliest are a prefix of each), ties by sequence
        keys = np.concatenate([np.minimum.accumulate(claims[i].chances) for i in shared])
        owner = np.concatenate([np.full(len(claims[i].chances), j) for j, i in enumerate(shared)])
        place = np.concatenate([np.arange(len(claims[i].chances)) for i in shared])
        order = np.lexsort((place, owner, -keys))
        if self.policy == "shared":
            K = min(total, max(0, (self.step_tokens - fixed) * self.P))
        else:
            gains = factor * np.concatenate([claims[i].chances for i in shared])[order]
            K = self._best_count(gains, len(claims), fixed)
        taken = np.bincount(owner[order[:K]], minlength=len(shared))
        for j, i in enumerate(shared):
            counts[i] = int(taken[j])
        return counts

    def _best_count(self, gains: np.ndarray, sequences: int, fixed: int) -> int:
        """The count of nodes (the likeliest first, `gains` their chances) that maximises the
        step's expected tokens (each sequence 1, and its nodes' chances) per second."""
        expected = sequences + np.concatenate(([0.0], np.cumsum(gains)))
        counts = np.arange(len(expected))
        shares = fixed + np.ceil(counts / self.P)
        seconds = np.array([self.cost.seconds_at(T) for T in np.unique(shares)])
        per = seconds[np.searchsorted(np.unique(shares), shares)]
        return int(np.argmax(expected / per))


@dataclass
class Calibration:
    """The drafts accepted against the drafts the verified nodes' chances promised, over the
    batch's recent steps (each step's counts weigh `1 - decay` of the rest), from a prior of half."""

    promised: float = 4.0
    accepted: float = 2.0
    decay: float = 0.98

    @property
    def factor(self) -> float:
        """What a promised draft is worth: accepted / promised."""
        return self.accepted / self.promised

    def observe(self, promised: float, accepted: int) -> None:
        """A step's promise (the sum of its verified nodes' chances) and its accepted drafts."""
        self.promised = self.decay * self.promised + promised
        self.accepted = self.decay * self.accepted + accepted


__all__ = ["POLICIES", "Budget", "Calibration", "Claim"]

"""One budget for a step over many sequences: how many of its grown tree's nodes each sequence's
next step verifies (docs/design.md section 3).

Every sequence of a step feeds its pending tokens (and its window, if its shape has one); what the
step spends beyond them goes to tree nodes. A sequence whose tree competes for them and gets none
feeds its pending tokens alone: its window waits for a step that verifies its drafts (a window's
n-grams are worth only the drafts they make), so a step with no node is plain batched decoding.

Each sequence's tree was grown best first, and each node carries its estimated chance of being on
the accepted path (its parent's times its source's counted rate: lp/lookahead/rates.py). The
shared budget takes the likeliest nodes of all sequences together: a sequence verifies the first
k of its nodes in growth order (a tree: a node grows after its parent), and the k's are those of
the step's likeliest nodes overall.

How many nodes the step takes in all:
* `auto`: the count that maximises the step's expected tokens per second, as W=auto prices one
  sequence's step (lp/decode/auto.py): a sequence whose step feeds T tokens commits S(T) =
  1 + slope x log2(T) of them, the slope fitted on what the decodes achieved, and a step of T
  tokens costs what this machine measured, and more with drafts in it (`CostCurve.drafting`: their
  successors' top-k, their own attention group beside plain sequences; nodes at all only where
  they promise `MARGIN` more);
  the tokens every decoding step feeds anyway (pending tokens, windows) are the base it adds to,
  and a step of no node feeds no window of the sequences that share the nodes.
  A prompt chunk in the step is left out of the price: it is paid whatever the nodes, and a step
  it makes long would make them look free. One sequence on a GPU gets the whole tree where a
  bucket has room; many sequences on a CPU, where a step of more tokens costs more at once, get
  nodes only where they pay. Nothing depends on the batch's size but through the cost.
  (The nodes' own chances decide who gets them, not how many: a node verified is also a successor
  row computed and a path the next trees can draw on, a worth the achieved S counts and a chance
  does not.)
* `shared` / `even` (measurements): a step of `step_tokens` tokens, its nodes taken best first
  across sequences, or split evenly among them.
* `none`: no nodes (plain batched decoding).
Sequences whose trees are not `shared` (a shape the caller fixed, drafts of one chain each) verify
their whole tree and are part of the base."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lp.decode.auto import PRIOR_SLOPE, CostCurve
from lp.errors import LPError

POLICIES = ("auto", "shared", "even", "none")
# `auto` takes nodes only where they promise this factor more tokens/s than none: the price is a
# model (a slope fitted over whole decodes, costs timed apart), and a draft that promises less than
# its error gains nothing sure.
MARGIN = 1.05


@dataclass(frozen=True)
class Claim:
    """One sequence's part in the next step: the tokens it feeds with its tree (`fixed`: its
    pending tokens and window, this rank's share; `window` of them its window's, which a shared
    claim given no node does not feed), the most nodes its tree may have (`cap`), whether they
    compete for the step's budget (`shared`; else all of them are verified), and once grown, the
    tree's chances in growth order."""

    fixed: int
    cap: int
    shared: bool
    window: int = 0
    chances: np.ndarray | None = None


@dataclass(frozen=True)
class Budget:
    """How a step's nodes are shared (module docstring). `step_tokens`: the step's size for
    `shared` and `even`; `cost`: the machine's step costs for `auto`, and `slope`: the S-vs-step-
    size slope it prices with, both asked for when a step is priced (W=auto's tuner's: measured
    once, at the first request that asks for W=auto, and learning); `P`: the replicas that split
    each tree (a rank's share of the nodes is 1/P of them)."""

    policy: str = "auto"
    step_tokens: int | None = None
    cost: Callable[[], CostCurve] | None = None
    slope: Callable[[], float] = lambda: PRIOR_SLOPE
    P: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise LPError(f"budget must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.policy in ("shared", "even") and not self.step_tokens:
            raise LPError(f"budget={self.policy} needs the step's tokens")
        if self.policy == "auto" and self.cost is None:
            raise LPError("budget=auto needs the machine's step costs")

    def total(self, claims: list[Claim], base: int = 0) -> int:
        """The nodes the shared claims' trees verify in all (before any is grown: the claims' caps
        bound it); `base`: the step's other tokens (prompt chunks)."""
        shared = [c for c in claims if c.shared and c.cap]
        if not shared or self.policy == "none":
            return 0
        available = sum(c.cap for c in shared)
        unshared = sum(c.cap for c in claims if not c.shared)  # trees verified whole: drafts in the step anyway
        fixed = sum(c.fixed for c in claims) + math.ceil(unshared / self.P)
        if self.policy in ("shared", "even"):
            return min(available, max(0, (self.step_tokens - base - fixed) * self.P))
        # priced as a step of decodes alone: a prompt chunk's cost is paid whatever the nodes
        windows = sum(c.window for c in shared)
        return self._best_count(available, len(shared), len(claims) - len(shared), fixed, windows, unshared > 0)

    def split(self, claims: list[Claim], total: int) -> list[int]:
        """The nodes each grown claim's next step verifies: every node of a tree that is not shared;
        `total` among the shared ones, best first (`even`: evenly)."""
        counts = [len(c.chances) for c in claims]
        shared = [i for i, c in enumerate(claims) if c.shared and len(c.chances)]
        for i in shared:
            counts[i] = 0
        total = min(total, sum(len(claims[i].chances) for i in shared))
        if not shared or not total:
            return counts
        if self.policy == "even":
            for j, i in enumerate(shared):
                counts[i] = min(len(claims[i].chances), total // len(shared) + (j < total % len(shared)))
            return counts
        # best first: each sequence's nodes in growth order (its chances made non-increasing, so the
        # step's likeliest are a prefix of each); ties to the sequence with fewer nodes so far (fresh
        # sequences' trees are alike, priced by the same prior rates: a tie is no reason to favour
        # one, and a tree's next node adds less than another's first), then by sequence
        keys = np.concatenate([np.minimum.accumulate(claims[i].chances) for i in shared])
        owner = np.concatenate([np.full(len(claims[i].chances), j) for j, i in enumerate(shared)])
        place = np.concatenate([np.arange(len(claims[i].chances)) for i in shared])
        order = np.lexsort((owner, place, -keys))
        taken = np.bincount(owner[order[:total]], minlength=len(shared))
        for j, i in enumerate(shared):
            counts[i] = int(taken[j])
        return counts

    def _best_count(self, available: int, sequences: int, others: int, fixed: int, windows: int, drafted: bool) -> int:
        """The count of nodes (at most `available`) that maximises the step's expected tokens per
        second: each of the `sequences` sharing them commits S of its share plus a pending token
        (W=auto's S(T), module docstring), each of `others` one token; the step feeds `fixed`
        tokens and a rank's share of the nodes, `windows` fewer with none, and pays for drafts
        with nodes (or `drafted`: other trees in it already do)."""
        counts = np.arange(available + 1)
        expected = others + sequences * (1 + self.slope() * np.log2(1 + counts / sequences))
        shares = fixed + np.ceil(counts / self.P)
        shares[0] -= windows
        cost = self.cost()
        seconds = cost.seconds_of(shares)
        seconds[0 if drafted else 1 :] += cost.drafting  # drafts: their successors' top-k, their own attention
        rates = expected / seconds
        best = int(np.argmax(rates))
        return best if rates[best] > MARGIN * rates[0] else 0


__all__ = ["POLICIES", "Budget", "Claim"]

"""How often each draft source's tokens turn out right, counted as the decode goes, so that one tree
can take the likeliest nodes of all sources (lp/lookahead/grow.py): a text draft's third token
and a recycled path's second compete on their estimated chances.

A source's rate at depth d is conditional: of the tree nodes it made at depth d whose parent was
right (on the step's accepted path, or x0), the share that were right too. A node's chance is then
its parent's times its rate. Replicated state: every rank counts the same trees and outcomes in the
same order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba.experimental import structref

from lp.jit import State, compiled

PRIOR_HITS, PRIOR_OFFERED = 1.0, 2.0  # a rate of 1/2 until the decode has counted some


@structref.register
class DraftRatesType(State):
    pass


class DraftRates(structref.StructRefProxy):
    """Rates of `sources` draft sources at depths 1..`depth`: `chances[s, d - 1]`. Source s's
    nodes carry the labels s * depth + d - 1 in a grown tree (-1: the successor table's, whose
    rates its own counts give)."""

    def __new__(cls, sources: int, depth: int) -> DraftRates:
        if sources < 1 or depth < 1:
            raise ValueError(f"draft rates need sources and depth >= 1, got {sources} and {depth}")
        return new_rates(sources, depth)

    @property
    def chances(self) -> np.ndarray:
        return _chances(self)

    @property
    def hits(self) -> np.ndarray:
        return _counts(self)[0]

    @property
    def offered(self) -> np.ndarray:
        return _counts(self)[1]

    def observe(self, tokens: np.ndarray, parents: np.ndarray, labels: np.ndarray, accepted: Sequence[int]) -> None:
        """Count a step's grown tree (its nodes' tokens, parents and labels) against the draft
        tokens it accepted."""
        count(self, tokens, parents, labels, np.asarray(accepted, dtype=np.int64))


structref.define_proxy(DraftRates, DraftRatesType, ["hits", "offered", "chances"])


@compiled
def new_rates(sources: int, depth: int) -> DraftRates:
    """Every rate at its prior."""
    return DraftRates(
        np.full(sources * depth, PRIOR_HITS),
        np.full(sources * depth, PRIOR_OFFERED),
        np.full((sources, depth), PRIOR_HITS / PRIOR_OFFERED),
    )


@compiled
def count(rates: DraftRates, tokens: np.ndarray, parents: np.ndarray, labels: np.ndarray, accepted: np.ndarray) -> None:
    """A step's counts: the labelled nodes whose parent was right (on the accepted path `accepted`,
    or x0) are offered, and hit where right too; their chances updated."""
    n = len(tokens)
    right = np.zeros(n + 1, np.bool_)  # node v's at v + 1; x0's at 0
    right[0] = True
    node = -1
    for token in accepted:  # the accepted path: the child of the last node with the next token
        child = -1
        for v in range(n):
            if parents[v] == node and tokens[v] == token:
                child = v
                break
        if child < 0:
            break
        right[child + 1] = True
        node = child
    chances = rates.chances.reshape(-1)
    for v in range(n):
        label = labels[v]
        if label >= 0 and right[parents[v] + 1]:
            rates.offered[label] += 1
            if right[v + 1]:
                rates.hits[label] += 1
            chances[label] = rates.hits[label] / rates.offered[label]


@compiled
def _chances(rates: DraftRates) -> np.ndarray:
    return rates.chances.copy()


@compiled
def _counts(rates: DraftRates) -> tuple[np.ndarray, np.ndarray]:
    return rates.hits.copy(), rates.offered.copy()


__all__ = ["PRIOR_HITS", "PRIOR_OFFERED", "DraftRates", "count"]

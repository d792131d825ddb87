"""How often each draft source's tokens turn out right, counted as the decode goes, so that one
tree can take the likeliest nodes of all sources (lp/lookahead/grow.py): a text draft's third
token and a successor path's second compete on their estimated chances.

A source's rate at depth d is conditional: of the tree nodes it made at depth d whose parent
was right (on the step's accepted path, or x0), the share that were right too. A node's chance
is then its parent's times its rate. Replicated state: every rank counts the same trees and
outcomes in the same order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.grow import Grown, Labelled
from lp.lookahead.loops import count_rates

PRIOR_HITS, PRIOR_OFFERED = 1.0, 2.0  # a rate of 1/2 until the decode has counted some


class DraftRates:
    """Rates of `sources` draft sources at depths 1..`depth`: `chances[s, d - 1]`. Source s's
    nodes carry the labels s*depth + d - 1 in a grown tree (`label`)."""

    def __init__(self, sources: int, depth: int) -> None:
        if sources < 1 or depth < 1:
            raise ValueError(f"draft rates need sources and depth >= 1, got {sources} and {depth}")
        self.depth = depth
        self.hits = np.full(sources * depth, PRIOR_HITS)
        self.offered = np.full(sources * depth, PRIOR_OFFERED)
        self.chances = (self.hits / self.offered).reshape(sources, depth)

    def label(self, source: int) -> int:
        """The label of source s's depth-1 nodes (depth d: label + d - 1)."""
        return source * self.depth

    def observe(self, grown: Grown | Labelled, accepted: Sequence[int]) -> None:
        """Count a step's grown tree against the draft tokens it accepted (the committed tokens
        but the last): each labelled node whose parent was right (on the accepted path, or x0)
        is offered, and hit if right too."""
        count_rates(
            grown.tokens,
            grown.parents,
            grown.labels,
            np.asarray(accepted, dtype=np.int64),
            self.hits,
            self.offered,
            self.chances.reshape(-1),
        )


__all__ = ["DraftRates"]

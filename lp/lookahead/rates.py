"""How often each draft source's tokens turn out right, counted as the decode goes, so that one
tree can take the likeliest nodes of all sources (TreeBuilder.grow): a text draft's third token
and a successor path's second compete on their estimated chances.

A source's rate at depth d is conditional: of the tree nodes it made at depth d whose parent
was right (on the step's accepted path, or x0), the share that were right too. A node's chance
is then its parent's times its rate. Replicated state: every rank counts the same trees and
outcomes in the same order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lp.lookahead.tree import TreeBuilder

PRIOR_HITS, PRIOR_OFFERED = 1.0, 2.0  # a rate of 1/2 until the decode has counted some


class DraftRates:
    """Rates of `sources` draft sources at depths 1..`depth` (`chances[s][d - 1]`). Source s's
    nodes carry the labels s*depth + d - 1 in a TreeBuilder (`label`)."""

    def __init__(self, sources: int, depth: int) -> None:
        if sources < 1 or depth < 1:
            raise ValueError(f"draft rates need sources and depth >= 1, got {sources} and {depth}")
        self.depth = depth
        self.hits = np.full(sources * depth, PRIOR_HITS)
        self.offered = np.full(sources * depth, PRIOR_OFFERED)
        self.chances: list[list[float]] = []
        self._refresh()
        # the tree to count next (`offer`): it, and its labelled nodes' labels, parents and mask
        self._offered: tuple[TreeBuilder, np.ndarray, np.ndarray, np.ndarray] = (
            TreeBuilder(0),
            *np.zeros((2, 0), dtype=np.int64),
            np.zeros(0, dtype=bool),
        )

    def label(self, source: int) -> int:
        """The label of source s's depth-1 nodes (depth d: label + d - 1)."""
        return source * self.depth

    def _refresh(self) -> None:
        self.chances = (self.hits / self.offered).reshape(-1, self.depth).tolist()

    def offer(self, tree: TreeBuilder) -> None:
        """Take a step's tree before its outcome (`observe` counts it): its labelled nodes and
        their parents as arrays, work that can be done while the step's messages travel."""
        labels = np.asarray(tree.labels, dtype=np.int64)
        labelled = labels >= 0
        self._offered = (tree, labels[labelled], np.asarray(tree.parents, dtype=np.int64)[labelled], labelled)

    def observe(self, accepted: Sequence[int]) -> None:
        """Count the offered tree (`offer`) against the draft tokens it accepted (the committed
        tokens but the last): each labelled node whose parent was right is offered, and hit if
        right too."""
        tree, labels, parents, labelled = self._offered
        right = np.zeros(len(tree.labels) + 1, dtype=bool)
        right[-1] = True  # x0, every root's parent (index -1)
        right[tree.path_nodes(accepted)] = True
        offered = right[parents]
        size = len(self.hits)
        self.offered += np.bincount(labels[offered], minlength=size)
        self.hits += np.bincount(labels[offered & right[:-1][labelled]], minlength=size)
        self._refresh()


__all__ = ["DraftRates"]

"""How often each draft source's tokens turn out right, counted as the decode goes, so that one
tree can take the likeliest nodes of all sources (TreeBuilder.grow): a text draft's third token
and a successor path's second compete on their estimated chances.

A source's rate at depth d is conditional: of the tree nodes it made at depth d whose parent
was right (on the step's accepted path, or x0), the share that were right too. A node's chance
is then its parent's times its rate. Replicated state: every rank counts the same trees and
outcomes in the same order."""

from __future__ import annotations

from collections.abc import Sequence

from lp.lookahead.tree import TreeBuilder

PRIOR_HITS, PRIOR_OFFERED = 1.0, 2.0  # a rate of 1/2 until the decode has counted some


class DraftRates:
    """Rates of `sources` draft sources at depths 1..`depth` (`chances[s][d - 1]`). Source s's
    nodes carry the labels s*depth + d - 1 in a TreeBuilder (`label`). Python lists: a step
    counts a few dozen nodes, fewer than array ops would pay for."""

    def __init__(self, sources: int, depth: int) -> None:
        if sources < 1 or depth < 1:
            raise ValueError(f"draft rates need sources and depth >= 1, got {sources} and {depth}")
        self.depth = depth
        self.hits = [PRIOR_HITS] * (sources * depth)
        self.offered = [PRIOR_OFFERED] * (sources * depth)
        self.chances = [[PRIOR_HITS / PRIOR_OFFERED] * depth for _ in range(sources)]
        # the tree to count next (`offer`): it, and its labelled nodes (node, label) by parent
        self._offered: tuple[TreeBuilder, dict[int, list[tuple[int, int]]]] = (TreeBuilder(0), {})

    def label(self, source: int) -> int:
        """The label of source s's depth-1 nodes (depth d: label + d - 1)."""
        return source * self.depth

    def offer(self, tree: TreeBuilder) -> None:
        """Take a step's tree before its outcome (`observe` counts it): its labelled nodes by
        parent, work that can be done while the device computes the forward."""
        children: dict[int, list[tuple[int, int]]] = {}
        for node, (parent, label) in enumerate(zip(tree.parents, tree.labels)):
            if label >= 0:
                children.setdefault(parent, []).append((node, label))
        self._offered = (tree, children)

    def observe(self, accepted: Sequence[int]) -> None:
        """Count the offered tree (`offer`) against the draft tokens it accepted (the committed
        tokens but the last): each labelled node whose parent was right (on the accepted path,
        or x0) is offered, and hit if right too."""
        tree, children = self._offered
        path = tree.path_nodes(accepted)
        hits, offered, depth = self.hits, self.offered, self.depth
        for parent, right in zip([-1, *path], [*path, None]):
            for node, label in children.get(parent, ()):
                offered[label] += 1
                if node == right:
                    hits[label] += 1
                self.chances[label // depth][label % depth] = hits[label] / offered[label]


__all__ = ["DraftRates"]

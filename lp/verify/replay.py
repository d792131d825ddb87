"""A verifier that replays a recorded decode's acceptances (tools/replay.py): each step commits the
tokens the recorded decode's step committed, whatever the model's logits, so a model with random
weights runs the recorded decode's sequence of steps: the same committed tokens, hence the same
text for the drafts to match, the same pending tokens and step sizes, and the same number of
steps. Its trees are its own: the window's guesses, the pool's n-grams from them and the successor
table come from the model's logits, so they differ from the recorded decode's.

A step's accepted drafts have KV on one replica (`Worker.keep` moves the accepted path's nodes), so
the claimed path is a real one of the step's tree, of the recorded depth where the tree has one:
the recorded tokens' own path if the tree holds it (`"path"`), else another node of that depth
(`"depth"`), else the deepest node (`"short"`: the kept KV then has fewer real nodes than the
accepted count; the rest are whatever the slots held), else none at all (`"none"`, an empty tree).
Every rank computes the same choice from the step's whole tree; the rank that holds the node
claims it, and the merge takes it (the longest acceptance). Where no node is claimed, rank 0
claims the recorded acceptance on node 0's index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lp.errors import LPError
from lp.jit import compiled
from lp.verify.greedy import Acceptance
from lp.verify.verifier import StepRows

KINDS = ("path", "depth", "short", "none")  # how a step's path was found (module docstring)


@compiled
def choose_node(tokens: np.ndarray, parents: np.ndarray, committed: np.ndarray) -> tuple[int, int]:
    """The node a step claims, of a tree in subtree order, for the recorded `committed` tokens (y1,
    then the accepted drafts): the end of the recorded path, as far as the tree holds it, where it
    reaches the recorded depth; else the first node of that depth; else the first of the deepest.
    Returns (node, kind): kind an index of KINDS; node -1 for an empty tree."""
    n, a = len(parents), len(committed) - 1
    if n == 0:
        return -1, 3
    depth, on = np.empty(n, np.int64), np.zeros(n, np.bool_)
    best, deepest, first_at = -1, 0, -1
    for v in range(n):
        p = parents[v]
        depth[v] = 1 if p < 0 else depth[p] + 1
        d = depth[v]
        # on the recorded path: its parent is (or is x0), and its token is the recorded one there
        on[v] = d <= a and (p < 0 or on[p]) and tokens[v] == committed[d]
        if on[v] and d == a and best < 0:
            best = v
        if d == a and first_at < 0:
            first_at = v
        if d > deepest:
            deepest = d
    if best >= 0:
        return best, 0
    if first_at >= 0:
        return first_at, 1
    for v in range(n):
        if depth[v] == deepest:
            return v, 2
    return -1, 3


class ReplayVerifier:
    """Commits step i of a recorded decode, `steps[i]` (its committed tokens: y1, then the accepted
    drafts), whatever the logits; `kinds` counts how each step's path was found (KINDS). A decode
    that runs past the recording is an error. `max_commit`: the decode's (DecodeConfig's)."""

    def __init__(self, steps: Sequence[Sequence[int]], max_commit: int, device: torch.device) -> None:
        if any(not 1 <= len(s) <= max_commit for s in steps):
            raise LPError(f"a recorded step commits more than this decode's {max_commit} tokens, or none")
        table = np.full((len(steps), max_commit), -1, np.int64)
        for i, s in enumerate(steps):
            table[i, : len(s)] = s
        self.steps = [np.asarray(s, np.int64) for s in steps]
        self.table = torch.from_numpy(table).to(device)  # uploaded once, before the decode's clock
        self.kinds = dict.fromkeys(KINDS, 0)

    def __call__(self, s: StepRows) -> tuple[torch.Tensor, Acceptance]:
        if s.step >= len(self.steps):
            raise LPError(f"the replay ran past the recording's {len(self.steps)} steps")
        committed, row = self.steps[s.step], self.table[s.step]
        y1, a = row[0], len(committed) - 1
        long = dict(dtype=torch.long, device=row.device)
        none = torch.full((s.max_commit - 1,), -1, **long)
        nothing = Acceptance(y1.new_full((), -1), y1.new_zeros(()), row, none)
        if a == 0:
            return y1, nothing
        node, kind = choose_node(s.tree.tokens, s.tree.parent_array, committed)
        self.kinds[KINDS[kind]] += 1
        if node < 0:  # no tree: rank 0 claims the acceptance alone, with no path to keep
            return y1, Acceptance(y1.new_zeros(()), y1.new_full((), a), row, none) if s.mine.start == 0 else nothing
        place = int(np.flatnonzero(s.order == node)[0]) if len(s.order) else node
        if place not in s.mine:
            return y1, nothing
        local = s.owned + place - s.mine.start
        # the node's path by depth, on the device (greedy_accept's way): its ancestors' local indices
        on_path = s.ancestors.index_select(0, y1.new_full((1,), local))[0]
        slot = torch.where(on_path, s.depth, s.max_commit)
        path = torch.full((s.max_commit + 1,), -1, **long)
        path.scatter_(0, slot - 1, torch.arange(len(on_path), **long))
        return y1, Acceptance(y1.new_full((), local), y1.new_full((), a), row, path[: s.max_commit - 1])


__all__ = ["KINDS", "ReplayVerifier", "choose_node"]

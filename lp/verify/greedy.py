"""Greedy verification (paper Algorithm 3) on a token tree with the bonus token, vectorised on
the device: the longest path from x0 whose every token is the model's argmax after its parent."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Acceptance(NamedTuple):
    """Result of one rank's verification, all device tensors (no host sync).

    `best` is the local index of the deepest accepted tree node (-1 if none), `accepted` its
    depth (the number of draft tokens accepted), `tokens` `[max_commit]` the model's tokens along
    the path to it, padded with -1: the step commits `tokens[:accepted + 1]`, i.e. the matched
    drafts plus the bonus token. `path` `[max_commit - 1]`: the local indices of the accepted
    nodes by depth, padded with -1 (where their KV lies in the step: lp/worker.py `keep`); None
    where a caller builds an acceptance without it (tests)."""

    best: torch.Tensor
    accepted: torch.Tensor
    tokens: torch.Tensor
    path: torch.Tensor | None = None


def greedy_accept(
    y1: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    preds: torch.Tensor,
    max_commit: int,
    owned: int = 0,
) -> Acceptance:
    """Pick the deepest node whose path from x0 the model would generate (ties: lowest index),
    among nodes `owned` on: the first `owned` nodes are another rank's, fed again as ancestors
    of this rank's (lp/decode/shares.py), which that rank verifies.

    y1: scalar, the model's next token after x0. tokens, parents, depth, preds: `[n]` each
    node's draft token, parent (-1: x0), depth (1 for x0's children) and the model's argmax
    after it. ancestors: bool `[n, n]`, `[i, j]` true iff j is i or an ancestor of i (the last
    block of the step's mask). max_commit: the message's token slots, more than the deepest node."""
    n = tokens.shape[0]
    out = torch.full((max_commit + 1,), -1, dtype=torch.long, device=y1.device)
    out[0] = y1
    nodes = torch.full((max_commit + 1,), -1, dtype=torch.long, device=y1.device)
    if n == 0:
        zero = torch.zeros((), dtype=torch.long, device=y1.device)
        return Acceptance(zero - 1, zero, out[:max_commit], nodes[: max_commit - 1])
    expect = torch.cat([y1.reshape(1), preds])  # expect[p + 1]: the model's token after node p
    ok = tokens == expect[parents + 1]
    accepted = ~(ancestors & ~ok).any(dim=1)  # the node and all its ancestors match
    score = torch.where(accepted, depth, 0)
    if owned:
        score[:owned] = 0
    best = torch.argmax(score)  # first maximum: lowest index wins ties
    # index_select, not [best]: indexing with a device scalar reads it on the host (a sync)
    pick = best.view(1)
    length = score.index_select(0, pick)[0]
    path = ancestors.index_select(0, pick)[0] & (length > 0)
    # the path's tokens by depth, then the bonus; off-path nodes write to the spare last slot
    slot = torch.where(path, depth, max_commit)
    out.scatter_(0, slot, preds)
    nodes.scatter_(0, slot - 1, torch.arange(n, device=y1.device))  # depth d's node at d - 1
    return Acceptance(torch.where(length > 0, best, -1), length, out[:max_commit], nodes[: max_commit - 1])

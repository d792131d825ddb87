"""Greedy verification (paper Algorithm 3) with the bonus token, vectorised on the device."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Acceptance(NamedTuple):
    """Result of one rank's verification, all device tensors (no host sync).

    `best` is the local index of the winning candidate (-1 if none), `accepted` the number of
    its draft tokens that matched, `tokens` the N tokens the model predicts along it: the step
    commits `tokens[:accepted + 1]`, i.e. the matched drafts plus the bonus token."""

    best: torch.Tensor
    accepted: torch.Tensor
    tokens: torch.Tensor


def greedy_accept(y1: torch.Tensor, drafts: torch.Tensor, preds: torch.Tensor) -> Acceptance:
    """Pick the candidate with the longest matched prefix (ties: lowest index).

    y1: scalar, the model's next token after x0. drafts: `[G, N-1]` candidate tokens
    g_c[1..N-1]. preds: `[G, N-1]` the model's argmax after each candidate token."""
    G, n1 = drafts.shape
    if G == 0:
        tokens = torch.full((n1 + 1,), -1, dtype=torch.long, device=y1.device)
        tokens[0] = y1
        zero = torch.zeros((), dtype=torch.long, device=y1.device)
        return Acceptance(zero - 1, zero, tokens)
    # expect[c, k] is the token the model wants at draft slot k of candidate c.
    expect = torch.cat([y1.reshape(1, 1).expand(G, 1), preds], dim=1)
    matched = (drafts == expect[:, :-1]).long().cumprod(dim=1).sum(dim=1)
    best = torch.argmax(matched)  # first maximum: lowest candidate index wins ties
    # index_select, not [best]: indexing with a device scalar reads it on the host (a sync)
    pick = best.view(1)
    return Acceptance(best, matched.index_select(0, pick)[0], expect.index_select(0, pick)[0])

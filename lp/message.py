"""The fixed-size integer message each rank contributes to a step's all-gather, and the merge
that every rank applies identically to the gathered messages.

Layout (int64, size 5 + K + W, K = the most tokens a step commits: the longest draft + 1):
  [0] y1, the rank's next token after x0   [1] global index of its best tree node (-1: none)
  [2] accepted draft tokens of that one    [3] output length  [4] output checksum
  [5 : 5+K]     tokens along the path to it (the committed tokens are its first accepted+1)
  [5+K : 5+K+W] new tokens of the rank's window columns (first len(columns) slots)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lp.errors import LPError
from lp.partition import RankPlan
from lp.verify.greedy import Acceptance

HEADER = 5


def message_size(W: int, width: int) -> int:
    """Message length for W columns and steps committing at most `width` tokens."""
    return HEADER + width + W


def pack(y1: torch.Tensor, acc: Acceptance, first_candidate: int, new: torch.Tensor,
         length: int, checksum: int, W: int) -> torch.Tensor:
    """Build the message on the device from the rank's step results (no host sync)."""
    best = torch.where(acc.best >= 0, acc.best + first_candidate, acc.best)
    # new_full, not new_tensor: a fill kernel instead of a host-to-device copy, which syncs on CUDA
    head = torch.stack([y1, best, acc.accepted, y1.new_full((), length), y1.new_full((), checksum)])
    pad = new.new_full((W - new.numel(),), -1)
    return torch.cat([head, acc.tokens, new, pad])


@dataclass(frozen=True)
class Outcome:
    """What a step decided, identical on every rank."""

    tokens: list[int]  # committed tokens: 1..width of them
    new: np.ndarray  # [W] the window's new level
    accepted: int  # draft tokens accepted (len(tokens) - 1)


def merge(gathered: np.ndarray, plans: tuple[RankPlan, ...], width: int) -> Outcome:
    """Merge `[P, K]` messages of steps committing at most `width` tokens. Rank 0's y1 is
    authoritative: a candidate counts only if its rank computed the same y1. The longest
    acceptance wins, ties to the lowest candidate."""
    if (gathered[:, 3] != gathered[0, 3]).any() or (gathered[:, 4] != gathered[0, 4]).any():
        raise LPError(f"ranks diverged: output lengths {gathered[:, 3].tolist()}, "
                      f"checksums {gathered[:, 4].tolist()}")
    y1 = gathered[0, 0]
    valid = (gathered[:, 0] == y1) & (gathered[:, 1] >= 0)
    tokens, accepted = [int(y1)], 0
    if valid.any():
        rows = np.flatnonzero(valid)
        # lexsort: last key is primary -> most accepted, then lowest global candidate index
        r = rows[np.lexsort((gathered[rows, 1], -gathered[rows, 2]))[0]]
        accepted = int(gathered[r, 2])
        tokens = gathered[r, HEADER:HEADER + accepted + 1].tolist()
    new = np.concatenate([gathered[r, HEADER + width:HEADER + width + len(p.columns)] for r, p in enumerate(plans)])
    return Outcome(tokens, new, accepted)

"""The fixed-size integer message each rank contributes to a step's all-gather, and the merge
that every rank applies identically to the gathered messages.

Layout (int64, size 6 + K + W + R(1+k), K = the most tokens a step commits: the longest
draft + 1; R, k: logits rows and successors per row sent for the successor table, 0 without it):
  [0] y1, the rank's next token after x0   [1] global index of its best tree node (-1: none)
  [2] accepted draft tokens of that one    [3] output length  [4] output checksum
  [5] halt: 1 ends the decode after this step on every rank (rank 0's answer to `cancelled`,
      lp/decode/hooks.py; 0 elsewhere)
  [6 : 6+K]     tokens along the path to it (the committed tokens are its first accepted+1)
  [6+K : 6+K+W] new tokens of the rank's window columns (first len(columns) slots)
  [6+K+W : ]    R rows of (input token, its top-k next tokens): the rank's logits rows, then
                rows of -1 (padding, which `merge` drops; lp/lookahead/successors.py); all of
                them padding in a step of plain batched decoding, where the budget gave no
                node (it computes no top-k: lp/decode/batch.py)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from lp.config import DecodeConfig
from lp.errors import LPError
from lp.jit import compiled
from lp.partition import RankPlan
from lp.verify.greedy import Acceptance

HEADER = 6
HALT = 5  # the header slot that ends the decode on every rank


def message_size(W: int, max_commit: int, rows: int = 0, k: int = 0) -> int:
    """Message length for W columns, steps committing at most `max_commit` tokens and `rows` rows
    of k successors (none when k is 0, whatever `rows`)."""
    return HEADER + max_commit + W + rows * (1 + k) if k else HEADER + max_commit + W


def successor_rows(W: int, budget: int) -> int:
    """The most logits rows one rank's step has: x0's, a column's each, a tree node's each."""
    return 1 + W + budget


def step_message_size(cfg: DecodeConfig) -> int:
    """The message length of the steps that decoding with `cfg` all-gathers."""
    W, _, _, budget = cfg.step_shape
    return message_size(W, cfg.max_commit, successor_rows(W, budget), cfg.successors_sent)


CHECK_MOD = 2**31 - 1  # the output checksum: (checksum * 31 + token) % CHECK_MOD, token by token


def pack(
    y1: torch.Tensor,
    acc: Acceptance,
    first_candidate: int,
    new: torch.Tensor,
    length: int | torch.Tensor,
    checksum: int | torch.Tensor,
    W: int,
    successors: torch.Tensor | None = None,
    rows: int = 0,
) -> torch.Tensor:
    """Build the message on the device from the rank's step results (no host sync).
    `successors`: `[r, 1 + k]` rows (input token, top-k next tokens), padded to `rows`. `length`
    and `checksum` (the output's, before this step): host ints, or 0-d device tensors (a
    captured step's)."""
    best = torch.where(acc.best >= 0, acc.best + first_candidate, acc.best)
    # new_full, not new_tensor: a fill kernel instead of a host-to-device copy, which syncs on CUDA
    length, checksum = (v if isinstance(v, torch.Tensor) else y1.new_full((), v) for v in (length, checksum))
    head = torch.stack([y1, best, acc.accepted, length, checksum, y1.new_zeros(())])  # halt: 0 (hooks stamp it)
    pad = new.new_full((W - new.numel(),), -1)
    parts = [head, acc.tokens, new, pad]
    if successors is not None:
        parts += [successors.reshape(-1), new.new_full(((rows - successors.shape[0]) * successors.shape[1],), -1)]
    return torch.cat(parts)


def pack_plain(
    argmax: torch.Tensor, top: torch.Tensor, known: torch.Tensor, W: int, max_commit: int, rows: int = 0, k: int = 0
) -> torch.Tensor:
    """The messages of g sequences whose steps feed their pending tokens alone (no window, no tree
    node) and decide greedily, made at once: `[g, message_size]`, row i what `pack` makes of the
    i-th one's step. All it commits is y1, the argmax after x0. `argmax`, `top`: the step's rows'
    (`top` with fewer than `k` columns: no top-k computed, no successor row sent); `known` `[4, g]`
    on the device: each one's x0 row in the step, x0 token, output length and checksum."""
    x0_rows, x0_tokens, lengths, checksums = known
    y1 = argmax.index_select(0, x0_rows)
    out = argmax.new_full((known.shape[1], message_size(W, max_commit, rows, k)), -1)
    out[:, 0] = y1
    out[:, 2] = 0  # no draft accepted (slot 1: no best node, -1)
    out[:, 3] = lengths
    out[:, 4] = checksums
    out[:, HALT] = 0
    out[:, HEADER] = y1  # the path: y1 alone
    if k and top.shape[1] >= k:  # x0's successor row; the window's slots and the other rows: padding
        at = HEADER + max_commit + W
        out[:, at] = x0_tokens
        out[:, at + 1 : at + 1 + k] = top.index_select(0, x0_rows)[:, :k]
    return out


class Outcome(NamedTuple):
    """What a step decided, identical on every rank. (A named tuple: made after every message
    read, and a frozen dataclass costs several times more to make.)"""

    tokens: list[int]  # committed tokens: 1..max_commit of them
    new: np.ndarray  # [W] the window's new level
    accepted: int  # draft tokens accepted (len(tokens) - 1)
    successors: np.ndarray  # [rows, 1 + k] the step's successor rows: x0's, the columns', the nodes' (last first)


def merge(
    gathered: np.ndarray, plans: tuple[RankPlan, ...], max_commit: int, k: int = 0, order: np.ndarray | None = None
) -> Outcome:
    """Merge `[P, K]` messages of steps committing at most `max_commit` tokens (and successor rows
    of `k` tokens, if k > 0; `order`: the tree's nodes in the order the plans count them, None:
    its own). Rank 0's y1 is authoritative: a candidate counts only if its rank computed the same
    y1. The longest acceptance wins, ties to the lowest candidate."""
    order = np.zeros(0, np.int64) if order is None else order
    bounds = bounds_of(plans)
    slots = int((bounds[:, 1] - bounds[:, 0]).sum())
    best, new, successors = merge_messages(gathered, bounds, HEADER + max_commit, k, order, slots)
    if best < 0:
        return Outcome([int(gathered[0, 0])], new, 0, successors)
    accepted = int(gathered[best, 2])
    return Outcome(gathered[best, HEADER : HEADER + accepted + 1].tolist(), new, accepted, successors)


def bounds_of(plans: tuple[RankPlan, ...]) -> np.ndarray:
    """The plans as rows (first column, column stop, first candidate, candidate stop), as
    lp.partition's search gives them."""
    return np.array([(p.columns.start, p.columns.stop, p.candidates.start, p.candidates.stop) for p in plans])


@compiled
def merge_messages(
    gathered: np.ndarray, bounds: np.ndarray, start: int, k: int, order: np.ndarray, slots: int
) -> tuple[int, np.ndarray, np.ndarray]:
    """`merge`'s work on the messages of ranks whose plans are the rows of `bounds` (first
    column, column stop, first candidate, candidate stop; the candidates the tree's nodes in
    `order`, empty: their own, lp/decode/shares.py), their `slots` window slots from `start` (a
    step without its window fills none of them: its level is empty): the
    rank whose path wins (-1: none; an LPError where the ranks' output lengths or checksums
    differ: they drifted apart), the window's new level, and
    the successor rows (none: `[0, 1]` without k, `[0, 1 + k]` from a step of plain batched decoding) in
    the order that every rank applies them:
    x0, every column, then every node from the last to the first. The table keeps a token's last row, so a
    token's row computed after its likeliest node (the tree puts the best drafts first) wins
    over those after later nodes and after the window's guesses (on 12 Spec-Bench prompts, S
    2.72 -> 2.77 at W15 N5 G15 against nodes first to last). The order is one rank's at any P
    (up to near-ties that a top-k computed in another batch shape may order differently).
    Compiled: P short rows of checks and copies, on the host's path between the message read
    and the next forward, where Python's per-row work costs tens of microseconds at P=8."""
    P, K = gathered.shape
    best, most, lowest = -1, -1, 0  # the winner so far: its rank, accepted tokens, candidate index
    for r in range(P):
        if gathered[r, 3] != gathered[0, 3] or gathered[r, 4] != gathered[0, 4]:
            lengths, checksums = "", ""
            for q in range(P):
                lengths += (", " if q else "") + str(gathered[q, 3])
                checksums += (", " if q else "") + str(gathered[q, 4])
            raise LPError("ranks diverged: output lengths [" + lengths + "], checksums [" + checksums + "]")
        # the most accepted, then the lowest global candidate index, among ranks that agree on y1
        if gathered[r, 0] == gathered[0, 0] and gathered[r, 1] >= 0:
            if gathered[r, 2] > most or (gathered[r, 2] == most and gathered[r, 1] < lowest):
                best, most, lowest = r, gathered[r, 2], gathered[r, 1]
    cols, nodes = bounds[:, 1] - bounds[:, 0], bounds[:, 3] - bounds[:, 2]
    W = cols.sum()
    new = np.empty(W, np.int64)
    i = 0
    for r in range(P):
        for c in range(cols[r]):
            new[i] = gathered[r, start + c]
            i += 1
    if not k:
        return best, new, np.zeros((0, 1), np.int64)
    width, base = 1 + k, start + slots  # rank r's row c at [r, base + c * width]
    if gathered[0, base] < 0:  # x0's row is padding: a step of plain batched decoding sends no row
        return best, new, np.zeros((0, width), np.int64)
    n = 1 + W + nodes.sum()
    at = np.empty(n, np.int64)  # each row's first element in the flat messages, in order
    at[0], i = base, 1
    for r in range(P):
        for c in range(1, 1 + cols[r]):
            at[i], i = r * K + base + c * width, i + 1
    if len(order):  # the nodes of a tree split in pre-order, still from the tree's last to its first
        place, owner = np.empty(len(order), np.int64), np.empty(len(order), np.int64)
        for q in range(len(order)):
            place[order[q]] = q
        for r in range(P):
            owner[bounds[r, 2] : bounds[r, 3]] = r
        for v in range(len(order) - 1, -1, -1):
            q = place[v]
            r = owner[q]
            at[i], i = r * K + base + (cols[r] + 1 + q - bounds[r, 2]) * width, i + 1
    else:
        for r in range(P - 1, -1, -1):
            for c in range(cols[r] + nodes[r], cols[r], -1):
                at[i], i = r * K + base + c * width, i + 1
    flat = gathered.ravel()
    successors = np.empty((n, width), np.int64)
    for i in range(n):
        for j in range(width):
            successors[i, j] = flat[at[i] + j]
    return best, new, successors

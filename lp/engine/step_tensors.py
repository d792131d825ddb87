"""A step's layout (lp/lookahead/mask.py) as tensors on the device: at fixed shapes padded to its
bucket (lp/engine/fixed_steps.py), on a GPU packed into one buffer for one upload."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lp.jit import compiled
from lp.lookahead.mask import StepLayout

BUCKETS = (1, 16, 32, 64, 128, 256, 512)  # few graphs, little padding; plain decoding stays at 1
LARGE = 256  # beyond the last bucket, steps round up to a multiple of this


def bucket(tokens: int) -> int:
    """The padded size of a step of `tokens` tokens."""
    for size in BUCKETS:
        if tokens <= size:
            return size
    return -(-tokens // LARGE) * LARGE


@dataclass
class StepTensors:
    """A step layout on the device, padded to `block.shape[0]` tokens (pads: depth 0, row 0)."""

    block: torch.Tensor  # [B, B] bool: the step mask, pad tokens see only themselves
    depth: torch.Tensor  # [B] long: positions relative to x0
    rows: torch.Tensor  # [R] long, or [B] at fixed shapes (the used rows first)
    parents: torch.Tensor  # [n] long: the verification tree's parent pointers (-1: x0)
    size: int  # the real token count (the rest pads the bucket)
    n_rows: int  # R, the used logit rows

    @property
    def tree_depth(self) -> torch.Tensor:
        """`[n]` the tree nodes' depths (1: x0's children); they are the last real tokens."""
        n, used = self.parents.shape[0], self.size
        return self.depth[used - n : used]

    @property
    def tree_ancestors(self) -> torch.Tensor:
        """`[n, n]` bool: `[i, j]` iff node j is node i or one of its ancestors."""
        n, used = self.parents.shape[0], self.size
        return self.block[used - n : used, used - n : used]


def step_tensors(layout: StepLayout, device: torch.device, fixed: bool, packed: bool | None = None) -> StepTensors:
    """`layout` on the device: padded to its bucket when `fixed`, else exactly its used tokens and
    R used rows. `packed` (default: on a GPU): its four arrays travel as one buffer, in one
    copy from pinned memory that does not block the host, rather than four (most steps of a
    real decode bring a new tree, so this runs after most message reads, before the forward);
    on a CPU they are used where they lie, so the tensors share memory with the cached `layout`
    (nothing writes them)."""
    used, R = layout.size, len(layout.logit_rows)
    # an N = 2 window reads its columns' rows off tokens fed anyway: at most one row more than tokens
    B = bucket(max(used, R)) if fixed else used
    kind = device.type
    if not (kind == "cuda" if packed is None else packed):
        if fixed:
            block, depth, rows = _padded(layout.mask, layout.depth, layout.logit_rows, B)
        else:
            block, depth, rows = layout.mask, layout.depth, layout.logit_rows
        tensors = [torch.from_numpy(a) for a in (block, depth, rows, layout.parents)]
        return StepTensors(*(tensors if kind == "cpu" else (t.to(device) for t in tensors)), used, R)
    n_rows = B if fixed else R
    host = torch.from_numpy(_packed(layout.mask, layout.depth, layout.logit_rows, layout.parents, B, n_rows))
    pinned = kind == "cuda"  # a pageable host-to-device copy would wait for the device
    buf = (host.pin_memory() if pinned else host).to(device, non_blocking=pinned)
    values = buf[_head(B) :].view(torch.int64)
    return StepTensors(
        buf[: B * B].view(torch.bool).view(B, B), values[:B], values[B : B + n_rows], values[B + n_rows :], used, R
    )


@compiled
def _head(B: int) -> int:
    """Bytes of a packed layout before its int64 arrays: the `[B, B]` mask's, rounded up to 8
    (aligned views)."""
    return -(-B * B // 8) * 8


@compiled
def _pad(
    mask: np.ndarray, depth: np.ndarray, rows: np.ndarray, block: np.ndarray, depth_to: np.ndarray, rows_to: np.ndarray
) -> None:
    """A layout's mask, depths and logit rows written padded into the zeroed `block` `[B, B]`,
    `depth_to` `[B]` and `rows_to`: pad tokens see only themselves, at depth 0; pad rows read
    row 0."""
    used = len(depth)
    for i in range(used):
        for j in range(used):
            block[i, j] = mask[i, j]
    for i in range(used, block.shape[0]):
        block[i, i] = True
    depth_to[:used] = depth
    rows_to[: len(rows)] = rows


@compiled
def _padded(mask: np.ndarray, depth: np.ndarray, rows: np.ndarray, B: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A layout's mask, depths and logit rows padded to B tokens (`_pad`), as three arrays."""
    block, depth_to, rows_to = np.zeros((B, B), np.bool_), np.zeros(B, np.int64), np.zeros(B, np.int64)
    _pad(mask, depth, rows, block, depth_to, rows_to)
    return block, depth_to, rows_to


@compiled
def _packed(
    mask: np.ndarray, depth: np.ndarray, rows: np.ndarray, parents: np.ndarray, B: int, n_rows: int
) -> np.ndarray:
    """A layout padded to B tokens (`_pad`, its rows to `n_rows`) as one byte buffer: the `[B, B]`
    mask, then from byte `_head(B)` the int64 depths, rows and tree parents. (Compiled: on a GPU
    it runs after most message reads, as a new tree brings a new layout.)"""
    head = _head(B)
    buffer = np.zeros(head + 8 * (B + n_rows + len(parents)), np.uint8)
    values = buffer[head:].view(np.int64)
    _pad(mask, depth, rows, buffer[: B * B].view(np.bool_).reshape((B, B)), values[:B], values[B : B + n_rows])
    values[B + n_rows :] = parents
    return buffer


def compile_kernels() -> None:
    """Compile the layout's padding and packing, or load them from numba's cache, on a tiny
    layout: before a decode's clock starts rather than in its first step."""
    mask, depth, rows = np.ones((1, 1), np.bool_), np.zeros(1, np.int64), np.zeros(1, np.int64)
    _padded(mask, depth, rows, 2)
    _packed(mask, depth, rows, depth, 2, 2)


__all__ = ["BUCKETS", "LARGE", "StepTensors", "bucket", "compile_kernels", "step_tensors"]

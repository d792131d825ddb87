"""Fixed-shape steps, replayed as CUDA graphs.

At batch 1 a step's forward is hundreds of small kernels, and on a GPU their launch cost is a
large share of the step. A CUDA graph replays them all with one launch, but only for fixed
shapes and fixed buffers. So here a step is padded to a bucket of `BUCKET` tokens, its KV is
scattered into the preallocated cache at positions held on the device, and it attends over the
whole cache buffer under a `[T, capacity]` mask that hides the unwritten tail: nothing in the
captured work depends on the committed length, which only the (uncaptured) buffer fills read.
Pad tokens attend only to themselves; their KV lands after the step's and is overwritten like
any speculative token's.

Each bucket is captured on its first use. Without CUDA the same fixed-shape step runs eagerly,
which is how it is tested against the dynamic step on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lp.lookahead.mask import StepLayout

BUCKET = 16  # step sizes are rounded up to a multiple of this: few graphs, little padding
CAPACITY_QUANTUM = 1024  # KV capacity grows in these units, so graphs survive across prompts


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def bucket(tokens: int) -> int:
    return _round_up(tokens, BUCKET)


@dataclass
class PaddedLayout:
    """A step layout padded to its bucket, on the device."""

    block: torch.Tensor  # [S, S] bool: the step mask, pad tokens see only themselves
    depth: torch.Tensor  # [S] long (pads: 0)
    rows: torch.Tensor  # [S] long: the used logit rows first (pads: 0)
    size: int  # T, the real token count
    n_rows: int  # R, the used logit rows


def pad_layout(layout: StepLayout, device: torch.device) -> PaddedLayout:
    T, S = layout.size, bucket(layout.size)
    block = np.eye(S, dtype=bool)
    block[:T, :T] = layout.mask
    depth = np.zeros(S, dtype=np.int64)
    depth[:T] = layout.depth
    rows = np.zeros(S, dtype=np.int64)
    rows[:len(layout.logit_rows)] = layout.logit_rows
    to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return PaddedLayout(to(block), to(depth), to(rows), T, len(layout.logit_rows))


class _Bucket:
    """Static input/output buffers of one step size S, and its graph once captured."""

    def __init__(self, S: int, capacity: int, device: torch.device) -> None:
        self.ids = torch.zeros(S, dtype=torch.long, device=device)
        self.positions = torch.zeros(S, dtype=torch.long, device=device)
        self.write_at = torch.zeros(S, dtype=torch.long, device=device)
        self.rows = torch.zeros(S, dtype=torch.long, device=device)
        self.mask = torch.zeros((1, 1, S, capacity), dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class StaticSteps:
    """Runs steps through fixed-shape buckets of a worker's model and KV cache."""

    slack = BUCKET  # a padded step may write up to this many tokens past the real one

    def __init__(self, body: torch.nn.Module, head: torch.nn.Module, kv, device: torch.device) -> None:
        self.body, self.head, self.kv, self.device = body, head, kv, device
        self.capture = device.type == "cuda"
        self.pool = None
        self._buckets: dict[int, _Bucket] = {}
        self._capacity = 0

    def reserve(self, capacity: int) -> int:
        """The KV capacity to allocate for at least `capacity` tokens; a larger one than
        before drops the captured graphs (their mask width and KV buffers change)."""
        capacity = _round_up(capacity, CAPACITY_QUANTUM)
        if capacity > self._capacity:
            self._buckets.clear()
            self._capacity = capacity
        return self._capacity

    def _forward(self, b: _Bucket) -> torch.Tensor:
        self.kv.write_at = b.write_at
        try:
            out = self.body(input_ids=b.ids[None], position_ids=b.positions[None], attention_mask=b.mask,
                            past_key_values=self.kv, use_cache=True)
        finally:
            self.kv.write_at = None
        return self.head(out.last_hidden_state[0].index_select(0, b.rows))

    def _capture(self, b: _Bucket) -> None:
        """Warm up on a side stream (as torch requires), then record the forward."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        b.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(b.graph, pool=self.pool):
            b.logits = self._forward(b)

    def step(self, ids: torch.Tensor, layout: PaddedLayout, x0_position: int) -> torch.Tensor:
        """Logits `[R, vocab]` of the step; valid until the next step of the same bucket."""
        S, T, c = layout.block.shape[0], layout.size, self.kv.length
        b = self._buckets.get(S)
        if b is None:
            b = self._buckets[S] = _Bucket(S, self._capacity, self.device)
        # Fill the static inputs (plain device ops, outside the graph).
        b.ids[:T].copy_(ids)
        torch.add(layout.depth, x0_position, out=b.positions)
        torch.arange(c, c + S, out=b.write_at)
        b.rows.copy_(layout.rows)
        b.mask.zero_()
        b.mask[0, 0, :, :c] = True
        b.mask[0, 0, :, c:c + S] = layout.block
        if not self.capture:
            return self._forward(b)[:layout.n_rows]
        if b.graph is None:
            self._capture(b)
        b.graph.replay()
        return b.logits[:layout.n_rows]

"""Fixed-shape steps: buckets of static buffers, compiled and captured as CUDA graphs.

At small batches a step's forward is hundreds of small kernels, and on a GPU their launch cost is
a large share of the step. A CUDA graph replays them all with one launch, but only for fixed
shapes and fixed buffers. So a packed step (lp/engine/packed.py) is padded to a bucket size B;
its per-token arrays (ids, positions, slots, what each token sees) are copied into the bucket's
static buffers; its KV goes to the slots they name; and its attention reads the whole cache under
the visibility rule evaluated on the device (a dense mask, or with `attention=flex` a
FlexAttention block mask that visits only the step's pages: lp/engine/attention.py). Nothing captured depends on a
host value, and the cache never moves, so each bucket is compiled and captured once per process
and replayed for every later step. A capture that fails stores nothing. Pad tokens write to the
pad page and see only its first slot; pad rows read row 0, and are dropped.

The kept drafts' KV (`move`) is captured too, per bucket of moved slots.

Without CUDA the same fixed-shape steps run eagerly, which is how they are tested on CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from lp.engine.attention import FLEX_BLOCK, Dense, FlexMask, Visibility
from lp.engine.forward import Forward, StepInputs
from lp.engine.kv import KVCache
from lp.engine.packed import PackedStep, PackedTensors, bucket, buckets, flex_blocks, padded
from lp.errors import LPError
from lp.models import cache_dir

log = logging.getLogger(__name__)

PER_TOKEN = ("ids", "positions", "slots", "rows", "depth", "owner", "length", "base", "size")


class _Bucket:
    """Static inputs of one step size B, its output, and its graph once captured."""

    def __init__(self, B: int, kv: KVCache, flex: bool, groups: int, device: torch.device) -> None:
        self.B = B
        self.arrays = {name: torch.zeros(B, dtype=torch.long, device=device) for name in PER_TOKEN}
        self.block = torch.eye(B, dtype=torch.bool, device=device)
        a = self.arrays
        self.visible = Visibility(
            a["owner"], a["length"], a["base"], a["size"], self.block, kv.pool.owner, kv.pool.index
        )
        self.attend = FlexMask(self.visible, kv.slots) if flex else Dense(self.visible, kv.slots, groups)
        self.inputs = StepInputs(a["ids"], a["positions"], a["slots"], a["rows"], self.attend)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class FixedSteps:
    """Runs packed steps through fixed-shape buckets of one forward and its KV cache."""

    def __init__(
        self, forward: Forward, kv: KVCache, device: torch.device, flex: bool, compile: bool, groups: int = 1
    ) -> None:
        """`compile`: run `forward.compiled()`, compiled once per bucket (and per worker); `groups`:
        query heads a kv head (a dense mask's folded rows on CUDA)."""
        self.kv, self.device, self.flex, self.compiled, self.groups = kv, device, flex, compile, groups
        self.capture = device.type == "cuda"
        if compile:
            # One compiled graph per bucket (and per worker): more than dynamo's default allows.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            # Inductor's on-disk cache, kept with lp's models: later processes compile much faster.
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        self.forward = forward.compiled() if compile else forward
        self._buckets: dict[int, _Bucket] = {}
        self._moves: dict[int, tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph]] = {}
        self.capture_seconds: dict[int, float] = {}  # per bucket: compile (if any) + warm-up + capture

    def run(self, b: _Bucket) -> torch.Tensor:
        """Bucket b's forward on its static inputs (what a graph records)."""
        if isinstance(b.attend, Dense):
            b.attend.refresh()
        return self.forward(b.inputs)

    @torch.inference_mode()  # as steps run: a compiled graph's guards include the grad mode
    def prepare(self, fewest: int, most: int) -> None:
        """Compile (and capture, on a GPU) every bucket of steps of `fewest` to `most` tokens now
        rather than in the middle of a decode, where one bucket's compile and capture takes
        seconds. Its forwards write only the pad page."""
        for B in np.unique(buckets(np.arange(fewest, most + 1))).tolist():
            self._ready(B)

    def _ready(self, B: int) -> _Bucket:
        """Bucket B, built (and compiled and captured) if it is new; stored only once it works."""
        b = self._buckets.get(B)
        if b is not None:
            return b
        b = _Bucket(B, self.kv, self.flex, self.groups, self.device)
        if isinstance(b.attend, FlexMask):  # until a step says more, every query block visits the pad page's block
            b.attend.counts.fill_(1)
        t0 = time.perf_counter()
        if self.capture:
            b.graph, b.logits = self._capture(f"the step of {B} tokens", lambda: self._record(b))
        elif self.compiled:
            self.run(b)  # compiles B's graph
        if self.capture or self.compiled:
            self.capture_seconds[B] = time.perf_counter() - t0
            log.info(
                "lp: step size %d compiled%s in %.1f s (once per process)",
                B,
                " and captured" if self.capture else "",
                self.capture_seconds[B],
            )
        self._buckets[B] = b
        return b

    def _capture(
        self, what: str, record: Callable[[], tuple[torch.cuda.CUDAGraph, torch.Tensor]]
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """`record()`'s graph and its output, or an LPError that leaves nothing of the attempt."""
        try:
            return record()
        except Exception as e:  # noqa: BLE001 - any failure: the graph must not be replayed
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            raise LPError(
                f"capturing {what} as a CUDA graph failed ({type(e).__name__}: {reason}); "
                "graphs=false runs steps without graphs"
            ) from e

    def _record(self, b: _Bucket) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm up (and compile) on a side stream, as torch requires, then record the forward
        into a private memory pool: no other graph shares or frees its memory."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.run(b)
        return graph, logits

    def step(self, step: PackedStep) -> tuple[torch.Tensor, PackedTensors]:
        """Logits `[R, vocab]` of the step (valid until the next step of the same bucket) and the
        step on the device (its bucket's buffers)."""
        T, R = step.tokens, len(step.rows)
        b = self._ready(bucket(max(T, R)))
        host = padded(step, b.B)
        pinned = self.device.type == "cuda"  # a pageable copy to a GPU would wait for it
        for name in PER_TOKEN:
            src = torch.from_numpy(host[name])
            b.arrays[name].copy_(src.pin_memory() if pinned else src, non_blocking=pinned)
        block = torch.from_numpy(host["block"])
        b.block.copy_(block.pin_memory() if pinned else block, non_blocking=pinned)
        if isinstance(b.attend, FlexMask):
            b.attend.update(*(torch.from_numpy(a) for a in flex_blocks(step, b.B, self.kv.slots // FLEX_BLOCK)))
        parents = torch.from_numpy(step.parents).to(self.device)
        a = b.arrays
        on = PackedTensors(step, a["ids"], a["positions"], a["slots"], a["rows"], a["depth"], parents, b.visible)
        if not self.capture:
            return self.run(b)[:R], on
        b.graph.replay()
        return b.logits[:R], on

    @torch.inference_mode()
    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`KVCache.move` of `src` onto `dst` slots: on a GPU one graph replay per bucket of moved
        slots (padded with slot 0 onto itself), not two launches per layer."""
        if not self.capture:
            self.kv.move(src, dst)
            return
        src_in, dst_in, graph = self._ready_move(src.shape[0])
        src_in.zero_()
        dst_in.zero_()
        src_in[: src.shape[0]].copy_(src)
        dst_in[: dst.shape[0]].copy_(dst)
        graph.replay()

    @torch.inference_mode()
    def prepare_moves(self, most: int) -> None:
        """Capture the moves of up to `most` slots now (on a GPU), not inside a decode."""
        if self.capture:
            for n in np.unique(buckets(np.arange(1, most + 1))).tolist():
                self._ready_move(n)

    def _ready_move(self, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph]:
        """The captured move of a bucket of `count` slots and its static inputs (from, to)."""
        n = bucket(count)
        if n not in self._moves:
            ins = [torch.zeros(n, dtype=torch.long, device=self.device) for _ in range(2)]

            def record() -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
                self.kv.move(*ins)  # lazy initialisation outside the recording
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.kv.move(*ins)
                return graph, ins[0]

            self._moves[n] = (*ins, self._capture("the kept drafts' KV move", record)[0])
        return self._moves[n]


__all__ = ["FixedSteps"]

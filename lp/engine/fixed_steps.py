"""Fixed-shape steps: buckets of static buffers, compiled and captured as CUDA graphs.

At batch 1 a step's forward is hundreds of small kernels, and on a GPU their launch cost is a
large share of the step. A CUDA graph replays them all with one launch, but only for fixed
shapes and fixed buffers. So a step is padded to a bucket size B; its inputs are copied into
the bucket's static buffers; its KV goes to the cache slots that the device-held committed
length names (lp/engine/kv.py); and its attention reads the whole cache under a mask made on the
device from that length (lp/engine/attention.py). Nothing captured depends on a host value, and the
cache never moves, so each bucket is compiled and captured once per process and replayed for
every later step of every prompt. A decode's reset prepares every bucket its steps can reach,
so none is compiled or captured while a decode is timed; a capture that fails stores nothing.
Pad tokens see only themselves; their KV lands after the step's and is overwritten like any
speculative token's.

Without CUDA the same fixed-shape steps run eagerly, which is how they are tested on CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

from lp.engine.attention import FlexMask
from lp.engine.forward import Forward, StepInputs
from lp.engine.kv import KVCache
from lp.engine.step_tensors import StepTensors, bucket
from lp.errors import LPError
from lp.message import CHECK_MOD, pack
from lp.models import cache_dir
from lp.verify.greedy import greedy_accept

log = logging.getLogger(__name__)


class _Bucket:
    """Static inputs of one step size B, its output, and its graph once captured."""

    def __init__(self, B: int, kv: KVCache, flex: bool, device: torch.device) -> None:
        block = torch.eye(B, dtype=torch.bool, device=device)
        self.inputs = StepInputs(
            ids=torch.zeros(B, dtype=torch.long, device=device),
            positions=torch.zeros(B, dtype=torch.long, device=device),
            block=block,
            rows=torch.zeros(B, dtype=torch.long, device=device),
            extent=kv.capacity,
            flex=FlexMask(kv.start, block, kv.capacity) if flex else None,
        )
        self.layout: StepTensors | None = None  # the layout whose block and rows are loaded
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class PlainGreedy:
    """Greedy plain decoding (`mode=ar`) held on the device: the next step's input token and
    position, and the output's length and checksum that its messages carry. `message` turns a
    step's logits into its message (lp/message.py) and moves all four on without a host value,
    so a whole step, forward to message, can be captured as one CUDA graph."""

    def __init__(self, device: torch.device) -> None:
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.checksum = torch.zeros((), dtype=torch.long, device=device)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The state: the next input token, its position, the output's length and checksum."""
        return self.token, self.position, self.length, self.checksum

    def start(self, token: torch.Tensor, position: int, length: int, checksum: int) -> None:
        """The first step's input `token` (`[1]`, on the device) at sequence `position`."""
        self.token.copy_(token)
        self.position.fill_(position)
        self.length.fill_(length)
        self.checksum.fill_(checksum)

    def message(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's message from its logits `[1, vocab]`; the state moves to the next step."""
        y1 = logits[0].argmax()
        none = y1.new_zeros(0)
        acc = greedy_accept(y1, none, none, none, none.new_zeros((0, 0), dtype=torch.bool), none, 1)
        message = pack(y1, acc, 0, none, self.length, self.checksum, 0)
        self.token.copy_(y1)
        self.position.add_(1)
        self.length.add_(1)
        self.checksum.mul_(31).add_(y1).remainder_(CHECK_MOD)
        return message


def buckets_between(fewest: int, most: int) -> list[int]:
    """The buckets of every step size from `fewest` to `most` tokens."""
    return sorted({bucket(t) for t in range(fewest, most + 1)})


class FixedSteps:
    """Runs steps through fixed-shape buckets of one forward and its KV cache."""

    def __init__(self, forward: Forward, kv: KVCache, device: torch.device, flex: bool, compile: bool) -> None:
        """`compile`: run `forward.compiled()`, compiled once per bucket (and per worker)."""
        self.kv, self.device, self.flex, self.compiled = kv, device, flex, compile
        self.capture = device.type == "cuda"
        if compile:
            # One compiled graph per bucket (and per worker): more than dynamo's default allows.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            # Inductor's on-disk cache, kept with lp's models: later processes compile much faster.
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        self.run = forward.compiled() if compile else forward
        # a plain step's argmax and message compiled too: the whole greedy step is compiled code
        self._message = (
            torch.compile(PlainGreedy.message, fullgraph=True, dynamic=False) if compile else PlainGreedy.message
        )
        self._buckets: dict[int, _Bucket] = {}
        self._greedy: tuple[PlainGreedy, torch.cuda.CUDAGraph | None, torch.Tensor | None] | None = None
        self._keeps: dict[int, tuple[tuple[torch.Tensor, ...], torch.cuda.CUDAGraph]] = {}  # by path length
        self.capture_seconds: dict[int, float] = {}  # per bucket: compile (if any) + warm-up + capture

    @torch.inference_mode()  # as steps run: a compiled graph's guards include the grad mode
    def prepare(self, fewest: int, most: int, kept: int = 0) -> None:
        """Compile (and capture, on a GPU) every bucket that steps of `fewest` to `most` tokens
        use, and the `keep` of paths of `kept` nodes (0: none), now rather than in the middle
        of a decode, where one bucket's compile and capture takes seconds. Its forwards write
        only cache slots that the next step overwrites."""
        for B in buckets_between(fewest, most):
            self._ready(B)
        if kept and self.capture:
            self._ready_keep(kept)

    def _ready(self, B: int) -> _Bucket:
        """Bucket B, built (and compiled and captured) if it is new; stored only once it works."""
        b = self._buckets.get(B)
        if b is not None:
            return b
        b = _Bucket(B, self.kv, self.flex, self.device)
        if b.inputs.flex is not None:
            b.inputs.flex.update(self.kv.length)
        t0 = time.perf_counter()
        if self.capture:
            b.graph, b.logits = self._capture(f"the step of {B} tokens", lambda: self._record(b))
        elif self.compiled:
            self.run(b.inputs)  # compiles B's graph
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
                self.run(b.inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.run(b.inputs)
        return graph, logits

    def step(self, ids: torch.Tensor, layout: StepTensors, x0_position: int) -> torch.Tensor:
        """Logits `[R, vocab]` of the step; valid until the next step of the same bucket."""
        used = layout.size
        b = self._ready(layout.block.shape[0])  # prepared at the decode's reset
        x = b.inputs
        x.ids[:used].copy_(ids, non_blocking=True)
        torch.add(layout.depth, x0_position, out=x.positions)
        if b.layout is not layout:  # copy only when the layout changes
            x.block.copy_(layout.block)
            x.rows.copy_(layout.rows)
            b.layout = layout
        if x.flex is not None:
            x.flex.update(self.kv.length)
        if not self.capture:
            return self.run(x)[: layout.n_rows]
        b.graph.replay()
        return b.logits[: layout.n_rows]

    @torch.inference_mode()
    def keep(self, path: torch.Tensor, offset: int, count: torch.Tensor) -> None:
        """`KVCache.keep` as one graph replay (captured at the decode's reset: `prepare`), not four
        launches per layer: for capturing steps only (lp/worker.py `keep`)."""
        (path_in, offset_in, count_in), graph = self._ready_keep(path.shape[0])
        path_in.copy_(path)
        offset_in.fill_(offset)
        count_in.copy_(count)
        graph.replay()

    def _ready_keep(self, D: int) -> tuple[tuple[torch.Tensor, ...], torch.cuda.CUDAGraph]:
        """The captured `KVCache.keep` of paths of D nodes and its static inputs (path, offset,
        count), warmed up and recorded with nothing to move: self-copies, the length + 0."""
        if D not in self._keeps:
            long = dict(dtype=torch.long, device=self.device)
            inputs = (torch.full((D,), -1, **long), torch.zeros((), **long), torch.zeros((), **long))

            def record() -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
                self.kv.keep(*inputs)  # lazy initialisation outside the recording
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.kv.keep(*inputs)
                return graph, inputs[0]

            self._keeps[D] = (inputs, self._capture("the kept drafts' KV move", record)[0])
        return self._keeps[D]

    def _greedy_step(self, state: PlainGreedy) -> torch.Tensor:
        """A whole plain greedy step, no host value in it: input, forward, message, committed."""
        x = self._ready(1).inputs  # any 1-token layout: block [[True]], row 0
        x.ids.copy_(state.token)
        x.positions.copy_(state.position)
        if x.flex is not None:
            x.flex.follow(self.kv.start)
        message = self._message(state, self.run(x))
        self.kv.start.add_(1)
        return message

    @torch.inference_mode()
    def greedy(self, state: PlainGreedy) -> torch.Tensor:
        """The message of the next plain greedy step of `state` (`PlainGreedy.message`); its
        token is committed on the device (the host's `kv.length` is the caller's to advance). On
        a GPU one graph replay: one launch a token. Eager elsewhere, the same ops."""
        self._ready(1)  # compiled (and captured) with the other buckets: never inside the recording
        if not self.capture:
            return self._greedy_step(state)
        if self._greedy is None or self._greedy[0] is not state:
            # the forward was warmed up (and compiled) with its bucket, the message is now: record
            # the whole step (compiling inside a recording may run kernels that it refuses)
            def record() -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
                if self.compiled:
                    kept = [t.clone() for t in state.tensors]
                    self._message(state, self.run(self._ready(1).inputs))
                    for t, value in zip(state.tensors, kept):
                        t.copy_(value)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # records, runs nothing: the state stays as it is
                    message = self._greedy_step(state)
                return graph, message

            self._greedy = (state, *self._capture("the greedy plain step", record))
        _, graph, message = self._greedy
        graph.replay()
        return message

"""`W=auto`: choose (W, N, G) to maximise tokens/s, not S.

Two measured inputs: the cost of one forward against its token count on this machine (a short
calibration, once per process) and the acceptance seen so far (S of the sequences already
decoded). The paper finds S - 1 growing linearly with the log of the per-step FLOPs; lp fits
that slope to what it has seen and picks, from a ladder of shapes of growing step size, the
one whose expected S divided by its relative step cost is largest. Plain decoding (one token
per step, cost 1) is always a candidate, so on hardware where extra tokens are expensive
`auto` never loses to autoregressive decoding by more than its occasional exploration.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lp.lookahead.mask import step_layout
from lp.worker import Worker

# (W, N, G) shapes of growing step size; G = W as the paper recommends.
LADDER: tuple[tuple[int, int, int], ...] = (
    (1, 3, 1), (2, 3, 2), (3, 4, 3), (5, 4, 5), (7, 5, 7), (10, 5, 10), (15, 5, 15),
    (20, 5, 20), (30, 5, 30), (45, 5, 45), (60, 5, 60),
)
PRIOR_SLOPE = 0.3  # S - 1 per doubling of step tokens before anything is seen (explore once)


def step_tokens(W: int, N: int, G: int, P: int = 1) -> int:
    """Tokens per rank in a step with all G candidates: input, row-0 prefix, levels, candidates."""
    total = 1 + (W - 1) + W * (N - 2) + G * (N - 1)
    return math.ceil(total / P)


@dataclass(frozen=True)
class CostCurve:
    """Median forward seconds against the number of step tokens, on this machine."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def relative(self, T: float) -> float:
        """Cost of a T-token step relative to a 1-token step (linear in between and beyond)."""
        return float(np.interp(T, self.tokens, self.seconds) if T <= self.tokens[-1] else
                     self.seconds[-1] + (T - self.tokens[-1]) * (self.seconds[-1] - self.seconds[-2])
                     / (self.tokens[-1] - self.tokens[-2])) / self.seconds[0]


@torch.inference_mode()
def calibrate(worker: Worker, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), context: int = 256,
              reps: int = 3) -> CostCurve:
    """Time one forward of each size after a `context`-token prefill (medians of `reps`); sizes
    and context shrink to what a short cache holds."""
    sizes = tuple(T for T in sizes if worker.step_slots(T) <= worker.capacity - worker.max_seq_len) or (1, 2)
    context = min(context, worker.max_seq_len)
    vocab = worker.vocab_size
    gen = torch.Generator().manual_seed(0)
    worker.reset(context, sizes[-1])
    worker.prefill(torch.randint(0, vocab, (context,), generator=gen).to(worker.device))
    seconds = []
    for T in sizes:
        layout = step_layout(T, 1, 2, range(0), 0)  # T causal tokens, logits for one row
        ids = torch.randint(0, vocab, (T,), generator=gen).to(worker.device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            worker.step(ids, layout, context + T - 1).argmax().item()  # .item(): wait for the device
            times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    # Costs cannot fall with more tokens; a dip is timer noise.
    return CostCurve(tuple(sizes), tuple(np.maximum.accumulate(seconds).tolist()))


@dataclass
class AutoTuner:
    """Chooses a shape per sequence and learns the S-vs-step-size slope from what it decodes."""

    cost: CostCurve
    world_size: int = 1
    explore_every: int = 8  # after this many plain sequences, try the cheapest shape again
    seen: list[tuple[int, float]] = field(default_factory=list)  # (step tokens, S) per sequence
    plain_streak: int = 0

    def slope(self) -> float:
        """Least-squares slope of S - 1 against log2(step tokens) through the origin."""
        xs = [(math.log2(T), s - 1) for T, s in self.seen if T > 1]
        den = sum(x * x for x, _ in xs)
        return sum(x * y for x, y in xs) / den if den else PRIOR_SLOPE

    def choose(self, allow_plain: bool = True) -> tuple[tuple[int, int, int] | None, str]:
        """The shape (or None for plain decoding) with the best expected tokens/s, and why."""
        b = self.slope()
        best, best_rate, best_T = None, 1.0 if allow_plain else -math.inf, 1
        for shape in LADDER:
            T = step_tokens(*shape, self.world_size)
            rate = (1 + b * math.log2(T)) / self.cost.relative(T)
            if rate > best_rate:
                best, best_rate, best_T = shape, rate, T
        basis = f"S - 1 = {b:.2f} x log2(step tokens), fitted on {len(self.seen)} sequence(s)" \
            if self.seen else f"prior slope {b:.2f} (nothing decoded yet)"
        if best is None and self.plain_streak >= self.explore_every:
            self.plain_streak = 0
            return LADDER[0], f"exploring W={LADDER[0][0]} N={LADDER[0][1]} G={LADDER[0][2]} ({basis})"
        if best is None:
            self.plain_streak += 1
            return None, f"plain decoding: no lookahead shape is expected to beat it ({basis})"
        W, N, G = best
        return best, (f"W={W} N={N} G={G}: a {best_T}-token step costs {self.cost.relative(best_T):.2f}x a "
                      f"1-token step, expected S {1 + b * math.log2(best_T):.2f}, so {best_rate:.2f}x the "
                      f"tokens/s of plain decoding ({basis})")

    def observe(self, shape: tuple[int, int, int] | None, compression: float) -> None:
        if shape is not None:
            self.seen.append((step_tokens(*shape, self.world_size), compression))

"""`W=auto`: choose the step's shape (W, N, G, tree budget) to maximise tokens/s, not S.

Two measured inputs: the cost of one forward against its token count on this machine and what
drafts add to a step (a short calibration, once per process), and the acceptance seen so far (S
of the sequences already decoded). The paper finds S - 1 growing linearly with the log of the per-step FLOPs; lp fits
that slope to what it has seen and picks, from a ladder of shapes of growing step size, the
one whose expected S divided by its relative step cost is largest. Plain decoding (one token
per step, cost 1) is always a candidate, so on hardware where extra tokens are expensive
`auto` never loses to autoregressive decoding by more than its occasional exploration.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm import tqdm

from lp.collective import Collective
from lp.config import SUCCESSORS
from lp.decode.ladder import LADDER, Shape, ladder, rank_tokens
from lp.engine.packed import bucket, buckets
from lp.engine.pages import PAGE
from lp.worker import STEP_ROOM, TIMED_CONTEXT, Worker

# S - 1 per doubling of a step's tokens before anything is decoded: the least-squares slope
# (through the origin, against log2 of the largest step) of the ladder's S in the budget sweep
# (results/sweep/spec_bench_48, 48 prompts at every size). `auto` refits it to what it decodes.
PRIOR_SLOPE = 0.30
# The prior weighs as this many steps of a 128-token shape in the fit (each sequence weighs its
# steps): a short decode (a server's warm-up, a 4-token answer) moves the slope a little, not to
# its own S, and a couple of real sequences outweigh it.
PRIOR_STEPS = 8
# A bigger step must promise this factor more tokens/s than the cheaper choice to replace it
# (beside other sequences, this factor more of the one sequence's share of them). Calibration
# timings on a shared machine vary by a few percent between runs; without a margin, near ties
# between shapes flip from run to run on the same input.
MARGIN = 1.1
# What drafts add to a step is timed on this many sequences, half of them feeding this many drafts
# (a step under load: some sequences' trees beside plain ones).
DRAFTING_BATCH, DRAFTING_NODES = 4, 4
# ... each after this many tokens of context (at most the curve's): what drafts add hardly depends on it
DRAFTING_CONTEXT = 128


@dataclass(frozen=True)
class CostCurve:
    """Median forward seconds against the number of step tokens, on this machine. `padded`:
    steps run at fixed shapes (lp/engine/fixed_steps.py), so a T-token step costs its bucket's
    forward. A plain decoding step is a one-token step, which lookahead's steps must beat.
    `drafting`: what a step that verifies drafts costs beyond its size's forward (the successors'
    top-k over its rows and, in a batch, the drafting sequences' own attention group: `calibrate`
    times it on a batch), so a step of T tokens with drafts costs `seconds_at(T) + drafting`."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    padded: bool = False
    drafting: float = 0.0

    def seconds_at(self, T: float) -> float:
        """Seconds of a T-token forward (linear in between and beyond the measured sizes)."""
        return float(self.seconds_of(np.array([T]))[0])

    def seconds_of(self, T: np.ndarray) -> np.ndarray:
        """`seconds_at` of every size in `T` at once. Beyond the largest size, the last two sizes'
        slope (none, if their costs dip: a bucket's can, and a longer step never costs less)."""
        if self.padded:
            T = buckets(np.ceil(T).astype(np.int64))
        t, s = self.tokens, self.seconds
        slope = max(0.0, (s[-1] - s[-2]) / (t[-1] - t[-2])) if len(t) > 1 else 0.0
        return np.where(T <= t[-1], np.interp(T, t, s), s[-1] + (T - t[-1]) * slope)

    @property
    def plain_seconds(self) -> float:
        """Seconds of a plain decoding step: a one-token forward's."""
        return self.seconds_at(1)


def calibrate(worker: Worker, reps: int = 5, world_size: int = 1, progress: bool = False) -> CostCurve:
    """W=auto's step costs: `step_costs` at its default sizes, then what drafts add to a step
    (`CostCurve.drafting`, `drafting_cost`)."""
    curve = step_costs(worker, reps=reps, world_size=world_size, progress=progress)
    return replace(curve, drafting=drafting_cost(worker, curve, reps))


@torch.inference_mode()
def step_costs(
    worker: Worker,
    sizes: tuple[int, ...] | None = None,
    reps: int = 5,
    world_size: int = 1,
    progress: bool = False,
) -> CostCurve:
    """Time one forward of each size after a `TIMED_CONTEXT`-token prefill (`_fastest` of `reps`), its
    logits of every row computed and read as a decode does; sizes and context shrink to what the
    cache holds. Default sizes: 1 to 256 tokens for exact-size steps, in powers of two and on
    both sides of each change of the forward's matmul kernels; with fixed-shape steps, every
    bucket that a ladder shape's rank share uses at `world_size` ranks, with one pending token or
    the most a step can have, so each is compiled and captured here, once per process, and not
    inside a decode that `auto` switches to a larger shape (on an H100 that made one SmolLM2 decode
    24 tok/s instead of 400). `progress`: a bar on a terminal (the first pass compiles and captures
    each bucket: minutes on a fresh GPU machine)."""
    padded = worker.fixed is not None
    if sizes is None and padded:
        shares = {
            rank_tokens(shape, world_size) - fewer
            for shape in ladder(world_size)
            for fewer in (0, shape.config.max_commit - 1)
        }
        sizes = tuple(sorted({bucket(T) for T in shares} | {1}))
    elif sizes is None:  # and both sides of each change of matmul kernel, where a step's cost jumps
        sizes = tuple(sorted({1, 2, 4, 8, 16, 32, 64, 128, 256} | {M for M in worker.kernels.switches if M <= 256}))
    positions = worker.max_seq_len + STEP_ROOM  # RoPE's table
    sizes = tuple(T for T in sizes if worker.step_slots(T) < min(worker.kv_tokens, positions)) or (1, 2)
    context = worker.timed_context(TIMED_CONTEXT, sizes[-1])
    gen = torch.Generator().manual_seed(0)
    with worker.random_sequences([context], sizes[-1], gen) as kvs:
        steps = [worker.random_step(kvs, [T], gen) for T in sizes]  # T causal tokens after the context
        bar = tqdm(total=reps * len(sizes), desc="W=auto: timing step sizes", disable=None if progress else True)
        seconds = _fastest([lambda step=step: worker.run(step)[0] for step in steps], reps, bar.update)
        bar.close()
    # An exact-size step's cost cannot fall with more tokens (a dip is timer noise); a bucket's can:
    # each runs its own kernels (on an H200 a 64-token bucket cost 10.9 ms, a 128-token one 7.3)
    return CostCurve(tuple(sizes), tuple(seconds if padded else np.maximum.accumulate(seconds).tolist()), padded)


@torch.inference_mode()
def drafting_cost(worker: Worker, curve: CostCurve, reps: int) -> float:
    """What drafts add to a step beyond its size's forward: a batch of `DRAFTING_BATCH` sequences
    (`DRAFTING_CONTEXT` tokens each, at most the curve's context) whose step feeds one token each,
    against the same step where half of them feed `DRAFTING_NODES` drafts more (their own attention
    group, as a step's tree nodes beside plain sequences make) and every row's top-k SUCCESSORS
    are taken; less what the curve says the added tokens cost (fastest of `reps`, at least 0; 0
    where the cache holds no such batch: the context shrinks to what it lends). One sequence's curve misses this, and
    under load it decides whether a few nodes pay (on a 2-core Xeon: 3 ms on a 41 ms step)."""
    B, m = DRAFTING_BATCH, DRAFTING_NODES
    context = min(worker.timed_context(TIMED_CONTEXT, curve.tokens[-1]), DRAFTING_CONTEXT)
    context = min(context, worker.kv.pool.lendable // B * PAGE - (1 + m))
    if context < 1:
        return 0.0
    gen = torch.Generator().manual_seed(1)
    with worker.random_sequences([context] * B, 1 + m, gen) as kvs:
        plain = worker.random_step(kvs, [1] * B, gen)
        drafted = worker.random_step(kvs, [1 + (m if i % 2 else 0) for i in range(B)], gen)

        def with_drafts() -> torch.Tensor:
            logits = worker.run(drafted)[0]
            logits.topk(SUCCESSORS, dim=-1)
            return logits

        best = _fastest([lambda: worker.run(plain)[0], with_drafts], reps)
    added = curve.seconds_at(B + m * (B // 2)) - curve.seconds_at(B)
    return max(0.0, best[1] - best[0] - added)


def _fastest(
    runs: list[Callable[[], torch.Tensor]], reps: int, tick: Callable[[], object] = lambda: None
) -> list[float]:
    """Each of `runs` (a step returning its logits) timed `reps` times, in turn rep after rep so that
    a slow spell of the machine touches all of them, up to its logits' argmax read (waiting for the
    device, as a decode's read does): the fastest of each, since other load only ever adds time."""
    seconds = [math.inf] * len(runs)
    for _ in range(reps):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            run().argmax(dim=-1)[0].item()
            seconds[i] = min(seconds[i], time.perf_counter() - t0)
            tick()
    return seconds


def calibrate_ranks(worker: Worker, comm: Collective, world_size: int) -> CostCurve:
    """`calibrate` on every rank of `comm`, each size (and what drafts add) at the slowest rank's
    cost, so all ranks choose alike; `world_size`: the LP replicas that split a step."""
    mine = calibrate(worker, world_size=world_size, progress=comm.is_main)
    timed = (*mine.seconds, mine.drafting)
    micros = torch.tensor([round(s * 1e6) for s in timed], dtype=torch.long, device=comm.device)
    *slowest, drafting = (x / 1e6 for x in comm.all_gather(micros).max(dim=0).values.cpu().tolist())
    return CostCurve(mine.tokens, tuple(slowest), mine.padded, drafting)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class AutoTuner:
    """Chooses a shape per sequence and learns the S-vs-step-size slope from what it decodes."""

    cost: CostCurve
    world_size: int = 1
    explore_every: int = 8  # after this many plain sequences, try the cheapest shape again
    plain_streak: int = 0
    learned: int = 0  # sequences the slope is fitted on
    # the fit's sums (`slope`), the prior's to start: kept as sequences come (the budget asks each step)
    _num: float = PRIOR_STEPS * math.log2(128) ** 2 * PRIOR_SLOPE
    _den: float = PRIOR_STEPS * math.log2(128) ** 2

    def slope(self) -> float:
        """Least-squares slope of S - 1 against log2(step tokens) through the origin, each sequence
        weighing its steps, the prior `PRIOR_STEPS` steps at 128 tokens."""
        return self._num / self._den

    def expect(self, shape: Shape | None, others: int = 0) -> tuple[float, float, float]:
        """(expected S, tokens/s, tokens/s relative to plain decoding) of a shape (None: plain): S
        from the whole step's tokens, the cost from a rank's share of them; with `others`
        sequences of one token each in the same steps, the tokens/s of them all."""
        cost = self.cost
        plain = (others + 1) / cost.seconds_at(others + 1)
        if shape is None:
            return 1.0, plain, 1.0
        S = 1 + self.slope() * math.log2(rank_tokens(shape))
        rate = (others + S) / self._step_seconds(shape, others)
        return S, rate, rate / plain

    def choose(self, allow_plain: bool = True, others: int = 0) -> tuple[Shape | None, str]:
        """The cheapest shape (or plain decoding) that no bigger one beats by `MARGIN` in
        expected tokens/s (None: plain decoding), and why, in plain words; `others`: sequences
        decoding beside it in the same steps (a step's tokens cost more where it has many)."""
        best, best_rate = None, 1.0 if allow_plain else -math.inf
        margin = 1 + (MARGIN - 1) / (others + 1)
        # shapes whose steps the calibration timed (a longer one's cost would be extrapolated)
        for shape in (s for s in ladder(self.world_size) if rank_tokens(s, self.world_size) <= self.cost.tokens[-1]):
            rate = self.expect(shape, others)[2]
            if rate > best_rate * margin:
                best, best_rate = shape, rate
        b, n = self.slope(), self.learned
        basis = (
            f"acceptance fitted on {_plural(n, 'sequence')}: S - 1 = {b:.2f} x log2(step tokens)"
            if n
            else f"nothing decoded yet, so the typical S - 1 = {b:.2f} x log2(step tokens)"
        )
        beside = f" beside {_plural(others, 'other sequence')}" if others else ""
        if best is None and self.plain_streak >= self.explore_every:
            self.plain_streak = 0
            best = LADDER[0]
            reason = (
                f"{best.describe()}, to measure acceptance again after "
                f"{_plural(self.explore_every, 'plain sequence')} ({basis})"
            )
        elif best is None:
            self.plain_streak += 1
            T = rank_tokens(LADDER[0], self.world_size)
            reason = (
                f"plain decoding: even the cheapest lookahead step ({LADDER[0].describe()}, {T} tokens{beside}) "
                f"{self._outlook(LADDER[0], others, 'only ')} ({basis})"
            )
        else:
            T = rank_tokens(best, self.world_size)
            reason = f"{best.describe()}: its {T}-token step{beside} {self._outlook(best, others)} ({basis})"
        return best, reason

    def _step_seconds(self, shape: Shape, others: int) -> float:
        """A step of a shape's rank share, beside `others` one-token sequences, drafts' cost included."""
        return self.cost.seconds_at(others + rank_tokens(shape, self.world_size)) + self.cost.drafting

    def _outlook(self, shape: Shape, others: int = 0, only: str = "") -> str:
        """What a shape's step costs and is expected to make, in words."""
        S, _, rate = self.expect(shape, others)
        extra = self._step_seconds(shape, others) / self.cost.seconds_at(others + 1)
        return (
            f"costs {extra:.2f}x a plain step here and is expected to make "
            f"{only}{S:.2f} tokens, {rate:.2f}x the speed of plain decoding"
        )

    def observe(self, tokens: float, S: float, steps: int = 1) -> None:
        """Record the S a sequence achieved in `steps` steps of `tokens` tokens on average (a plain
        sequence's single tokens teach nothing)."""
        if tokens > 1:
            x = math.log2(tokens)
            self._num += steps * x * (S - 1)
            self._den += steps * x * x
            self.learned += 1

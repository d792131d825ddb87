"""`W=auto`: choose the step's shape (W, N, G, tree budget) to maximise tokens/s, not S.

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
import time
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DRAFT_LEN, NUMBER_OPTIONS, SUCCESSORS, DecodeConfig
from lp.decode.shares import share_cap
from lp.engine.step_tensors import BUCKETS, LARGE, bucket
from lp.lookahead.mask import step_layout
from lp.worker import Worker


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A lookahead step's shape: DecodeConfig's keys that W=auto chooses. W window columns, n-gram
    size N, G pool n-grams per first token; the step's size, `step_tokens`, and the tree's limit
    where it does not follow from it (`tree_tokens`); `successors` kept per token; text drafts
    from x0's lone matches too (`lone_matches`), of at most `draft_len` tokens; the text's
    continuations below each node (`continuation_len`)."""

    W: int
    N: int
    G: int
    step_tokens: int
    tree_tokens: int | None = None
    successors: int = SUCCESSORS
    lone_matches: bool = False
    draft_len: int = DRAFT_LEN
    continuation_len: int = 0

    @property
    def config(self) -> DecodeConfig:
        return DecodeConfig(**asdict(self))

    @classmethod
    def of(cls, cfg: DecodeConfig) -> Shape:
        """The shape `cfg` steps in: its size the largest step, its tree's limit where another than
        the size gives, the successors as its steps send them. A shape's steps take text drafts
        (`drafts` is not one of its keys): `cfg`'s without them are priced as if they could commit
        a text draft's length."""
        given = {f.name: getattr(cfg, f.name) for f in fields(cls)}  # every key, however many a shape has
        shape = cls(
            **{**given, "step_tokens": cfg.largest_step, "tree_tokens": None, "successors": cfg.successors_sent}
        )
        tree = cfg.tree_limit
        return shape if shape.config.tree_limit == tree else replace(shape, tree_tokens=tree)

    def _extras(self) -> list[tuple[str, str, object]]:
        """(name part, key, value) of the keys that differ from their defaults, in field order."""
        letters = {key: letter for letter, key in NUMBER_OPTIONS.items()}
        out = []
        for f in fields(self)[4:]:
            value = getattr(self, f.name)
            if value != f.default:
                out.append(("lone" if f.name == "lone_matches" else f"{letters[f.name]}{value}", f.name, value))
        return out

    @property
    def name(self) -> str:
        """The shape as lp.bench names configs: W3N3G15-L128-D14 (lp/bench/shapes.py)."""
        return f"W{self.W}N{self.N}G{self.G}-L{self.step_tokens}" + "".join(f"-{part}" for part, _, _ in self._extras())

    def describe(self) -> str:
        extra = "".join(f" {key}={'true' if v is True else v}" for _, key, v in self._extras())
        return f"W={self.W} N={self.N} G={self.G} step_tokens={self.step_tokens}{extra}"


# Shapes of growing step size (11 to 1,024 tokens). Up to 32 tokens, the tree gets what the
# pending tokens leave (one replica's x0 alone, P ranks' last commit) and text drafts come from
# x0's lone matches too (prompt lookup's fallback). A small window and a tree of the rest: at 11
# tokens, the size prompt lookup feeds, W1 N2 (no window token: the column is x0's own prediction;
# a tree of up to 9, so at most 10 tokens a step on one replica), above prompt lookup in every
# category; W1 N3 at 16; from 32, W3 N3, which gave the most S at 128 tokens (results/tree); more
# recycled successors from 512 tokens; text drafts of up to 14 tokens at 128 and 16 at 1,024, where
# each node also goes on as the text did after its token. The budget sweep measures them
# (results/sweep/spec_bench_48; its screens compare the shapes tried at 11, 128 and 1,024 tokens).
LADDER: tuple[Shape, ...] = (
    Shape(W=1, N=2, G=15, step_tokens=11, tree_tokens=9, lone_matches=True),
    Shape(W=1, N=3, G=15, step_tokens=16, tree_tokens=14, lone_matches=True),
    Shape(W=3, N=3, G=15, step_tokens=32, tree_tokens=26, lone_matches=True),
    Shape(W=3, N=3, G=15, step_tokens=64),
    Shape(W=3, N=3, G=15, step_tokens=128, draft_len=14),
    Shape(W=3, N=3, G=15, step_tokens=256),
    Shape(W=3, N=3, G=15, step_tokens=512, successors=16),
    Shape(W=3, N=3, G=15, step_tokens=1024, successors=16, draft_len=16, continuation_len=16),
)
# S - 1 per doubling of a step's tokens before anything is decoded: the least-squares slope
# (through the origin, against log2 of the largest step) of the ladder's S in the budget sweep
# (results/sweep/spec_bench_48, 48 prompts at every size). `auto` refits it to what it decodes.
PRIOR_SLOPE = 0.30
# A bigger step must promise this factor more tokens/s than the cheaper choice to replace it.
# Calibration timings on a shared machine vary by a few percent between runs; without a margin,
# near ties between shapes flip from run to run on the same input.
MARGIN = 1.1


def rank_tokens(shape: Shape, P: int = 1) -> int:
    """The most tokens one of P ranks feeds in a step of `shape`: the pending tokens on every rank,
    the window's columns and the tree split evenly (lp/partition.py balances them), at most the
    bucket its greedy shares are cut to (lp/decode/shares.py)."""
    cfg = shape.config
    even = cfg.max_commit + math.ceil((cfg.largest_step - cfg.max_commit) / P)
    return min(even, share_cap(cfg, P) or even)


def for_ranks(shape: Shape, P: int) -> Shape:
    """`shape` with its step sized for P ranks whose shares fill a bucket: its size cut to P
    shares of the largest bucket within an even share (unchanged where it is P of them already,
    as the ladder's are at powers of two of P, where an even share is under the least bucket but
    one, and on one rank)."""
    share = math.ceil(shape.step_tokens / P)
    B = max([b for b in BUCKETS[1:] if b <= share] + [share // LARGE * LARGE])
    if P == 1 or not B or P * B >= shape.step_tokens:  # a share under the least bucket past 1 is left so
        return shape
    return replace(shape, step_tokens=P * B)


def ladder(P: int = 1) -> tuple[Shape, ...]:
    """The ladder's shapes, each sized for P ranks (`for_ranks`)."""
    return tuple(for_ranks(shape, P) for shape in LADDER)


@dataclass(frozen=True)
class CostCurve:
    """Median forward seconds against the number of step tokens, on this machine. `padded`:
    steps run at fixed shapes (lp/engine/fixed_steps.py), so a T-token step costs its bucket's forward."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    padded: bool = False

    def seconds_at(self, T: float) -> float:
        """Seconds of a T-token forward (linear in between and beyond the measured sizes)."""
        if self.padded:
            T = bucket(math.ceil(T))
        return float(
            np.interp(T, self.tokens, self.seconds)
            if T <= self.tokens[-1]
            else self.seconds[-1]
            + (T - self.tokens[-1]) * (self.seconds[-1] - self.seconds[-2]) / (self.tokens[-1] - self.tokens[-2])
        )

    def relative(self, T: float) -> float:
        """Cost of a T-token step relative to a 1-token step."""
        return self.seconds_at(T) / self.seconds[0]


@torch.inference_mode()
def calibrate(
    worker: Worker, sizes: tuple[int, ...] | None = None, context: int = 256, reps: int = 5, world_size: int = 1
) -> CostCurve:
    """Time one forward of each size after a `context`-token prefill (fastest of `reps`); sizes
    and context shrink to what a short cache holds. Default sizes: 1 to 64 tokens for exact-size
    steps; with fixed-shape steps, every bucket that a ladder shape's rank share uses at
    `world_size` ranks, with one pending token or the most a step can have, so each is compiled
    and captured here, once per process, and not inside a decode that `auto` switches to a
    larger shape (on an H100 that made one SmolLM2 decode 24 tok/s instead of 400).

    The sizes are timed in turn, rep after rep, so a slow spell of the machine touches all of
    them instead of a few; and the fastest run is kept, since other load only ever adds time."""
    padded = worker.fixed is not None
    if sizes is None:
        sizes = (
            tuple(
                sorted(
                    {
                        bucket(rank_tokens(shape, world_size) - fewer)
                        for shape in ladder(world_size)
                        for fewer in (0, shape.config.max_commit - 1)
                    }
                    | {1}
                )
            )
            if padded
            else (1, 2, 4, 8, 16, 32, 64, 128)
        )
    sizes = tuple(T for T in sizes if worker.step_slots(T) <= worker.capacity - worker.max_seq_len) or (1, 2)
    context = min(context, worker.max_seq_len)
    vocab = worker.vocab_size
    gen = torch.Generator().manual_seed(0)
    worker.reset(context, sizes[-1])
    worker.prefill(torch.randint(0, vocab, (context,), generator=gen).to(worker.device))
    steps = [
        (
            step_layout(T, 1, 2, range(0), 0),  # T causal tokens, logits for one row
            torch.randint(0, vocab, (T,), generator=gen).to(worker.device),
        )
        for T in sizes
    ]
    seconds = [math.inf] * len(sizes)
    for _ in range(reps):
        for i, (T, (layout, ids)) in enumerate(zip(sizes, steps)):
            t0 = time.perf_counter()
            worker.step(ids, layout, context + T - 1).argmax().item()  # .item(): wait for the device
            seconds[i] = min(seconds[i], time.perf_counter() - t0)
    # Costs cannot fall with more tokens; a dip is timer noise.
    return CostCurve(tuple(sizes), tuple(np.maximum.accumulate(seconds).tolist()), padded)


def calibrate_ranks(worker: Worker, comm: Collective, world_size: int) -> CostCurve:
    """`calibrate` on every rank of `comm`, each size at the slowest rank's cost, so all ranks
    choose alike; `world_size`: the LP replicas that split a step."""
    mine = calibrate(worker, world_size=world_size)
    micros = torch.tensor([round(s * 1e6) for s in mine.seconds], dtype=torch.long, device=comm.device)
    slowest = comm.all_gather(micros).max(dim=0).values.cpu()
    return CostCurve(mine.tokens, tuple(x / 1e6 for x in slowest.tolist()), mine.padded)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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

    def expect(self, shape: Shape | None) -> tuple[float, float, float]:
        """(expected S, tokens/s, tokens/s relative to plain decoding) of a shape (None: plain): S
        from the whole step's tokens, the cost from a rank's share of them."""
        whole, share = (1, 1) if shape is None else (rank_tokens(shape), rank_tokens(shape, self.world_size))
        S = 1 + self.slope() * math.log2(whole)
        return S, S / self.cost.seconds_at(share), S / self.cost.relative(share)

    def choose(self, allow_plain: bool = True) -> tuple[Shape | None, str]:
        """The cheapest shape (or plain decoding) that no bigger one beats by `MARGIN` in
        expected tokens/s (None: plain decoding), and why, in plain words."""
        best, best_rate = None, 1.0 if allow_plain else -math.inf
        # shapes whose steps the calibration timed (a longer one's cost would be extrapolated)
        for shape in (s for s in ladder(self.world_size) if rank_tokens(s, self.world_size) <= self.cost.tokens[-1]):
            rate = self.expect(shape)[2]
            if rate > best_rate * MARGIN:
                best, best_rate = shape, rate
        b, n = self.slope(), len(self.seen)
        basis = (
            f"acceptance fitted on {_plural(n, 'sequence')}: S - 1 = {b:.2f} x log2(step tokens)"
            if n
            else f"nothing decoded yet, so the typical S - 1 = {b:.2f} x log2(step tokens)"
        )
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
                f"plain decoding: even the cheapest lookahead step ({LADDER[0].describe()}, {T} tokens) "
                f"{self._outlook(LADDER[0], 'only ')} ({basis})"
            )
        else:
            T = rank_tokens(best, self.world_size)
            reason = f"{best.describe()}: its {T}-token step {self._outlook(best)} ({basis})"
        return best, reason

    def _outlook(self, shape: Shape, only: str = "") -> str:
        """What a shape's step costs and is expected to make, in words."""
        S, _, rate = self.expect(shape)
        T = rank_tokens(shape, self.world_size)
        return (
            f"costs {self.cost.relative(T):.2f}x a one-token step here and is expected to make "
            f"{only}{S:.2f} tokens, {rate:.2f}x the speed of plain decoding"
        )

    def observe(self, shape: Shape | None, S: float) -> None:
        """Record the S a sequence achieved with `shape` (plain sequences teach nothing)."""
        if shape is not None:
            self.seen.append((rank_tokens(shape), S))

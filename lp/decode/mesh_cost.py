"""`tp=auto`: choose the mesh (T, P) of a world of ranks, and the cost model of a tensor-parallel group.

A world of T x P ranks is P LP replicas, each a tensor-parallel group of T ranks (lp/mesh.py).
A group's step is priced from one rank's step:

    step_T(n) = step_1(n) * (a + (1 - a) / T) + 2 * layers * (lat + 2 (T-1)/T * n * hidden * 2 B / bw)

`a` is the share of a step that tensor parallelism does not split (embedding, lm_head, norms,
launches), `lat` one all-reduce's latency and `bw` the all-reduce bus bandwidth (steps of n tokens
all-reduce n x hidden values, twice per layer). `a` and `lat` are fitted (least squares) to the
published tensor-parallel speedups of gpt-fast's README (PUBLISHED_TP), where the 1-token
all-reduce's bandwidth term is negligible; `bw` is assumed.

`choose` prices every mesh of a world with that model and lookahead's expected S (the prior of
lp/decode/auto.py: S - 1 grows with the log of the step's tokens, which P replicas share) and
returns the fastest, a shape with drafts paying what they add to a step as W=auto prices it. At run
time (lp/frontend/runtime.py) one rank's step costs, what drafts add, and the all-reduce and
all-gather latencies are measured; `a` stays the fitted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lp.decode.auto import PRIOR_SLOPE
from lp.decode.ladder import LADDER, Shape, ladder, rank_tokens

# gpt-fast README, Llama-2-7B bf16 batch 1 on 8x A100-80GB (330 W): tensor-parallel ranks -> tok/s
PUBLISHED_TP = {1: 104.9, 2: 168.8, 4: 254.0, 8: 328.4}
PUBLISHED_SOURCE = "gpt-fast README: Llama-2-7B bf16, batch 1, 8x A100-80GB power-limited to 330 W"
LLAMA_7B = {"layers": 32, "hidden": 4096}  # the published figures' model
GBPS = 150.0  # assumed all-reduce bus bandwidth (NVLink class)


@dataclass(frozen=True)
class GroupModel:
    """A tensor-parallel group's step from one rank's: the unsplit share `a`, one all-reduce's
    latency `lat_ms` and the bus bandwidth `gbps`, for a model of `layers` x `hidden`."""

    a: float
    lat_ms: float
    gbps: float = GBPS
    layers: int = LLAMA_7B["layers"]
    hidden: int = LLAMA_7B["hidden"]

    def allreduce_ms(self, T: int, tokens: float) -> float:
        """One step's all-reduces (two per layer), for steps of `tokens` tokens (2-byte values)."""
        if T == 1:
            return 0.0
        ring = 2 * (T - 1) / T * tokens * self.hidden * 2 / (self.gbps * 1e9) * 1e3
        return 2 * self.layers * (self.lat_ms + ring)

    def step_ms(self, one_gpu_ms: float, T: int, tokens: float) -> float:
        """A T-rank group's step of `tokens` tokens, from one rank's `one_gpu_ms`."""
        return one_gpu_ms * (self.a + (1 - self.a) / T) + self.allreduce_ms(T, tokens)

    def one_gpu_ms(self, group_ms: float, T: int, tokens: float) -> float:
        """The inverse of `step_ms`: one rank's step from a T-rank group's measured one."""
        return max(group_ms - self.allreduce_ms(T, tokens), 0.0) / (self.a + (1 - self.a) / T)


def fit(published: dict[int, float] = PUBLISHED_TP, layers: int = LLAMA_7B["layers"], gbps: float = GBPS) -> GroupModel:
    """`a` and the all-reduce latency that best reproduce the published 1-token speedups:
    1 / speedup(T) = a + (1 - a) / T + 2 * layers * lat / step_1, linear in a and lat."""
    step1 = 1e3 / published[1]
    Ts = [T for T in sorted(published) if T > 1]
    A = np.array([[1 - 1 / T, 2 * layers / step1] for T in Ts])
    b = np.array([published[1] / published[T] - 1 / T for T in Ts])
    (a, lat), *_ = np.linalg.lstsq(A, b, rcond=None)
    return GroupModel(float(a), float(lat), gbps, layers)


def group_sizes(world_size: int, *counts: int) -> list[int]:
    """Every T that divides the world size and each of the model's `counts` (heads, KV heads, ...)."""
    return [T for T in range(1, world_size + 1) if all(n % T == 0 for n in (world_size, *counts))]


@dataclass(frozen=True)
class PricedMesh:
    """A priced mesh: T ranks per replica, P replicas, the best lookahead shape for it (None:
    plain decoding), its expected S and tokens/s."""

    T: int
    P: int
    shape: Shape | None
    S: float
    tok_s: float

    def describe(self) -> str:
        shape = "plain decoding" if self.shape is None else self.shape.describe()
        return f"tp={self.T} x {self.P} replica{'s' if self.P > 1 else ''} ({shape}, {self.tok_s:.0f} tok/s)"


def priced_shapes(
    T: int,
    P: int,
    one_gpu_s: Callable[[float], float],
    model: GroupModel,
    allgather_ms: float,
    slope: float = PRIOR_SLOPE,
    S_of: Callable[[Shape, int], float] | None = None,
    drafting_s: float = 0.0,
) -> list[PricedMesh]:
    """The mesh (T, P) at every ladder shape sized for P (and plain decoding with P = 1): S from
    `S_of(shape, P)` (default: the prior from the step's tokens, which P replicas share), cost
    from one rank's step at the tokens of its share, the group model, with P > 1 the all-gather,
    and with drafts what they add to a step (`drafting_s`: `CostCurve.drafting`, as W=auto
    prices it; 0 where it was not measured)."""

    def priced(shape: Shape | None) -> PricedMesh:
        total, share = (1, 1) if shape is None else (rank_tokens(shape), rank_tokens(shape, P))
        S = 1.0 if shape is None else S_of(shape, P) if S_of else 1 + slope * math.log2(total)
        ms = model.step_ms(1e3 * one_gpu_s(share), T, share) + (allgather_ms if P > 1 else 0.0)
        ms += 0.0 if shape is None else 1e3 * drafting_s
        return PricedMesh(T, P, shape, S, S / ms * 1e3)

    return [priced(s) for s in ((None, *LADDER) if P == 1 else ladder(P))]


def choose(
    world_size: int,
    sizes: Sequence[int],
    one_gpu_s: Callable[[float], float],
    model: GroupModel,
    allgather_ms: float,
    drafting_s: float = 0.0,
) -> tuple[PricedMesh, list[PricedMesh]]:
    """The fastest mesh of `world_size` ranks with T in `sizes` (ties: the larger T, which
    holds less of the model per rank), and every priced mesh (`drafting_s`: `priced_shapes`')."""
    priced = [
        max(
            priced_shapes(T, world_size // T, one_gpu_s, model, allgather_ms, drafting_s=drafting_s),
            key=lambda x: x.tok_s,
        )
        for T in sizes
    ]
    return max(priced, key=lambda x: (x.tok_s, x.T)), priced


__all__ = [
    "GBPS",
    "LLAMA_7B",
    "PUBLISHED_SOURCE",
    "PUBLISHED_TP",
    "GroupModel",
    "PricedMesh",
    "choose",
    "fit",
    "group_sizes",
    "priced_shapes",
]

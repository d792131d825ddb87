"""The formulations of lp's linear layers, and the table that says which one runs at which size.

A step feeds 1 to a few dozen tokens, so every linear layer of a forward is a matmul with a
small M, bound by reading its weights. How fast a formulation reads them depends on the
machine, not on lp: on one 2-core AVX-512 VM torch's `linear` ran a one-token step at the
weight-read floor and `W @ x.T` at a third of it; on another the reverse, and a oneDNN matmul
over weights packed once ran an 11-token step 3x faster than either. So lp keeps several
formulations of `F.linear(x, weight, bias)` and picks one per step size by timing them on the
machine itself (lp/engine/kernel_choice.py):

* `linear`: torch's `F.linear` (every device; on CUDA the only one: cuBLAS picks its own kernels).
* `wx`: `W @ x.T`, a tall matmul with M columns (M = 1 fed as two equal columns, since one
  column falls back to a matrix-vector product); CPU.
* `onednn`: oneDNN's matmul over a copy of the weights reordered once into its blocked layout
  (`mkldnn._linear_pointwise`, what inductor's CPU freezing uses); CPU with oneDNN, eager
  steps only. The copy doubles the weights' memory. oneDNN compiles and keeps a primitive for
  every row count it meets (about 0.6 MiB each for a 576-wide layer), and a batch's packed steps
  change size step to step: rows past `EXACT_ROWS` are padded up to one of `PER_OCTAVE` sizes
  an octave (`padded_rows`), so a server holds a few hundred primitives, not one per size seen.

All compute the same sums in a different order: logits agree to fp32 rounding (tests check
every formulation at every size it may be chosen for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import torch
import torch.nn.functional as F


class Matrix(NamedTuple):
    """One linear layer's weights: `weight` `[out, in]`, its bias, and the packed copy of the
    weight that a formulation reads (None until one chosen needs it)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    packed: torch.Tensor | None = None


def _linear(x: torch.Tensor, m: Matrix) -> torch.Tensor:
    return F.linear(x, m.weight, m.bias)


def _wx(x: torch.Tensor, m: Matrix) -> torch.Tensor:
    M = x.shape[0]
    cols = x.repeat(2, 1) if M == 1 else x
    y = torch.mm(m.weight, cols.t()).t()[:M]
    return y if m.bias is None else y + m.bias


EXACT_ROWS = 16  # row counts oneDNN runs as they are
PER_OCTAVE = 8  # padded sizes between M and 2M past EXACT_ROWS: at most 1/8 more rows


def padded_rows(M: int) -> int:
    """The rows a oneDNN matmul of M rows runs at: M up to `EXACT_ROWS`, else M rounded up to a
    multiple of 2**(floor(log2 M)) / `PER_OCTAVE`."""
    if M <= EXACT_ROWS:
        return M
    step = 1 << (M.bit_length() - PER_OCTAVE.bit_length())
    return -(-M // step) * step


def _onednn(x: torch.Tensor, m: Matrix) -> torch.Tensor:
    M = x.shape[0]
    rows = padded_rows(M)
    if rows != M:
        x = F.pad(x, (0, 0, 0, rows - M))
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), m.packed, m.bias, "none", [], "")[:M]


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


@cache
def _runs(name: str, device_type: str, dtype: torch.dtype) -> bool:
    """Whether formulation `name` runs here (a 2 x 2 product equal to `F.linear`'s)."""
    f = FORMULATIONS[name]
    x = torch.ones(3, 2, dtype=dtype, device=device_type)
    w = torch.eye(2, dtype=dtype, device=device_type)
    try:
        got = f.run(x, Matrix(w, None, f.pack(w) if f.pack else None))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return bool(torch.equal(got, x))


@dataclass(frozen=True)
class Formulation:
    """One way of computing `F.linear(x, weight, bias)` for `x` `[M, in]`."""

    name: str
    run: Callable[[torch.Tensor, Matrix], torch.Tensor]
    cpu_only: bool = True
    traceable: bool = True  # torch.compile traces it (compiled fixed-shape steps)
    pack: Callable[[torch.Tensor], torch.Tensor] | None = None  # the weight's copy it reads, made once

    def available(self, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> bool:
        """Whether it can run on `device` in `dtype` (and under torch.compile, when `compiled`)."""
        if (self.cpu_only and device.type != "cpu") or (compiled and not self.traceable):
            return False
        return self.name == "linear" or _runs(self.name, device.type, dtype)

    def prepare(self, m: Matrix) -> Matrix:
        """`m` with the packed weight this formulation reads (made once: `pack`)."""
        return m if self.pack is None or m.packed is not None else m._replace(packed=self.pack(m.weight))


FORMULATIONS: dict[str, Formulation] = {
    f.name: f
    for f in (
        Formulation("linear", _linear, cpu_only=False),
        Formulation("wx", _wx),
        Formulation("onednn", _onednn, traceable=False, pack=_onednn_pack),
    )
}


@dataclass(frozen=True)
class Kernels:
    """Which formulation runs a matmul of M rows: `(up to M rows, name)` pairs by growing M; sizes
    past the last pair take its formulation. `how`: how the table was made, in words."""

    table: tuple[tuple[int, str], ...]
    how: str = ""

    @classmethod
    def only(cls, name: str, how: str = "") -> Kernels:
        """One formulation at every size."""
        return cls(((1, name),), how)

    def pick(self, M: int) -> Formulation:
        """The formulation of a matmul of M rows."""
        for most, name in self.table:  # sizes ascending; a plain loop: torch.compile traces it
            if M <= most:
                return FORMULATIONS[name]
        return FORMULATIONS[self.table[-1][1]]

    def __call__(self, x: torch.Tensor, m: Matrix) -> torch.Tensor:
        """`F.linear(x, m.weight, m.bias)` by the formulation chosen for x's rows."""
        return self.pick(x.shape[0]).run(x, m)

    @property
    def switches(self) -> frozenset[int]:
        """The row counts on both sides of every change of formulation: a step's cost can jump
        there (on a 2-core CPU a 17-token forward took 70 ms, a 16-token one 55)."""
        changes = [most for (most, name), (_, after) in zip(self.table, self.table[1:]) if name != after]
        return frozenset(M for most in changes for M in (most, most + 1))

    @property
    def names(self) -> set[str]:
        """The formulations the table uses."""
        return {name for _, name in self.table}

    def describe(self) -> str:
        """The table in one line, e.g. `wx up to 2 tokens, onednn from 3; measured on ...`."""
        merged: list[tuple[int, str]] = []
        for most, name in self.table:
            if merged and merged[-1][1] == name:
                merged[-1] = (most, name)
            else:
                merged.append((most, name))
        (first_most, first), rest = merged[0], merged[1:]
        parts = [first if not rest else f"{first} up to {first_most} token{'s' if first_most > 1 else ''}"]
        parts += [f"{name} from {low + 1}" for (low, _), (_, name) in zip(merged, rest)]
        line = ", ".join(parts)
        return f"{line}; {self.how}" if self.how else line


__all__ = ["FORMULATIONS", "Formulation", "Kernels", "Matrix"]

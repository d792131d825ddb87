"""The CPU matmul formulation for lp's few-token forwards.

A step feeds 1 to a few dozen tokens, so every linear layer is a matmul with a small M. On
CPU, torch's `linear` sends M = 1 to a GEMV that uses the memory bus poorly and M > 1 to a GEMM
that repacks the weights on every call. Computed the other way round, `W @ x.T` (a tall GEMM
with M columns), the weights stream once at close to full bandwidth: on the 2-core CI machine a
layer stack of SmolLM2's shapes runs 2-3x faster at M = 2 and still faster up to M = 128. M = 1
goes through the same path as two identical columns, because one column falls back to GEMV.

Only lp's own forwards use it (`small_m()` around them): other users of the same model object,
such as transformers' `generate` in the benchmark, keep torch's default.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType

import torch
import torch.nn.functional as F

SMALL_M = 128  # above this (prefills), torch's linear is as good


class _State(threading.local):
    depth = 0


_state = _State()


def _linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    M = rows.shape[0]
    if not _state.depth or M > SMALL_M or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    cols = rows.repeat(2, 1) if M == 1 else rows
    y = torch.mm(self.weight, cols.t()).t()[:M]
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


def install(model: torch.nn.Module) -> None:
    """Give every `nn.Linear` of `model` the small-M path (active only inside `small_m()`)."""
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            m.forward = MethodType(_linear, m)


@contextmanager
def small_m() -> Iterator[None]:
    """Linear layers installed with `install` use the small-M formulation in this block."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1

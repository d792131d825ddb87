"""The linear layer of lp's own forwards, with a CPU formulation for few-token inputs.

A step feeds 1 to a few dozen tokens, so every linear layer is a matmul with a small M. On
CPU, torch's `linear` sends M = 1 to a GEMV that uses the memory bus poorly and M > 1 to a GEMM
that repacks the weights on every call. Computed the other way round, `W @ x.T` (a tall GEMM
with M columns), the weights stream once at close to full bandwidth: on the 2-core CI machine a
layer stack of SmolLM2's shapes runs 2-3x faster at M = 2 and still faster up to M = 128. M = 1
goes through the same path as two identical columns, because one column falls back to GEMV.
On GPUs torch's own GEMMs are used unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SMALL_M = 128  # above this (long prefills), torch's linear is as good


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for `x` of shape `[M, in]`."""
    M = x.shape[0]
    if x.device.type != "cpu" or M > SMALL_M:
        return F.linear(x, weight, bias)
    cols = x.repeat(2, 1) if M == 1 else x
    y = torch.mm(weight, cols.t()).t()[:M]
    return y if bias is None else y + bias

"""One weight matrix for a decoder layer's q/k/v projections and one for its gate/up projections.

A step's matmuls are bound by reading the weights; one read of a matrix of q, k and v stacked
(and of gate and up) runs closer to the memory's bandwidth than three (and two) smaller ones,
and issues fewer kernels. The stacked matrix is made from the model's own projections as they
were loaded (whole, or a tensor-parallel rank's shard of each, lp/engine/tp.py), and the
projections' parameters are then registered again as views of it: the model holds no second
copy and computes what it did. A model fused before (a second worker on it) is recognised by
its projections lying end to end in one buffer, and not fused again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lp.engine.kernels import Matrix


def _stacked(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor whose consecutive rows `parts` are, if they lie end to end in one buffer, in order."""
    first = parts[0]
    offset = first.storage_offset()
    for p in parts:
        same = p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same and p.is_contiguous() and p.storage_offset() == offset and p.shape[1:] == first.shape[1:]):
            return None
        offset += p.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))


def _rebind(linears: Sequence[torch.nn.Linear], leaf: str, whole: torch.Tensor) -> None:
    """Register each linear's `leaf` parameter again as its rows of `whole` (torch's own way to
    put a tensor in a module's parameter slot)."""
    start = 0
    for linear in linears:
        old = getattr(linear, leaf)
        rows = linear.weight.shape[0]
        if old is not None:
            view = whole[start : start + rows]
            linear.register_parameter(leaf, torch.nn.Parameter(view, requires_grad=old.requires_grad))
        start += rows


@torch.no_grad()
def fused(linears: Sequence[torch.nn.Linear]) -> Matrix:
    """The linears' weights (and biases) stacked as one `Matrix`; the linears then read views of it."""
    weights = [linear.weight for linear in linears]
    weight = _stacked(weights)
    if weight is None:
        weight = torch.cat(weights)
        _rebind(linears, "weight", weight)
    biases = [linear.bias for linear in linears]
    if all(b is None for b in biases):
        return Matrix(weight)
    bias = _stacked(biases) if all(b is not None for b in biases) else None
    if bias is None:  # a linear without a bias adds zeros
        bias = torch.cat([b if b is not None else weight.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])
        _rebind(linears, "bias", bias)
    return Matrix(weight, bias)


__all__ = ["fused"]

"""A preallocated KV cache that holds committed tokens only.

A step writes its tokens' KV right after the committed prefix and attends over
`[0, committed + T)`; `commit(n)` then keeps the first n of them (the pending tokens that the
step re-fed). Everything after is speculative and simply overwritten by the next step, so a
rejected guess costs nothing to undo and the buffers never move. Fixed-shape steps (CUDA
graphs, lp/graph.py) instead write at device-held positions and attend over the whole buffer.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _Layer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, owner: "CommittedKV") -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, dk = key_states.shape
        cap = self.owner.capacity
        self.keys = key_states.new_zeros((b, h, cap, dk))
        self.values = value_states.new_zeros((b, h, cap, value_states.shape[-1]))
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized or self.keys.shape[2] < self.owner.capacity:
            self.lazy_initialization(key_states, value_states)
        if self.owner.write_at is not None:  # a fixed-shape step (lp/graph.py): scatter, attend to all
            self.keys.index_copy_(2, self.owner.write_at, key_states)
            self.values.index_copy_(2, self.owner.write_at, value_states)
            return self.keys, self.values
        start = self.owner.length
        end = start + key_states.shape[-2]
        if end > self.keys.shape[2]:
            raise RuntimeError(f"KV cache overflow: {end} > capacity {self.keys.shape[2]}")
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity


class CommittedKV(Cache):
    """KV of committed tokens for every layer, in buffers of `capacity` tokens."""

    def __init__(self, num_layers: int) -> None:
        super().__init__(layers=[_Layer(self) for _ in range(num_layers)])
        self.length = 0
        self.capacity = 0
        self.write_at: torch.Tensor | None = None  # set during fixed-shape steps: where they write

    def reset(self, capacity: int) -> None:
        """Forget everything; grow the buffers (lazily, on the next write) if `capacity` needs it."""
        self.length = 0
        self.capacity = max(self.capacity, capacity)

    def commit(self, n: int) -> None:
        """Keep the KV of the first `n` tokens written by the last forward."""
        if self.length + n > self.capacity:
            raise RuntimeError("commit past the KV capacity")
        self.length += n

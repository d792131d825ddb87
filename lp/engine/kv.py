"""The KV cache: one position-indexed buffer per layer, allocated once per loaded model.

Slot i holds the key/value of sequence position i. A step writes its n tokens' KV at slots
`[length, length + n)` and attends to the committed slots `[0, length)` plus its own tokens
under the step mask; `commit(k)` then keeps the first k of them (the pending tokens the step
fed), and `keep` moves the accepted drafts' KV after them. Everything after is speculative
and simply overwritten by the next step, so a rejected guess costs nothing to undo, and the
buffers never move: CUDA graphs captured over them stay valid for every prompt of the process.

The committed length lives twice: as a host int (shapes, checks) and as a device tensor
(`start`) that forwards read, so a captured step needs no host value to know where to write.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from lp.errors import LPError


class KVCache:
    """Keys and values of one sequence: per layer `[kv_heads, capacity, head_dim]`."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        # Zeros, not empty: masked slots still enter attention's weighted sum (with weight 0),
        # and 0 * NaN from uninitialised memory would poison it.
        # One buffer per layer (not views of one): compiled steps then mutate whole inputs in place.
        shape = (kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def reset(self) -> None:
        """Start a new sequence (the buffers are kept; old KV is overwritten as it goes)."""
        self.length = 0
        self.start.zero_()

    def slots(self, n: int) -> torch.Tensor:
        """The slots `start .. start+n-1` a step of n tokens writes (once per step, not per layer:
        two launches fewer per layer in an eager step)."""
        return self.start + torch.arange(n, device=self.start.device)

    @staticmethod
    def write(
        k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store a step's `[kv_heads, n, head_dim]` keys/values at `slots` of one layer's buffers
        (passed in, so a compiled layer receives them as inputs)."""
        k_cache.index_copy_(1, slots, k)
        v_cache.index_copy_(1, slots, v)

    def commit(self, n: int, on_device: bool = True) -> None:
        """Keep the KV of the first `n` tokens written by the last forward. `on_device=False`:
        the device-held length was advanced already (by a captured step); follow it on the host."""
        if self.length + n > self.capacity:
            raise LPError(f"KV cache overflow: {self.length + n} tokens > max_seq_len {self.capacity}")
        self.length += n
        if on_device:
            self.start.add_(n)

    def keep(self, path: torch.Tensor, offset: int | torch.Tensor, count: torch.Tensor) -> None:
        """Keep the KV of a step's accepted draft tokens, after `commit` kept its pending ones: move
        the slots `start + offset + path[i]` (a tree node's slot, `offset` its first node's past
        `start`; `path` padded with -1) to `start + i`, then advance the device's length by
        `count` (a device scalar: no host value, so the step's decision is not waited for).
        The host's length follows with `commit(count, on_device=False)` once it is read. The
        drafts' KV was computed under the step mask with their own positions: exactly what
        re-feeding them would compute, so the next step feeds only the bonus token."""
        dst = self.start + torch.arange(path.shape[0], device=self.start.device)
        src = torch.where(path >= 0, self.start + offset + path, dst)  # padding: copied onto itself
        for buf in (*self.k, *self.v):
            buf.index_copy_(1, dst, buf.index_select(1, src))
        self.start.add_(count)

    def as_transformers_cache(self) -> Cache:
        """A transformers `Cache` over these buffers, for models run through their own modules."""
        return _TransformersCache(self)


class _Layer(CacheLayerMixin):
    """One layer's view for transformers' attention modules: write at `start`, return the first
    `extent` slots (the step's mask hides the unwritten and speculative ones among them)."""

    is_sliding = False
    is_compileable = True

    def __init__(self, owner: _TransformersCache, index: int) -> None:
        super().__init__()
        self.owner, self.kv, self.index = owner, owner.kv, index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # the buffers exist from the start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        k, v = self.kv.k[self.index], self.kv.v[self.index]
        self.kv.write(k, v, key_states[0], value_states[0], slots=self.kv.slots(key_states.shape[2]))
        return k[None, :, : self.owner.extent], v[None, :, : self.owner.extent]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.extent, 0

    def get_seq_length(self) -> int:
        return self.kv.length

    def get_max_length(self) -> int:
        return self.kv.capacity


class _TransformersCache(Cache):
    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self.extent = kv.capacity  # slots the next forward attends over; its caller sets it
        super().__init__(layers=[_Layer(self, i) for i in range(len(kv.k))])

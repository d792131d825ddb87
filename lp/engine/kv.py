"""The KV cache: one buffer per layer of keys and one of values, `[kv_heads, slots, head_dim]`,
allocated once per loaded model and shared by every sequence through its pages
(lp/engine/pages.py).

A step writes each token's key and value at the slot the step names for it (`write`): its
sequence's next storage index. The first ones (the pending tokens) are then kept by the host's
length moving past them; `move` copies the accepted drafts' KV onto the storage indices right
after; everything else is speculative and simply overwritten by the next step, so a rejected
guess costs nothing to undo. The buffers never move: CUDA graphs captured over them stay valid
for every sequence of the process."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from lp.engine.pages import PAGE, PagePool


class KVCache:
    """Keys and values of every sequence, and the pool of their pages."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, pages: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        # Zeros, not empty: a key block the attention visits enters its weighted sum (with weight
        # 0 where masked), and 0 * NaN from uninitialised memory would poison it. On a CPU, zeros
        # are pages of memory the system maps only once written: the cache costs what is used.
        # One buffer per layer (not views of one): compiled steps then mutate whole inputs in place.
        shape = (kv_heads, pages * PAGE, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.pool = PagePool(pages, device)

    @property
    def slots(self) -> int:
        return self.k[0].shape[1]

    @staticmethod
    def write(
        k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store a step's `[kv_heads, n, head_dim]` keys/values at `slots` of one layer's buffers
        (passed in, so a compiled layer receives them as inputs)."""
        k_cache.index_copy_(1, slots, k)
        v_cache.index_copy_(1, slots, v)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's KV at slots `src` onto slots `dst` (device tensors: no host value).
        The accepted drafts' KV was computed under the step mask at their own positions: what
        feeding them again would compute, so it is kept where they now lie in the sequence."""
        for buf in (*self.k, *self.v):
            buf.index_copy_(1, dst, buf.index_select(1, src))

    def as_transformers_cache(self) -> Cache:
        """A transformers `Cache` over these buffers, for models run through their own modules."""
        return _TransformersCache(self)


class _Layer(CacheLayerMixin):
    """One layer's view for transformers' attention modules: write at the step's slots, return
    every slot (the step's mask hides all but the token's own sequence)."""

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
        self.kv.write(k, v, key_states[0], value_states[0], slots=self.owner.step_slots)
        return k[None], v[None]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.kv.slots, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.kv.slots


class _TransformersCache(Cache):
    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self.step_slots: torch.Tensor | None = None  # where the next forward writes; its caller sets them
        super().__init__(layers=[_Layer(self, i) for i in range(len(kv.k))])

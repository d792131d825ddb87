"""What one forward of a step takes, and the forward for models outside the Llama family.

A forward writes its n tokens' KV at cache slots `start .. start+n-1`, attends under the step's
mask, and returns the logits of `rows` only. The Llama family runs through lp's lean forward
(lp/engine/llama.py); every other transformers causal LM runs through its own modules here, with a
transformers `Cache` over the same buffers and a dense mask over the whole cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lp.engine.attention import FlexMask, dense_mask
from lp.engine.kv import KVCache


@dataclass
class StepInputs:
    """One forward's inputs, all on the device but the two ints."""

    ids: torch.Tensor  # [n] long
    positions: torch.Tensor  # [n] long
    block: torch.Tensor  # [n, n] bool: which step tokens each step token sees
    rows: torch.Tensor  # [R] long: the rows whose logits are returned
    extent: int  # cache slots the attention reads: committed + n, or the whole cache at fixed shapes
    committed: int | None = None  # the committed length on the host (eager steps only)
    flex: FlexMask | None = None  # FlexAttention's block mask, at fixed shapes
    causal: bool = False  # a prefill from an empty cache: `block` is causal and nothing is committed


Forward = Callable[[StepInputs], torch.Tensor]  # and `compiled()`: the same forward, compiled


class TransformersForward:
    """A step through a transformers model's own modules (any causal LM that takes 4D masks),
    attending over the step's `extent` of the cache."""

    def __init__(self, model: torch.nn.Module, kv: KVCache) -> None:
        self.body, self.head, self.kv = model.get_decoder(), model.get_output_embeddings(), kv
        self.cache = kv.as_transformers_cache()

    def compiled(self) -> Forward:
        """This forward compiled whole (transformers' modules have no per-layer entry of lp's)."""
        return torch.compile(self, fullgraph=True, dynamic=False)

    def __call__(self, x: StepInputs) -> torch.Tensor:
        self.cache.extent = x.extent
        mask = dense_mask(self.kv.start, x.block, x.extent)
        out = self.body(
            input_ids=x.ids[None],
            position_ids=x.positions[None],
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        return self.head(out.last_hidden_state[0].index_select(0, x.rows))


def kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a transformers causal LM."""
    cfg = model.config.get_text_config()
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads, head_dim

"""What one forward of a step takes, and the forward for models outside the Llama family.

A forward writes its tokens' KV at the slots the step names, attends as the step says (over each
token's own sequence: lp/engine/attention.py), and returns the logits of `rows` only. The Llama
family runs through lp's lean forward (lp/engine/llama.py); every other transformers causal LM runs
through its own modules here, with a transformers `Cache` over the same buffers and a dense mask
over the whole cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lp.engine.kv import KVCache

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]  # lp/engine/attention.py's


@dataclass
class StepInputs:
    """One forward's inputs, on the device: each token's id, position (RoPE's) and slot (where its
    KV goes), the rows whose logits are returned, and how the tokens attend over the cache
    (`attend(q, k_cache, v_cache, scale)`: lp/engine/attention.py)."""

    ids: torch.Tensor  # [n] long
    positions: torch.Tensor  # [n] long
    slots: torch.Tensor  # [n] long
    rows: torch.Tensor  # [R] long
    attend: Attend


Forward = Callable[[StepInputs], torch.Tensor]  # and `compiled()`: the same forward, compiled


class TransformersForward:
    """A step through a transformers model's own modules (any causal LM that takes 4D masks),
    attending over the whole cache under the step's dense mask (lp/engine/attention.py `Dense`)."""

    def __init__(self, model: torch.nn.Module, kv: KVCache) -> None:
        self.body, self.head, self.kv = model.get_decoder(), model.get_output_embeddings(), kv
        self.cache = kv.as_transformers_cache()

    def compiled(self) -> Forward:
        """This forward compiled whole (transformers' modules have no per-layer entry of lp's)."""
        return torch.compile(self, fullgraph=True, dynamic=False)

    def __call__(self, x: StepInputs) -> torch.Tensor:
        self.cache.step_slots = x.slots
        out = self.body(
            input_ids=x.ids[None],
            position_ids=x.positions[None],
            attention_mask=x.attend.mask,
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

"""A lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM), in the manner of
gpt-fast: one function per decoder layer, batch 1, the KV cache indexed by position, attention
chosen per step. It reads the weights of the transformers model it is given (nothing is copied
or patched), and its logits are checked against transformers' in the tests.

Why not transformers' modules: their per-call bookkeeping (cache objects, mask preparation,
generic kwargs) is host work on every layer, and the attention backends lp needs (a block mask
that skips the unwritten cache, split attention) do not fit their interfaces at fixed shapes.

Under tensor parallelism (lp/engine/tp.py) each rank's layers hold its shard of the heads and
of the MLP, and the row-parallel outputs (o, down) are summed over the group by one all-reduce
each; the head counts come from the shards' shapes.

Compiled, it is compiled per layer, not as a whole (regional compilation): every layer has the
same shapes, so one compiled graph serves them all and compile time does not grow with depth;
the CUDA graph around the whole step still removes the launches between layers.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from transformers.activations import ACT2FN

from lp.engine import attention
from lp.engine.forward import StepInputs, kv_shape
from lp.engine.kernels import linear
from lp.engine.kv import KVCache
from lp.engine.tp import ALONE, TensorGroup

FAMILY = ("llama", "mistral", "qwen2")
# RoPE types whose frequencies change with the sequence length: lp precomputes one table.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model this forward reproduces exactly."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    # `_rotate` turns whole heads of an even size
    whole_heads = kv_shape(model)[2] % 2 == 0 and getattr(cfg, "partial_rotary_factor", 1.0) == 1.0
    return (
        cfg.model_type in FAMILY
        and getattr(cfg, "pretraining_tp", 1) == 1
        and whole_heads
        and cfg.hidden_act in ACT2FN
        and rope.get("rope_type", "default") not in LENGTH_DEPENDENT_ROPE
        and hasattr(model, "model")
        and hasattr(model.model, "rotary_emb")
    )


class _Layer(NamedTuple):
    """One decoder layer's weights (biases may be None), read from the transformers modules."""

    norm1: torch.Tensor
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    norm2: torch.Tensor
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _weights(layer: torch.nn.Module) -> _Layer:
    a, m = layer.self_attn, layer.mlp
    return _Layer(
        norm1=layer.input_layernorm.weight,
        q=a.q_proj.weight,
        q_bias=a.q_proj.bias,
        k=a.k_proj.weight,
        k_bias=a.k_proj.bias,
        v=a.v_proj.weight,
        v_bias=a.v_proj.bias,
        o=a.o_proj.weight,
        o_bias=a.o_proj.bias,
        norm2=layer.post_attention_layernorm.weight,
        gate=m.gate_proj.weight,
        gate_bias=m.gate_proj.bias,
        up=m.up_proj.weight,
        up_bias=m.up_proj.bias,
        down=m.down_proj.weight,
        down_bias=m.down_proj.bias,
    )


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm, op for op (fp32 statistics, weight applied in the input dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin`, bit for bit, in 4 ops instead of 7:
    rotate_half(x) is [-x2, x1]; a roll by half the head gives [x2, x1], and the minus moves
    into `signed_sin` = [-sin1, sin2] ((-a) * b and a * (-b) round alike). An eager step
    dispatches every op from the host: 60 rotations per SmolLM2 step (q and k in 30 layers)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class LlamaForward:
    """Logits of a step's rows, writing the step's KV into `kv` (lp/engine/kv.py)."""

    def __init__(self, model: torch.nn.Module, kv: KVCache, backend: str, tp: TensorGroup = ALONE) -> None:
        """`tp`: the tensor-parallel group whose shard `model` holds (lp/engine/tp.py)."""
        cfg = model.config
        self.model, self.kv, self.backend, self.reduce = model, kv, backend, tp.all_reduce
        self.head_dim = kv_shape(model)[2]
        self.scale = self.head_dim**-0.5
        self.eps = cfg.rms_norm_eps
        self.act = ACT2FN[cfg.hidden_act]
        body = model.model
        self.layers = [_weights(layer) for layer in body.layers]
        # this rank's heads: all of them, or its shard's under tensor parallelism
        self.heads = self.layers[0].q.shape[0] // self.head_dim
        self.kv_heads = self.layers[0].k.shape[0] // self.head_dim
        # RoPE tables for every slot, from the model's own rotary module (all its fixed scalings).
        probe = body.embed_tokens.weight[:1]
        cos, sin = body.rotary_emb(probe, torch.arange(kv.capacity, device=probe.device)[None])
        sign = torch.ones(self.head_dim, dtype=sin.dtype, device=sin.device)
        sign[: self.head_dim // 2] = -1
        self.cos, self.signed_sin = cos[0], sin[0] * sign  # `_rotate`'s tables
        self.layer = self._layer

    def compiled(self) -> LlamaForward:
        """The same forward with each layer compiled (one graph for all layers per step size)."""
        twin = copy.copy(self)  # shares the weights, tables and cache
        twin.layer = torch.compile(self._layer, fullgraph=True, dynamic=False)
        return twin

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: StepInputs, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if x.flex is not None:
            return attention.flex(q, k, v, x.flex, scale=self.scale)
        if x.causal:  # a prefill from an empty cache: plain causal attention over its own tokens
            n = q.shape[1]
            return attention.sdpa(q, k[:, :n], v[:, :n], None, scale=self.scale)
        if self.backend == "split":
            return attention.split(q, k, v, x.committed, block=x.block, scale=self.scale)
        return attention.sdpa(q, k[:, : x.extent], v[:, : x.extent], mask, scale=self.scale)

    def _layer(
        self,
        h: torch.Tensor,
        w: _Layer,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        x: StepInputs,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        n, H, Hkv, D = h.shape[0], self.heads, self.kv_heads, self.head_dim
        y = _rms_norm(h, w.norm1, self.eps)
        q = linear(y, w.q, w.q_bias).view(n, H, D).transpose(0, 1)
        k = linear(y, w.k, w.k_bias).view(n, Hkv, D).transpose(0, 1)
        v = linear(y, w.v, w.v_bias).view(n, Hkv, D).transpose(0, 1)
        self.kv.write(k_cache, v_cache, _rotate(k, cos, signed_sin), v, slots=slots)
        o = self._attend(_rotate(q, cos, signed_sin), k_cache, v_cache, x, mask=mask)
        h = h + self.reduce(linear(o.transpose(0, 1).reshape(n, H * D), w.o, w.o_bias))
        y = _rms_norm(h, w.norm2, self.eps)
        mlp = linear(self.act(linear(y, w.gate, w.gate_bias)) * linear(y, w.up, w.up_bias), w.down, w.down_bias)
        return h + self.reduce(mlp)

    def __call__(self, x: StepInputs) -> torch.Tensor:
        body = self.model.model
        mask = None
        if x.flex is None and not x.causal and self.backend != "split":
            # on CUDA, sdpa takes the rows once per group head (lp/engine/attention.py)
            groups = self.heads // self.kv_heads if x.block.is_cuda else 1
            mask = attention.dense_mask(self.kv.start, x.block, x.extent, groups)
        cos, signed_sin = self.cos[x.positions], self.signed_sin[x.positions]
        slots = self.kv.slots(x.ids.shape[0])
        h = body.embed_tokens.weight[x.ids]
        for w, k_cache, v_cache in zip(self.layers, self.kv.k, self.kv.v):
            h = self.layer(h, w, k_cache, v_cache, slots=slots, cos=cos, signed_sin=signed_sin, x=x, mask=mask)
        head = self.model.get_output_embeddings()
        return linear(_rms_norm(h.index_select(0, x.rows), body.norm.weight, self.eps), head.weight, head.bias)

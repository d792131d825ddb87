"""A lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM), in the manner of
gpt-fast: one function over the layers, batch 1, the KV cache indexed by position, attention
chosen per step. It reads the weights of the transformers model it is given (nothing is copied
or patched), and its logits are checked against transformers' in the tests.

Why not transformers' modules: their per-call bookkeeping (cache objects, mask preparation,
generic kwargs) is host work on every layer, and the attention backends lp needs (a block mask
that skips the unwritten cache, split attention) do not fit their interfaces at fixed shapes.
"""
from __future__ import annotations

import torch
from transformers.activations import ACT2FN

from lp import attention
from lp.forward import StepInputs
from lp.kernels import linear
from lp.kv import KVCache

FAMILY = ("llama", "mistral", "qwen2")


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model this forward reproduces exactly."""
    cfg = model.config
    return (cfg.model_type in FAMILY and getattr(cfg, "pretraining_tp", 1) == 1
            and cfg.hidden_act in ACT2FN and hasattr(model, "model") and hasattr(model.model, "rotary_emb"))


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' RMSNorm, op for op (fp32 statistics, weight applied in the input dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaForward:
    """Logits of a step's rows, writing the step's KV into `kv` (lp/kv.py)."""

    def __init__(self, model: torch.nn.Module, kv: KVCache, backend: str) -> None:
        cfg = model.config
        self.model, self.kv, self.backend = model, kv, backend
        self.heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.kv_heads = cfg.num_key_value_heads
        self.scale = self.head_dim ** -0.5
        self.act = ACT2FN[cfg.hidden_act]
        # RoPE tables for every slot, from the model's own rotary module (all its scaling types).
        body = model.model
        probe = body.embed_tokens.weight[:1]
        cos, sin = body.rotary_emb(probe, torch.arange(kv.capacity, device=probe.device)[None])
        self.cos, self.sin = cos[0], sin[0]

    def _attend(self, q: torch.Tensor, layer: int, x: StepInputs, mask: torch.Tensor | None) -> torch.Tensor:
        k, v = self.kv.k[layer], self.kv.v[layer]
        if x.flex is not None:
            return attention.flex(q, k, v, x.flex, self.scale)
        if self.backend == "split":
            return attention.split(q, k, v, x.committed, x.block, self.scale)
        return attention.sdpa(q, k[:, :x.extent], v[:, :x.extent], mask, self.scale)

    def __call__(self, x: StepInputs) -> torch.Tensor:
        body, S = self.model.model, x.ids.shape[0]
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        mask = None
        if x.flex is None and self.backend != "split":
            mask = attention.dense_mask(self.kv.start, x.block, x.extent)
        cos, sin = self.cos[x.positions], self.sin[x.positions]
        h = body.embed_tokens.weight[x.ids]
        for i, layer in enumerate(body.layers):
            a, mlp = layer.self_attn, layer.mlp
            y = _rms_norm(h, layer.input_layernorm)
            q = linear(y, a.q_proj.weight, a.q_proj.bias).view(S, H, D).transpose(0, 1)
            k = linear(y, a.k_proj.weight, a.k_proj.bias).view(S, Hkv, D).transpose(0, 1)
            v = linear(y, a.v_proj.weight, a.v_proj.bias).view(S, Hkv, D).transpose(0, 1)
            self.kv.write(i, _rotate(k, cos, sin), v)
            o = self._attend(_rotate(q, cos, sin), i, x, mask)
            h = h + linear(o.transpose(0, 1).reshape(S, H * D), a.o_proj.weight, a.o_proj.bias)
            y = _rms_norm(h, layer.post_attention_layernorm)
            h = h + linear(self.act(linear(y, mlp.gate_proj.weight, mlp.gate_proj.bias))
                           * linear(y, mlp.up_proj.weight, mlp.up_proj.bias), mlp.down_proj.weight, mlp.down_proj.bias)
        head = self.model.get_output_embeddings()
        return linear(_rms_norm(h.index_select(0, x.rows), body.norm), head.weight, head.bias)

"""A lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM), in the manner of
gpt-fast: one function per decoder layer over a packed step's tokens (one sequence's or several
side by side), the paged KV cache written at the slots the step names, attention as the step
says (lp/engine/attention.py). It reads the weights of the transformers model it is given
(nothing is copied or patched), and its logits are checked against transformers' in the tests.

Why not transformers' modules: their per-call bookkeeping (cache objects, mask preparation,
generic kwargs) is host work on every layer, and the attention lp needs (packed sequences over
a paged cache, a block mask that visits only a step's own pages) does not fit their interfaces
at fixed shapes.

Each layer's q/k/v projections run as one matmul, and its gate/up projections as one
(lp/engine/fused.py), every matmul by the formulation chosen for the step's size
(lp/engine/kernels.py, `use`). Under tensor parallelism (lp/engine/tp.py) each rank's layers
hold its shard of the heads and of the MLP, and the row-parallel outputs (o, down) are summed
over the group by one all-reduce each; the head counts come from the shards' shapes.

Compiled, it is compiled per layer, not as a whole (regional compilation): every layer has the
same shapes, so one compiled graph serves them all and compile time does not grow with depth.
The embedding and the head (the final norm and lm_head) are compiled apart, once each, so the
whole forward runs compiled; the CUDA graph around the whole step removes the launches between
the parts.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from transformers.activations import ACT2FN

from lp.engine.forward import Attend, StepInputs, kv_shape
from lp.engine.fused import fused
from lp.engine.kernels import FORMULATIONS, Kernels, Matrix
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
    """One decoder layer's weights, read from the transformers modules (q/k/v and gate/up fused)."""

    norm1: torch.Tensor
    qkv: Matrix
    o: Matrix
    norm2: torch.Tensor
    gate_up: Matrix
    down: Matrix


def _weights(layer: torch.nn.Module) -> _Layer:
    a, m = layer.self_attn, layer.mlp
    return _Layer(
        norm1=layer.input_layernorm.weight,
        qkv=fused((a.q_proj, a.k_proj, a.v_proj)),
        o=Matrix(a.o_proj.weight, a.o_proj.bias),
        norm2=layer.post_attention_layernorm.weight,
        gate_up=fused((m.gate_proj, m.up_proj)),
        down=Matrix(m.down_proj.weight, m.down_proj.bias),
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

    def __init__(self, model: torch.nn.Module, kv: KVCache, positions: int, tp: TensorGroup = ALONE) -> None:
        """`positions`: the RoPE table's length (the longest sequence and a step's tokens past it);
        `tp`: the tensor-parallel group whose shard `model` holds (lp/engine/tp.py). The matmuls run
        torch's `linear` until `use` gives them other formulations."""
        cfg = model.config
        self.model, self.kv, self.reduce = model, kv, tp.all_reduce
        self.head_dim = kv_shape(model)[2]
        self.scale = self.head_dim**-0.5
        self.eps = cfg.rms_norm_eps
        self.act = ACT2FN[cfg.hidden_act]
        body = model.model
        self.layers = [_weights(layer) for layer in body.layers]
        # this rank's heads: all of them, or its shard's under tensor parallelism
        attn = body.layers[0].self_attn
        self.qkv_split = tuple(p.weight.shape[0] for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        self.heads, self.kv_heads = self.qkv_split[0] // self.head_dim, self.qkv_split[1] // self.head_dim
        head = model.get_output_embeddings()
        self.lm_head = Matrix(head.weight, head.bias)
        self.kernels = Kernels.only("linear")
        # RoPE tables for every position, from the model's own rotary module (all its fixed scalings).
        probe = body.embed_tokens.weight[:1]
        cos, sin = body.rotary_emb(probe, torch.arange(positions, device=probe.device)[None])
        sign = torch.ones(self.head_dim, dtype=sin.dtype, device=sin.device)
        sign[: self.head_dim // 2] = -1
        self.cos, self.signed_sin = cos[0], sin[0] * sign  # `_rotate`'s tables
        self.embed, self.layer, self.head = self._embed, self._layer, self._head

    def matrices(self) -> dict[str, list[Matrix]]:
        """The weight matrices by role (q/k/v, o, gate/up, down, head), in the order a step reads them."""
        return {
            "qkv": [w.qkv for w in self.layers],
            "o": [w.o for w in self.layers],
            "gate_up": [w.gate_up for w in self.layers],
            "down": [w.down for w in self.layers],
            "head": [self.lm_head],
        }

    def use(self, kernels: Kernels, keep: bool = False) -> None:
        """Run the matmuls by `kernels`, with the weight copies its formulations read made now (and
        those it does not read dropped, unless `keep`: the kernel choice switches between them)."""
        packing = [FORMULATIONS[name] for name in sorted(kernels.names) if FORMULATIONS[name].pack]

        def ready(m: Matrix) -> Matrix:
            if not packing:
                return m if keep else m._replace(packed=None)
            for f in packing:
                m = f.prepare(m)
            return m

        self.layers = [
            w._replace(qkv=ready(w.qkv), o=ready(w.o), gate_up=ready(w.gate_up), down=ready(w.down))
            for w in self.layers
        ]
        self.lm_head = ready(self.lm_head)
        self.kernels = kernels

    def compiled(self) -> LlamaForward:
        """The same forward compiled: each layer (one graph for all layers per step size), the
        embedding and the head."""
        twin = copy.copy(self)  # shares the weights, tables and cache
        options = dict(fullgraph=True, dynamic=False)
        twin.embed, twin.layer, twin.head = (
            torch.compile(f, **options) for f in (self._embed, self._layer, self._head)
        )
        return twin

    def _layer(
        self,
        h: torch.Tensor,
        w: _Layer,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        n, H, D = h.shape[0], self.heads, self.head_dim
        y = _rms_norm(h, w.norm1, self.eps)
        q, k, v = self.kernels(y, w.qkv).split(self.qkv_split, dim=1)
        q, k, v = (t.view(n, -1, D).transpose(0, 1) for t in (q, k, v))
        self.kv.write(k_cache, v_cache, _rotate(k, cos, signed_sin), v, slots=slots)
        o = attend(_rotate(q, cos, signed_sin), k_cache, v_cache, self.scale)
        h = h + self.reduce(self.kernels(o.transpose(0, 1).reshape(n, H * D), w.o))
        y = _rms_norm(h, w.norm2, self.eps)
        gate, up = self.kernels(y, w.gate_up).chunk(2, dim=1)
        return h + self.reduce(self.kernels(self.act(gate) * up, w.down))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens.weight[ids]

    def _head(self, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Logits of `rows` of the last layer's output: the final norm, then lm_head."""
        return self.kernels(_rms_norm(h.index_select(0, rows), self.model.model.norm.weight, self.eps), self.lm_head)

    def __call__(self, x: StepInputs) -> torch.Tensor:
        cos, signed_sin = self.cos[x.positions], self.signed_sin[x.positions]
        h = self.embed(x.ids)
        for w, k_cache, v_cache in zip(self.layers, self.kv.k, self.kv.v):
            h = self.layer(h, w, k_cache, v_cache, x.slots, cos, signed_sin, x.attend)
        return self.head(h, x.rows)

"""Split attention, lp's GPU attention backend (DESIGN.md section 4).

flash-attn cannot take lookahead's arbitrary mask, but a step splits cleanly: every step
token sees all committed KV (no mask: one flash-attn call over the cache) and, within the
step, only its own chain (a tiny T x T block, dense, with the lookahead mask). The two
partial softmaxes are merged exactly with their log-sum-exp. Registered with transformers'
`AttentionInterface` as "lp_split", so no modeling code is forked. Without CUDA or flash-attn
the committed part runs as plain math, which keeps the backend testable on CPU.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface

NAME = "lp_split"

try:  # optional: the `gpu` extra
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


def flash_available() -> bool:
    return flash_attn_func is not None and torch.cuda.is_available()


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over a few keys with an optional [T, S] bool mask; returns (out fp32, lse)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float()), lse


def _committed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of the step's queries over the committed KV."""
    if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
        out, lse, _ = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                      softmax_scale=scale, causal=False, return_attn_probs=True)
        return out.transpose(1, 2).float(), lse
    return _dense(q, k, v, None, scale)


def split_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, T, D]; key/value [B, Hkv, c+T, D] (committed + step); attention_mask the
    step's 4D bool mask [1, 1, T, c+T] whose last T columns are the in-step block."""
    if attention_mask is None or attention_mask.dim() != 4:
        raise ValueError("lp_split attention needs lp's 4D step mask")
    T = query.shape[2]
    c = key.shape[2] - T
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    block = attention_mask[0, 0, :, c:]
    if c == 0 and T > 1 and query.is_cuda and flash_attn_func is not None and query.dtype != torch.float32 \
            and torch.equal(block, torch.ones_like(block).tril_()):
        # A prefill: the block is plain causal, so flash-attn's causal kernel is exact and O(T) in memory.
        out = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              softmax_scale=scale, causal=True)
        return out.contiguous(), None
    out, lse = _dense(query, key[:, :, c:], value[:, :, c:], block, scale)
    if c > 0:
        out_c, lse_c = _committed(query, key[:, :, :c], value[:, :, :c], scale)
        total = torch.logaddexp(lse, lse_c)
        out = out * torch.exp(lse - total).unsqueeze(-1) + out_c * torch.exp(lse_c - total).unsqueeze(-1)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, split_attention)

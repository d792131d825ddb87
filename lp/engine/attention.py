"""Attention of a step's tokens over the KV cache, three ways.

Every step token sees the committed slots `[0, start)` and, among the step's own slots
`[start, start + n)`, only what the step's `[n, n]` block mask allows (its own chain). Slots
past the step are never seen, so the unwritten and speculative tail of the cache costs nothing
but the work a backend spends skipping it:

* `sdpa` (CPU, and the fallback): a dense `[n, extent]` bool mask built on the device from
  `start` and the block, then torch's scaled_dot_product_attention.
* `flex` (GPU): PyTorch's FlexAttention with a `BlockMask` that visits only the cache blocks up
  to `start + n`, the committed ones as full blocks (no mask computed); its `mask_mod` reads
  `start` and the block from device tensors, so one block mask per step size serves every step
  and stays valid inside a CUDA graph.
* `split` (GPU with the optional flash-attn): flash-attn over the committed slots (no mask) and
  a dense pass over the in-step block, merged exactly by log-sum-exp. It needs the committed
  length on the host, so it runs eagerly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

try:  # optional: the `gpu` extra
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

BACKENDS = ("auto", "sdpa", "flex", "split")
FLEX_BLOCK = 128  # FlexAttention's tile; blocks past start + n are skipped whole
# FlexAttention's decoding kernel stacks a kv head's query group: past this many rows it ran slower
# than the main kernel, or found no kernel at all (Llama-3-8B, 64 tokens x 4 heads, H100, torch 2.11)
DECODE_ROWS = 64
MIN_CPU_ROWS = 2  # query rows of a FlexAttention step on CPU (see FlexMask)


def flash_available() -> bool:
    """Whether the split backend can use flash-attn here."""
    return flash_attn_func is not None and torch.cuda.is_available()


def dense_mask(start: torch.Tensor | int, block: torch.Tensor, extent: int, groups: int = 1) -> torch.Tensor:
    """`[1, 1, n, extent]` bool: committed slots, then the step's block, nothing after. With
    `groups` > 1, `[1, 1, groups * n, extent]`: the rows once per query head of a kv head's group,
    as `sdpa` folds the heads on CUDA (made once per step here rather than in every layer)."""
    n = block.shape[0]
    rel = torch.arange(extent, device=block.device) - start  # slot index relative to the step
    in_step = block.index_select(1, rel.clamp(0, n - 1)) & ((rel >= 0) & (rel < n))
    mask = ((rel < 0) | in_step)[None, None]
    return mask.repeat(1, 1, groups, 1) if groups > 1 else mask


class FlexMask:
    """The block mask of one step size over the whole cache. The cache blocks wholly before the
    step are full blocks (every query sees all of them: no `mask_mod` there); the blocks from the
    committed length to the step's last slot are partial (`mask_mod` decides); the rest is never
    visited. Only three small device tensors change per step (`update`); the block mask object
    is fixed, so CUDA graphs keep it."""

    def __init__(self, start: torch.Tensor, block: torch.Tensor, capacity: int) -> None:
        n = block.shape[0]
        # compiled FlexAttention on CPU fails to lower a 1-token step's query, a view of a 3-d
        # buffer (torch 2.13 inductor); padded to 2 rows, it is a 4-d buffer of its own
        self.rows = max(n, MIN_CPU_ROWS) if block.device.type == "cpu" else n
        n_q, self.n_kv = -(-self.rows // FLEX_BLOCK), -(-capacity // FLEX_BLOCK)
        dev = block.device
        self.full = torch.zeros((1, 1, n_q), dtype=torch.int32, device=dev)  # blocks before the step
        self.partial = torch.zeros((1, 1, n_q), dtype=torch.int32, device=dev)  # blocks the step touches
        self._order = torch.arange(self.n_kv, dtype=torch.int32, device=dev).expand(1, 1, n_q, self.n_kv).contiguous()
        self.indices = self._order.clone()  # the partial blocks', from the first the step touches

        def mask_mod(b, h, q, kv):
            rel = kv - start
            return (rel < 0) | ((rel < n) & block[q.clamp(max=n - 1), rel.clamp(0, n - 1)])

        self.block_mask = BlockMask.from_kv_blocks(
            self.partial,
            self.indices,
            self.full,
            self._order,
            BLOCK_SIZE=FLEX_BLOCK,
            mask_mod=mask_mod,
            seq_lengths=(self.rows, capacity),
        )
        self.size = n

    def update(self, committed: int) -> None:
        """Full blocks up to the committed length, partial ones up to the step's last slot
        (device fills, no sync)."""
        full = committed // FLEX_BLOCK
        self.full.fill_(full)
        self.partial.fill_(-(-(committed + self.size) // FLEX_BLOCK) - full)
        torch.add(self._order, full, out=self.indices).clamp_(max=self.n_kv - 1)

    def follow(self, start: torch.Tensor) -> None:
        """`update` from the device-held committed length (inside a captured step)."""
        full = torch.div(start, FLEX_BLOCK, rounding_mode="floor")
        self.full.copy_(full.expand_as(self.full))
        visible = torch.div(start + self.size + FLEX_BLOCK - 1, FLEX_BLOCK, rounding_mode="floor")
        self.partial.copy_((visible - full).expand_as(self.partial))
        torch.add(self._order, full.to(torch.int32), out=self.indices).clamp_(max=self.n_kv - 1)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """`[Hkv, K, D]` -> `[Hkv * groups, K, D]`, head h reading kv head h // groups."""
    if groups == 1:
        return x
    Hkv, K, D = x.shape
    return x[:, None].expand(Hkv, groups, K, D).reshape(Hkv * groups, K, D)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q `[H, n, D]`, k/v `[Hkv, extent, D]`, mask `[1, 1, n, extent]` (None: causal, with
    extent == n; on CUDA also `dense_mask`'s rows per group head) -> `[H, n, D]`."""
    H, n, D = q.shape
    groups = H // k.shape[0]
    if mask is None:  # flash kernels take causal attention with shared kv heads as they are
        return F.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=groups > 1
        )[0]
    if q.is_cuda:
        # A bool mask with enable_gqa falls back to the math kernel (quadratic memory, kv heads
        # copied). Folding each kv head's query group into the length keeps the memory-efficient
        # kernel: [Hkv, groups * n] queries against [Hkv, extent] keys.
        if mask.shape[2] != groups * n:
            mask = mask.repeat(1, 1, groups, 1)
        out = F.scaled_dot_product_attention(
            q.reshape(H // groups, groups * n, D)[None], k[None], v[None], attn_mask=mask, scale=scale
        )
        return out.reshape(H, n, D)  # the kernel's output may be laid out [n, H, D]
    # On CPU the kernel reads each kv head for its query group: the same sums as with the kv heads
    # repeated (as transformers does with a mask), bit for bit, without copying the cache per step.
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    return out[0]


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: FlexMask, scale: float) -> torch.Tensor:
    """q `[H, n, D]`, k/v the whole cache `[Hkv, capacity, D]` -> `[H, n, D]`."""
    n, groups = q.shape[1], q.shape[0] // k.shape[0]
    q = q[None].contiguous()
    if mask.rows > n:  # pad rows: they repeat row n-1's mask, and their output is dropped
        q = F.pad(q, (0, 0, 0, mask.rows - n))
    options = {"FORCE_USE_FLEX_ATTENTION": True} if q.shape[2] * groups > DECODE_ROWS else None
    out = flex_attention(
        q,
        k[None],
        v[None],
        block_mask=mask.block_mask,
        scale=scale,
        enable_gqa=groups > 1,
        kernel_options=options,
    )
    return out[0, :, :n]


def _dense_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in fp32 with its log-sum-exp: q `[H, n, D]`, k/v `[H, K, D]`, mask `[n, K]`."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float()), lse


def _committed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention over the committed slots: flash-attn where it can, else plain math."""
    if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
        out, lse, _ = flash_attn_func(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            softmax_scale=scale,
            causal=False,
            return_attn_probs=True,
        )
        return out[0].transpose(0, 1).float(), lse[0]
    groups = q.shape[0] // k.shape[0]
    return _dense_lse(q, _repeat_kv(k, groups), _repeat_kv(v, groups), None, scale=scale)


def split(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, committed: int, block: torch.Tensor, scale: float
) -> torch.Tensor:
    """q `[H, n, D]`; k/v the cache `[Hkv, >= committed + n, D]` with the step written after
    `committed`; block `[n, n]` -> `[H, n, D]`."""
    n, groups = q.shape[1], q.shape[0] // k.shape[0]
    step_k, step_v = (
        _repeat_kv(k[:, committed : committed + n], groups),
        _repeat_kv(v[:, committed : committed + n], groups),
    )
    out, lse = _dense_lse(q, step_k, step_v, block, scale=scale)
    if committed > 0:
        out_c, lse_c = _committed(q, k[:, :committed], v[:, :committed], scale)
        total = torch.logaddexp(lse, lse_c)
        out = out * torch.exp(lse - total).unsqueeze(-1) + out_c * torch.exp(lse_c - total).unsqueeze(-1)
    return out.to(q.dtype)

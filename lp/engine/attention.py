"""Attention of a packed step's tokens over the paged KV cache.

A step packs the tokens of several sequences (each a segment: its pending tokens, window and tree,
or a chunk of its prompt). One rule says what a token sees (`Visibility`): the slots its own
sequence owns at storage indices below its committed length, and among its segment's own slots
what the segment's block mask allows (its chain). Everything else (other sequences, speculative
tails, free pages, the pad page) is never seen. Three ways to apply it:

* `Grouped` (exact-size steps, the CPU default): the segments grouped by size and by length (a
  group pads its sequences' pages to its longest's: lp/engine/packed.py `by_length`), each group one
  `scaled_dot_product_attention` a layer over its sequences' pages gathered side by side (a view,
  without a copy, for one sequence whose pages are one run), under a mask evaluated once a step
  on the gathered slots. Each kv head's query heads are folded into the query length, which keeps
  one kv read per group (on a 2-core CPU 2.2x faster than repeating the kv heads, and 3.5x than a
  call per sequence, at 32 sequences of one token).
* `Dense` (fixed-shape steps, the GPU default, and models outside the Llama family): the rule
  evaluated over the whole cache, one `[n, slots]` mask a step.
* `FlexMask` (fixed-shape steps with `attention=flex`, opt-in: on an H200 its steps failed the
  CUDA tests that `Dense` passed): PyTorch's FlexAttention with the rule as its
  `mask_mod` and a block mask that visits, per block of 128 queries, only the key blocks that
  hold pages of the sequences in it (and the pad page's); the rule's tensors and the block lists
  are static buffers filled per step, so one block mask per step size serves every step inside
  a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from lp.engine.pages import PAGE

BACKENDS = ("auto", "sdpa", "flex")
FLEX_BLOCK = 128  # FlexAttention's tile: a key block holds FLEX_BLOCK // PAGE pages
# FlexAttention's decoding kernel stacks a kv head's query group: past this many rows it ran slower
# than the main kernel, or found no kernel at all (Llama-3-8B, 64 tokens x 4 heads, H100, torch 2.11)
DECODE_ROWS = 64
MIN_CPU_ROWS = 2  # query rows of a FlexAttention step on CPU (see FlexMask)


@dataclass
class Visibility:
    """What a step's tokens see, as device tensors: per token its sequence (`owner`, the pages'
    owner id), that sequence's committed length, its segment's first token (`base`, in the
    step) and size; the step's `[n, n]` block (within each segment: which of its tokens a token
    sees); per cache slot its owner and storage index (the page pool's)."""

    owner: torch.Tensor
    length: torch.Tensor
    base: torch.Tensor
    size: torch.Tensor
    block: torch.Tensor
    slot_owner: torch.Tensor
    slot_index: torch.Tensor

    def __call__(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Whether step token(s) `q` see cache slot(s) `kv` (broadcast)."""
        d = self.slot_index[kv] - self.length[q]  # the slot's place after the committed ones
        in_step = (d >= 0) & (d < self.size[q])
        j = (self.base[q] + d).clamp(0, self.block.shape[1] - 1)
        return (self.slot_owner[kv] == self.owner[q]) & ((d < 0) | (in_step & self.block[q, j]))


def _fold(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """`[H, g, n, D]` queries -> `[g, kv_heads, H / kv_heads * n, D]`: each kv head's query heads
    stacked along the length, so one kv read serves them."""
    H, g, n, D = q.shape
    return q.view(kv_heads, H // kv_heads, g, n, D).permute(2, 0, 1, 3, 4).reshape(g, kv_heads, -1, D)


def _unfold(out: torch.Tensor, H: int) -> torch.Tensor:
    """`_fold`'s inverse: `[g, kv_heads, H / kv_heads * n, D]` -> `[H, g * n, D]`."""
    g, kv_heads, _, D = out.shape
    return out.view(g, kv_heads, H // kv_heads, -1, D).permute(1, 2, 0, 3, 4).reshape(H, -1, D)


@dataclass
class Group:
    """Segments of one size bucket and like lengths (lp/engine/packed.py `PackedStep.groups`):
    their tokens' step indices `queries` `[g, n]` (a short segment's padded with its last token),
    their pages `[g, p]` (padded with the pad page) or, for one sequence whose pages are a run,
    that run's slots (`run`), the mask `[g, 1, groups * n, p * PAGE]` (folded query heads), which
    of the `g * n` rows are real (`rows`; None: all) and the step tokens they are (`tokens`)."""

    queries: torch.Tensor
    pages: torch.Tensor | None
    run: slice | None
    mask: torch.Tensor
    rows: torch.Tensor | None
    tokens: torch.Tensor


class Grouped:
    """Exact-size steps: one sdpa a group a layer (module docstring). `whole`: one group that is
    the whole step, in order, unpadded (one sequence's step)."""

    def __init__(self, groups: list[Group], whole: bool) -> None:
        self.groups, self.whole = groups, whole

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q `[H, n, D]` (the step's tokens in order), k/v a layer's cache `[Hkv, slots, D]`."""
        if self.whole:
            return self._attend(self.groups[0], q[:, None], k, v, scale)
        out = q.new_empty(q.shape)
        for g in self.groups:
            res = self._attend(g, q[:, g.queries], k, v, scale)
            out.index_copy_(1, g.tokens, res if g.rows is None else res.index_select(1, g.rows))
        return out

    @staticmethod
    def _attend(g: Group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """The group's queries `[H, g, n, D]` against its sequences' pages -> `[H, g * n, D]`."""
        kv_heads, _, D = k.shape
        if g.run is not None:
            keys, values = k[None, :, g.run], v[None, :, g.run]
        else:
            count, pages = g.pages.shape[0], g.pages.view(-1)
            keys, values = (
                c.view(kv_heads, -1, PAGE, D).index_select(1, pages).view(kv_heads, count, -1, D).transpose(0, 1)
                for c in (k, v)
            )
        out = F.scaled_dot_product_attention(_fold(q, kv_heads), keys, values, attn_mask=g.mask, scale=scale)
        return _unfold(out, q.shape[0])


class Dense:
    """The rule over the whole cache: `[1, 1, n, slots]` (on CUDA `[1, 1, groups * n, slots]`,
    its rows once per query head of a kv head's group, as sdpa folds the heads there), made by
    `refresh` from the rule's tensors (once a step, before the layers; inside a fixed-shape
    step's graph, from its static buffers)."""

    def __init__(self, visible: Visibility, slots: int, groups: int = 1) -> None:
        self.visible, self.slots, self.groups = visible, slots, groups
        self.mask: torch.Tensor | None = None

    def refresh(self) -> Dense:
        dev = self.visible.owner.device
        q = torch.arange(self.visible.owner.shape[0], device=dev)
        mask = self.visible(q[:, None], torch.arange(self.slots, device=dev)[None])[None, None]
        self.mask = mask.repeat(1, 1, self.groups, 1) if self.groups > 1 else mask
        return self

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return sdpa(q, k, v, self.mask, scale)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[H, n, D]`, k/v `[Hkv, extent, D]`, mask `[1, 1, n, extent]` (on CUDA also its rows
    per group head) -> `[H, n, D]`."""
    H, n, D = q.shape
    groups = H // k.shape[0]
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
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    return out[0]


class FlexMask:
    """The block mask of one step size over the whole cache: per block of FLEX_BLOCK queries, the
    key blocks it visits (`update`), each a partial block (`mask_mod` is the rule); the rest is
    never visited. Only its small device tensors change per step; the block mask object is fixed,
    so CUDA graphs keep it."""

    def __init__(self, visible: Visibility, slots: int) -> None:
        n = visible.owner.shape[0]
        # compiled FlexAttention on CPU fails to lower a 1-token step's query, a view of a 3-d
        # buffer (torch 2.13 inductor); padded to 2 rows, it is a 4-d buffer of its own
        self.rows = max(n, MIN_CPU_ROWS) if visible.owner.device.type == "cpu" else n
        n_q, self.blocks = -(-self.rows // FLEX_BLOCK), slots // FLEX_BLOCK
        dev = visible.owner.device
        self.counts = torch.zeros((1, 1, n_q), dtype=torch.int32, device=dev)
        self.indices = torch.zeros((1, 1, n_q, self.blocks), dtype=torch.int32, device=dev)

        def mask_mod(b, h, q, kv):
            return visible(q.clamp(max=n - 1), kv)

        self.block_mask = BlockMask.from_kv_blocks(
            self.counts, self.indices, BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod, seq_lengths=(self.rows, slots)
        )
        self.size = n

    def update(self, counts: torch.Tensor, indices: torch.Tensor) -> None:
        """Per query block, how many key blocks it visits and which (`[n_q]`, `[n_q, blocks]` int32)."""
        self.counts.copy_(counts.view_as(self.counts), non_blocking=True)
        self.indices.copy_(indices.view_as(self.indices), non_blocking=True)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q `[H, n, D]`, k/v the whole cache `[Hkv, slots, D]` -> `[H, n, D]`."""
        n, groups = q.shape[1], q.shape[0] // k.shape[0]
        q = q[None].contiguous()
        if self.rows > n:  # pad rows: they repeat row n-1's mask, and their output is dropped
            q = F.pad(q, (0, 0, 0, self.rows - n))
        options = {"FORCE_USE_FLEX_ATTENTION": True} if q.shape[2] * groups > DECODE_ROWS else None
        out = flex_attention(
            q, k[None], v[None], block_mask=self.block_mask, scale=scale, enable_gqa=groups > 1, kernel_options=options
        )
        return out[0, :, :n]


__all__ = ["BACKENDS", "FLEX_BLOCK", "Dense", "FlexMask", "Group", "Grouped", "Visibility", "sdpa"]

"""One model replica and its committed KV cache. It runs its rank's share of a step: one
masked forward, with no communication, returning logits for the rows the step uses."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lp import kernels
from lp.graph import PaddedLayout, StaticSteps, pad_layout
from lp.kv import CommittedKV
from lp.lookahead.mask import StepLayout


@dataclass
class _DeviceLayout:
    mask: torch.Tensor  # [T, T] bool
    depth: torch.Tensor  # [T] long
    rows: torch.Tensor  # [R] long


class Worker:
    """Runs forwards of a transformers causal LM over lp's step layouts. With `graphs`, steps
    run at fixed shapes (lp/graph.py), captured as CUDA graphs on a GPU."""

    def __init__(self, model: torch.nn.Module, graphs: bool = False) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.body = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.kv = CommittedKV(model.config.get_text_config().num_hidden_layers)
        self.static = StaticSteps(self.body, self.head, self.kv, self.device) if graphs else None
        if self.device.type == "cpu":
            kernels.install(model)  # faster few-token matmuls for lp's steps (lp/kernels.py)
        self._layouts: dict[StepLayout, _DeviceLayout | PaddedLayout] = {}

    def reset(self, capacity: int) -> None:
        """Start a new sequence with room for `capacity` tokens of KV."""
        if self.static is not None:  # room for a padded step, in units that keep the graphs
            capacity = self.static.reserve(capacity + StaticSteps.slack)
        self.kv.reset(capacity)

    def commit(self, n: int) -> None:
        self.kv.commit(n)

    def _on_device(self, layout: StepLayout) -> _DeviceLayout | PaddedLayout:
        dev = self._layouts.get(layout)
        if dev is None:
            if self.static is not None:
                dev = pad_layout(layout, self.device)
            else:
                to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
                dev = _DeviceLayout(to(layout.mask), to(layout.depth), to(layout.logit_rows))
            self._layouts[layout] = dev
        return dev

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """Forward T tokens after the committed prefix; `block` is their [T, T] mask."""
        T, c = ids.shape[0], self.kv.length
        mask = torch.ones((1, 1, T, c + T), dtype=torch.bool, device=self.device)
        mask[0, 0, :, c:] = block
        out = self.body(
            input_ids=ids[None], position_ids=positions[None], attention_mask=mask,
            past_key_values=self.kv, use_cache=True,
        )
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> None:
        """Commit the KV of a prompt prefix (causal), without computing any logits."""
        T = ids.shape[0]
        if T == 0:
            return
        block = torch.ones((T, T), dtype=torch.bool, device=self.device).tril_()
        positions = torch.arange(self.kv.length, self.kv.length + T, device=self.device)
        self._run(ids, positions, block)
        self.kv.commit(T)

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, layout: StepLayout, x0_position: int) -> torch.Tensor:
        """One step's forward: logits `[R, vocab]` for `layout.logit_rows`. The KV of all T
        tokens is written but not committed; call `commit(layout.m)` to keep the pending ones."""
        dev = self._on_device(layout)
        with kernels.small_m():
            if self.static is not None:
                return self.static.step(ids, dev, x0_position)
            hidden = self._run(ids, dev.depth + x0_position, dev.mask)
            return self.head(hidden.index_select(0, dev.rows))

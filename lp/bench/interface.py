"""What every decoder of the benchmark implements (`BenchDecoder`; not to be confused with
`lp.decode.loop.Decoder`, lp's own decode loop) and returns (`DecodeOutput`), and the `Context`
the decoders of one rank share. Timing uses `time.perf_counter` with CUDA synchronisation at the
boundaries (`sync`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lp import models
from lp.decode.record import Generation


@dataclass(frozen=True)
class DecodeOutput(Generation):
    """A benchmark decoder's result: lp's record (`seconds`: decode time after the prefill)
    plus what the benchmark times."""

    step_latencies: list[float] = field(default_factory=list)
    forward_seconds: float | None = None  # lp: time inside the model forward (the rest is host + collective)
    after_read: list[float] = field(default_factory=list)  # lookahead: each step's read to the next forward
    chosen: dict = field(default_factory=dict)  # lp with W/N/G auto: the shape used and why


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BenchDecoder:
    """One decoder of the benchmark. `local`: it runs on rank 0 only. `unsupported`: why it
    cannot run in this setting (then the harness writes a row saying so and never calls it)."""

    name: str = ""
    local: bool = False

    def __init__(self, label: str, world_size: int, settings: dict | None = None) -> None:
        self.label = label
        self.world_size = world_size
        self.settings = settings or {}
        self.unsupported: str | None = None
        self.note: str | None = None  # shown in the output when the decoder runs but differs from its name

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------- lp


@dataclass
class Context:
    """What decoders share on this rank: lp's replica (`lm`, with the collective), the model's
    local path, dtype, and end-of-sequence / padding ids; and each baseline's own copy of the
    model (`load_model`); `options`: the engine options lp's replica was built with (LP's keyword
    arguments), for another lp runtime (`tp_impl=lp`)."""

    lm: object
    path: str
    dtype: torch.dtype
    options: dict = field(default_factory=dict)

    @property
    def comm(self):
        return self.lm.comm

    def load_model(self, device: str | torch.device | None = None) -> torch.nn.Module:
        """A fresh copy of the model for a baseline to own (the same weights and dtype, sdpa
        attention, as lp's), on `device` (default: this rank's): lp's worker may compile or
        hold state on its own model, so no baseline ever shares it."""
        return models.load(self.path, self.dtype, device or self.comm.device)[0]

    @property
    def eos_ids(self) -> list[int]:
        return sorted(self.lm.decoder.eos_ids)

    @property
    def pad_id(self) -> int | None:
        pad = self.lm.tokenizer.pad_token_id
        if pad is None:
            pad = self.lm.model.generation_config.pad_token_id
        return pad

"""What a decode returns (`Generation`, with S and tokens/s computed once) and how it is timed
(`collector_paused`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lp.decode import throughput


@dataclass(frozen=True)
class Generation:
    """One sequence's result: the record every decoder returns (lp.frontend.runtime.Result and the
    benchmark's rows extend it), its figures computed here once. `prefill_seconds` is the
    prompt's prefill, with the host's indexing of the prompt for drafts (which a GPU's prefill
    hides; in a batch with `first_step_with_prompt`, all but its last chunk's forward, which the
    first step shares); `seconds` the decode time after it; `accepted_per_step` the tokens
    committed by each step, `fed_per_step` the tokens of this rank's forward in each step and
    `whole_per_step` the whole step's, as one rank would feed it (the same on every rank, and
    `fed_per_step` on one; both empty where a decoder cannot tell)."""

    output_ids: list[int]
    steps: int
    prefill_seconds: float
    seconds: float
    accepted_per_step: list[int]
    fed_per_step: list[int]
    whole_per_step: list[int]

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def S(self) -> float:  # noqa: N802 - the docs' name for it
        """S: generated tokens per decoding step."""
        return throughput.tokens_per_step(self.new_tokens, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return throughput.tokens_per_s(self.new_tokens, self.seconds)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block, then as it was: a decode is
    timed without a collection landing in it (lp.bench gives every decoder the same)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()

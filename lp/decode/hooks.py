"""What a decode tells its caller step by step, and how a caller ends it early: the tokens each
step commits (`on_tokens`, streaming), a deterministic `stop` predicate that every rank
evaluates alike (stop strings), and rank 0's `cancelled` (a client that left), which reaches
every rank in the step's all-gathered messages (lp/message.py `HALT`), so no rank ends a step
before another and no collective is added (but one all-reduce of the flag in a tensor-parallel
group, whose ranks share no message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lp.engine.tp import TensorGroup
from lp.message import HALT

OnTokens = Callable[[list[int]], None]  # a step's committed tokens
Stop = Callable[[list[int]], bool]  # the output so far -> end the decode after this step
Cancelled = Callable[[], bool]  # asked on world rank 0 before each step's message


@dataclass
class StepHooks:
    """A decode's hooks on one rank. `polls`: this rank asks `cancelled` (world rank 0); every
    rank that decodes with a `cancelled` stamps its messages with the answer (others with 0:
    lp/decode/batch.py)."""

    on_tokens: OnTokens | None = None
    stop: Stop | None = None
    cancelled: Cancelled | None = None
    polls: bool = False
    tp: TensorGroup | None = None
    output: list[int] = field(default_factory=list)  # what `stop` reads: every committed token

    @classmethod
    def of(
        cls, on_tokens: OnTokens | None, stop: Stop | None, cancelled: Cancelled | None, rank: int, tp: TensorGroup
    ) -> StepHooks:
        """The hooks of rank `rank` of the LP ranks, rank `tp.rank` of its tensor-parallel group."""
        return cls(on_tokens, stop, cancelled, polls=rank == 0 and tp.rank == 0, tp=tp)

    def ended(self, tokens: list[int], gathered: np.ndarray) -> bool:
        """After a step's messages are merged: hand its committed `tokens` on; True where the
        decode ends here (rank 0 asked to halt, or `stop` holds)."""
        if self.on_tokens is not None:
            self.on_tokens(tokens)
        halted = self.cancelled is not None and bool(gathered[:, HALT].any())
        if self.stop is None:
            return halted
        self.output.extend(tokens)
        return halted or bool(self.stop(self.output))


__all__ = ["Cancelled", "OnTokens", "StepHooks", "Stop"]

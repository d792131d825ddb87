"""One sequence's decode state, identical on every rank, and its two per-step actions on the
device: deciding its step from its logits, and packing the rank's message."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from lp.decode.plan import StepPlan, next_pending
from lp.engine.packed import SegmentTensors
from lp.message import CHECK_MOD, pack
from lp.verify.greedy import Acceptance
from lp.verify.verifier import StepRows, Verifier


def fingerprint(*parts: object) -> int:
    """A rank-independent hash of plain values (prompts, settings)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


@dataclass
class DecodeState:
    """The output so far and its running checksum (every message carries it and the sequence's
    length, so ranks that drifted apart are caught), the tokens the next step feeds before its
    window and tree (x0 last), and what each step committed and fed: this rank's forward's tokens
    (`fed_per_step`) and the whole step's, as one rank would feed it (`whole_per_step`, the same on
    every rank: what W=auto's tuner learns from)."""

    prompt: list[int]
    checksum: int = 0
    output: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    fed_per_step: list[int] = field(default_factory=list)
    whole_per_step: list[int] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        self.checksum, self.pending = fingerprint(self.prompt), self.prompt[-1:]

    @property
    def length(self) -> int:
        """The committed text's length: the prompt and the output."""
        return len(self.prompt) + len(self.output)

    def clip(self, tokens: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> list[int]:
        """A step's committed tokens cut at `max_new_tokens` and after the first EOS (then `stopped`)."""
        tokens = tokens[: max_new_tokens - len(self.output)]
        if eos_ids.isdisjoint(tokens):  # most steps: no scan
            return tokens
        self.stopped = True
        return tokens[: next(i for i, t in enumerate(tokens) if t in eos_ids) + 1]

    def advance(self, tokens: list[int], fed: int, whole: int, keep: bool = False) -> None:
        """Commit a step's `tokens` (fed `fed` tokens to this rank's forward, `whole` in the whole
        step); `keep`: their drafts' KV was kept, so the next step feeds only the last
        (`next_pending`)."""
        for t in tokens:
            self.checksum = (self.checksum * 31 + t) % CHECK_MOD
        self.output.extend(tokens)
        self.pending = next_pending(tokens, keep)
        self.accepted.append(len(tokens))
        self.fed_per_step.append(fed)
        self.whole_per_step.append(whole)


def decide(
    verify: Verifier,
    logits: torch.Tensor,
    argmax: torch.Tensor,
    ids: torch.Tensor,
    step: StepPlan,
    on_device: SegmentTensors,
    *,
    steps_done: int,
    max_commit: int,
) -> tuple[torch.Tensor, torch.Tensor, Acceptance]:
    """This rank's decision on a sequence's step, queued on the device (no sync): its logits rows
    and their `argmax` (the whole step's, one pass), the next token y1 after x0 and the
    acceptance of this rank's tree nodes; `ids`: the step's ids of the sequence."""
    layout = step.layout
    rows = StepRows(
        logits=logits,
        argmax=argmax,
        layout=layout,
        tree=step.tree,
        mine=step.plan.candidates,
        nodes=ids[layout.node_tokens],
        parents=on_device.parents,
        depth=on_device.tree_depth,
        ancestors=on_device.tree_ancestors,
        step=steps_done,
        max_commit=max_commit,
        owned=step.dups,
        order=step.order,
    )
    y1, acc = verify(rows)
    return argmax, y1, acc


def message(
    state: DecodeState,
    step: StepPlan,
    decision: tuple[torch.Tensor, torch.Tensor, Acceptance],
    *,
    W: int,
    successors: torch.Tensor | None = None,
    rows: int = 0,
) -> torch.Tensor:
    """This rank's message for the step's all-gather (lp.message), built on the device."""
    argmax, y1, acc = decision
    return pack(
        y1,
        acc,
        first_candidate=step.first_node,
        new=argmax[step.layout.column_rows],
        length=state.length,
        checksum=state.checksum,
        W=W,
        successors=successors,
        rows=rows,
    )

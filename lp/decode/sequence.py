"""One sequence of a batch: what its caller asked (`Request`), and what it owns while it decodes
(`Sequence`): its KV pages, its drafting state, its decode state, its verifier and hooks, and its
next step's plan. A batch (lp/decode/batch.py) steps many of them together."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lp.config import DecodeConfig
from lp.decode.drafter import Drafter
from lp.decode.hooks import Cancelled, OnTokens, StepHooks, Stop
from lp.decode.plan import StepPlan
from lp.decode.record import Generation
from lp.decode.shares import window_share
from lp.decode.state import DecodeState, decide, message
from lp.engine.packed import PackedTensors, Segment, SegmentTensors, prompt_chunk, step_segment
from lp.engine.pages import SequenceKV
from lp.lookahead.memory import DraftMemory
from lp.message import successor_rows
from lp.verify.verifier import GreedyVerifier, Verifier, verifier_for


@dataclass(frozen=True)
class StepOutputs:
    """A step's logits rows, and what one pass over all of them gives every sequence: each row's
    argmax and its `top` next tokens (as many as the most successors a sequence of the step keeps;
    none in a step of plain batched decoding, where the budget chose no node: it teaches no
    successor table)."""

    logits: torch.Tensor
    argmax: torch.Tensor
    top: torch.Tensor


@dataclass
class Request:
    """One sequence a caller asks for: its prompt ids and settings, its random stream when sampling
    (`stream`, with `cfg.seed`), and optionally its acceptance rule (`verifier`), what it tells the
    caller each step and what ends it early (`on_tokens`, `stop`, `cancelled`: lp/decode/hooks.py).
    `shared`: its tree competes for the step's budget (lp/decode/budget.py; the shapes W=auto
    chooses), else every node of it is verified. `tag`: the caller's, untouched."""

    prompt: list[int]
    cfg: DecodeConfig
    stream: int = 0
    verifier: Verifier | None = None
    on_tokens: OnTokens | None = None
    stop: Stop | None = None
    cancelled: Cancelled | None = None
    shared: bool = False
    tag: Any = None


class Sequence:
    """A request being decoded by rank `rank` of P: prefilling its prompt (all but its last token,
    x0), then decoding, then done (`result`)."""

    def __init__(
        self,
        request: Request,
        kv: SequenceKV,
        vocab: int,
        *,
        P: int,
        rank: int,
        tp: Any,
        memory: DraftMemory | None = None,
    ) -> None:
        cfg = request.cfg
        self.request, self.cfg, self.kv = request, cfg, kv
        # one replica keeps its accepted drafts' KV; over P ranks a draft's KV lies on one of them
        self.keep = P == 1 and cfg.step_shape[3] > 0
        self.drafter = Drafter(cfg, request.prompt, vocab, P=P, rank=rank, keep=self.keep, memory=memory)
        self.state = DecodeState(request.prompt)
        self.verify = request.verifier or verifier_for(
            cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, stream=request.stream
        )
        self.hooks = StepHooks.of(request.on_tokens, request.stop, request.cancelled, rank, tp)
        self.P = P
        self.prefilled = 0
        self.plan: StepPlan | None = None
        self.result: Generation | None = None
        self.admitted = self.decoding_since = time.perf_counter()
        # its messages' layout (lp/message.py): window slots, token slots, successor rows, successors
        W, _, _, limit = cfg.step_shape
        self.message_shape = W, cfg.max_commit, successor_rows(W, limit), cfg.successors_sent

    @property
    def to_prefill(self) -> int:
        """Prompt tokens whose KV is still to be written (x0, the last, is the first step's)."""
        return len(self.request.prompt) - 1 - self.prefilled

    @property
    def decoding(self) -> bool:
        return self.to_prefill == 0 and self.result is None

    def chunk(self, n: int) -> Segment:
        """The next `n` prompt tokens as a segment (their KV is committed by `prefilled`)."""
        start = self.prefilled
        self.kv.reserve(start + n)
        ids = np.asarray(self.request.prompt[start : start + n], dtype=np.int64)
        return prompt_chunk(self.kv.owner, ids, start, self.kv.table)

    def prefilled_chunk(self, n: int) -> None:
        self.prefilled += n
        self.kv.length += n
        if self.decoding:
            self.decoding_since = time.perf_counter()

    def fixed_tokens(self) -> int:
        """The tokens this rank feeds of the next step whatever its tree: its pending tokens and
        its window's share."""
        W, N, _, _ = self.cfg.step_shape
        return window_share(W, N, self.P, len(self.state.pending))

    def segment(self) -> Segment:
        """The next step's segment (its plan laid out, at its sequence positions)."""
        layout = self.plan.layout
        self.kv.reserve(self.kv.length + layout.size)
        return step_segment(self.kv.owner, layout, self.plan.ids, self.state.length - 1, self.kv.length, self.kv.table)

    @property
    def plain(self) -> bool:
        """This rank's share of its planned step feeds its pending tokens alone (no window, no tree
        node) and decides greedily: its message is `lp.message.pack_plain`'s, which a batch makes
        for all such sequences of a step at once (a plain step's decision then costs what plain
        decoding's does). Greedy: lp's own verifier, not a caller's (a subclass may decide otherwise)."""
        layout = self.plan.layout
        return type(self.verify) is GreedyVerifier and not len(layout.parents) and not len(layout.columns)

    def decide(
        self, rows: StepOutputs, seg: SegmentTensors, packed: PackedTensors, steps: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """This rank's message for the step, and the kept drafts' moves (their slots, from and to;
        None without `keep`), queued on the device. `rows`: the step's logits and what one pass
        over all of them gives; `steps`: `arange` of at least `max_commit`."""
        cfg, plan = self.cfg, self.plan
        W, _, message_rows, k = self.message_shape
        logits = rows.logits[seg.rows]
        decision = decide(
            self.verify,
            logits,
            rows.argmax[seg.rows],
            seg.ids,
            plan,
            seg,
            steps_done=len(self.state.accepted),
            max_commit=cfg.max_commit,
        )
        # every used row's input token and its top-k next tokens, for the successor table (but
        # the rows of nodes fed again: another rank's, which sends them); none where the step
        # computed no top-k: the budget gave no node (plain batched decoding teaches no table)
        top = None
        if k and rows.top.shape[1] < k:
            top = seg.ids.new_zeros((0, 1 + k))
        elif k:
            inputs = packed.ids.index_select(0, packed.rows[seg.rows])
            top = torch.cat([inputs[:, None], rows.top[seg.rows, :k]], dim=1)
            if plan.dups:
                own = 1 + len(plan.layout.columns)
                top = torch.cat([top[:own], top[own + plan.dups :]])
        mine = message(self.state, plan, decision, W=W, successors=top, rows=message_rows)
        if not self.keep or not len(plan.layout.parents):  # no drafts: none to keep
            return mine, None
        # the accepted drafts' KV, moved after x0's: the next step feeds only the bonus token
        _, _, acc = decision
        path, size = acc.path, plan.layout.size
        first = size - len(plan.layout.parents)  # the first node's index in the segment
        at = steps[: path.shape[0]]
        real = path >= 0
        src = seg.slots.index_select(0, (first + path).clamp(0, size - 1))
        dst = seg.slots.index_select(0, (1 + at).clamp(max=size - 1))
        zero = torch.zeros_like(src)  # the pad page's first slot, onto itself
        return mine, (torch.where(real, src, zero), torch.where(real, dst, zero))

    def advance(self, gathered: np.ndarray, eos: np.ndarray) -> bool:
        """The step's messages (`[P, K]`, this sequence's) merged and committed: True where the
        sequence has ended (an EOS, `max_new_tokens`, a stop string, rank 0's cancel)."""
        plan, state = self.plan, self.state
        remaining = self.cfg.max_new_tokens - len(state.output)
        tokens, stopped = self.drafter.after_read(gathered, plan, remaining, eos)
        pending = len(state.pending)
        state.advance(tokens, plan.layout.size, plan.whole, self.keep)
        self.kv.length += len(tokens) if self.keep else pending
        self.plan = None
        ended = self.hooks.ended(tokens, gathered)
        state.stopped = stopped or ended
        return state.stopped or len(state.output) >= self.cfg.max_new_tokens

    def finish(self) -> Generation:
        """Leave: the pages given back, the result made."""
        self.kv.release()
        end = time.perf_counter()
        state = self.state
        self.result = Generation(
            output_ids=state.output,
            steps=len(state.accepted),
            prefill_seconds=self.decoding_since - self.admitted,
            seconds=end - self.decoding_since,
            accepted_per_step=state.accepted,
            fed_per_step=state.fed_per_step,
            whole_per_step=state.whole_per_step,
        )
        return self.result


__all__ = ["Request", "Sequence", "StepOutputs"]

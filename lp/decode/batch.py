"""The batch: the sequences decoded together, and one step over all of them. World size 1 and P
replicas run this same code: per step each rank runs one forward over its share of every
sequence's step (lp/engine/packed.py), then one all-gather of every sequence's message merges
them, so every sequence's window, pool and output stay identical on all ranks.

A step, top to bottom:
  admit    waiting requests join, up to `max_batch` running, while the cache can promise their pages;
  plan     each decoding sequence grows its next tree, the step's budget (lp/decode/budget.py) says
           how many of its nodes it verifies, and it lays out its share of the step;
  pack     prompt chunks of the sequences still prefilling (at most `prefill_chunk` tokens a step,
           first come first), then every decoding sequence's step, side by side (with
           `first_step_with_prompt`, including a sequence whose last chunk is in the step);
  forward  one masked pass, no communication (lp/worker.py);
  decide   each decoding sequence's acceptance and message, on the device (those whose steps are
           plain, a few tensor ops for all of them); where one replica decodes, the accepted
           drafts' KV moved after x0's (`keep`);
  gather   one all-gather of every sequence's message: the step's one device read;
  advance  each sequence merges its messages, commits its tokens, feeds its sources; those that
           ended (EOS, max_new_tokens, a stop string, a cancel) leave at once and free their pages,
           and teach the draft memory their text, in the batch's order (the same on every rank).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from lp.collective import Collective
from lp.decode.budget import Budget, Claim
from lp.decode.sequence import Request, Sequence, StepOutputs
from lp.decode.shares import largest_share
from lp.decode.state import fingerprint
from lp.engine.packed import PackedStep, on_device
from lp.engine.pages import pages_for
from lp.errors import LPError
from lp.lookahead.memory import DraftMemory
from lp.message import HALT, pack_plain
from lp.partition import RankPlan
from lp.worker import MAX_STEP, STEP_ROOM, Worker

PREFILL_CHUNK = 512  # prompt tokens a step prefills at most, by default


class StepObserver:
    """Watches a batch's steps from outside (the benchmark times forwards with it). Every method is
    a no-op here; none may change the decode."""

    def prefill_done(self) -> None:
        """A sequence's prompt is in the cache (with `first_step_with_prompt`: its last chunk is in
        the step about to run, beside its first decode step) and its drafting state made: its
        decode's clock starts here."""

    def planned(self, step: object, position: int) -> None:
        """A sequence's step is planned (its tree, every rank's share, this rank's layout); x0 sits
        at sequence position `position`."""

    def forward_start(self) -> None:
        """A step's forward is about to be queued."""

    def forward_done(self) -> None:
        """A step's forward is queued."""

    def message_read(self) -> None:
        """A step's gathered messages are on the host: from here to the next `forward_start` is
        host work that a device waits for."""


@dataclass(frozen=True)
class PlainSteps:
    """Decoding sequences of one message shape whose steps are plain (`Sequence.plain`): their
    places among the step's decoding sequences, and what their messages need on the device
    (`lp.message.pack_plain`'s `known`)."""

    members: list[int]
    shape: tuple[int, int, int, int]
    known: torch.Tensor

    def messages(self, rows: StepOutputs) -> torch.Tensor:
        """Their messages, `[len(members), size]`: one pass for all of them over the step's rows."""
        W, max_commit, successor_rows, k = self.shape
        return pack_plain(rows.argmax, rows.top, self.known, W, max_commit, successor_rows, k)


class Batch:
    """Sequences decoded together on this rank (all ranks build one alike and submit the same
    requests in the same order). `max_context`: the longest sequence, prompt included;
    `max_batch`: sequences decoding at once (the rest wait); `prefill_chunk`: prompt tokens a step
    prefills at most; `budget`: how a step's tree nodes are
    shared (lp/decode/budget.py; requests whose trees are not `shared` verify all of theirs);
    `memory`: the draft memory its sequences draw on and teach (lp/lookahead/memory.py; None:
    none); `rehearse`: rehearse a lone sequence's next plan while the device computes (a GPU's host);
    `first_step_with_prompt`: a sequence's first decode step shares the forward that writes its
    prompt's last chunk (its first token a forward sooner: the server's), else it follows it (the
    decode's clock then starts with its prompt in the cache, as benchmarks time a decode; with it,
    the clock takes in that last chunk's forward, and a batch whose step failed is not reused)."""

    def __init__(
        self,
        worker: Worker,
        comm: Collective,
        eos_ids: frozenset[int],
        max_context: int,
        *,
        max_batch: int = 1,
        prefill_chunk: int = PREFILL_CHUNK,
        budget: Budget | None = None,
        observer: StepObserver | None = None,
        memory: DraftMemory | None = None,
        rehearse: bool = False,
        first_step_with_prompt: bool = False,
    ) -> None:
        for key, value in (("max_batch", max_batch), ("prefill_chunk", prefill_chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LPError(f"{key} must be an integer >= 1, got {value!r}")
        self.worker, self.comm, self.max_context = worker, comm, min(max_context, worker.max_seq_len)
        self.eos = np.array(sorted(eos_ids), dtype=np.int64)  # as the compiled merge reads them
        self.max_batch, self.prefill_chunk = max_batch, prefill_chunk
        self.budget = budget or Budget("none")
        self.observe = observer or StepObserver()
        self.memory, self.rehearse, self.first_step_with_prompt = memory, rehearse, first_step_with_prompt
        self.waiting: deque[Request] = deque()
        self.running: list[Sequence] = []
        self._steps = torch.arange(0, device=worker.device)  # kept drafts' depths: max_commit of any sequence
        self._successors = 0  # the top-k successors the planned step computes (`_plan`)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def check(self, request: Request) -> None:
        """Refuse a request that could never run here (its settings, its length, the cache)."""
        cfg = request.cfg.validate()
        if not request.prompt:
            raise LPError("empty prompt")
        L = len(request.prompt)
        if L + cfg.max_new_tokens > self.max_context:
            raise LPError(
                f"prompt ({L} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                f"{self.max_context} tokens this model decodes (its context, or max_seq_len)"
            )
        W, N, G, _ = cfg.step_shape
        shape = f"W={W} N={N} G={G}" + (f" step_tokens={cfg.step_tokens}" if cfg.step_tokens else "")
        share = largest_share(cfg, self.comm.world_size)
        if share > MAX_STEP:
            raise LPError(
                f"{shape}: a step of this shape feeds up to {share} tokens a rank, more than {MAX_STEP}: "
                "lower W, N, G or step_tokens"
            )
        deepest = max(W + N - 3, cfg.max_draft) if cfg.lookahead else 0
        if deepest >= STEP_ROOM:
            raise LPError(
                f"{shape}: a step of this shape reaches {deepest} positions past x0, lp at most "
                f"{STEP_ROOM - 1}: lower W or N"
            )
        most = self._most(request)
        if pages_for(most) > self.worker.kv.pool.pages - 1:
            raise LPError(
                f"the sequence needs {most} KV slots (prompt, max_new_tokens and a step), more than the cache's "
                f"{self.worker.kv_tokens} (kv_tokens)"
            )

    def _most(self, request: Request) -> int:
        """The storage indices a request's sequence may use: its prompt, its new tokens, a step."""
        cfg = request.cfg
        return len(request.prompt) + cfg.max_new_tokens + largest_share(cfg, self.comm.world_size)

    def submit(self, request: Request) -> None:
        """Queue a request (it joins at the next step with room); an LPError where it could never run."""
        self.check(request)
        self.waiting.append(request)

    def step(self) -> list[Sequence]:
        """One step of every running sequence: those that ended in it, done (`result`)."""
        self._admit()
        chunks = self._chunks()
        segments = [seq.chunk(n) for seq, n in chunks]
        if self.first_step_with_prompt:
            # the chunks' KV counts as committed now: each layer writes the step's KV before any
            # token attends, so a sequence's first step sees its last chunk in the same forward
            self._prefilled(chunks)
        self._plan(sum(n for _, n in chunks))
        decoding = [s for s in self.running if s.plan is not None]
        segments += [seq.segment() for seq in decoding]
        if not segments:
            return []
        step = PackedStep(segments)
        plain = self._plain(decoding, step, len(chunks))
        if decoding:  # a step of prompt chunks alone is a prefill, not a decode step
            self.observe.forward_start()
        logits, on = self.worker.run(step)
        if decoding:
            self.observe.forward_done()
        k = self._successors
        top = logits.topk(k, dim=-1).indices if k else logits.new_zeros((logits.shape[0], 0), dtype=torch.long)
        rows = StepOutputs(logits, logits.argmax(dim=-1), top)  # one pass each over the step's rows
        messages: list[torch.Tensor | None] = [None] * len(decoding)
        for group in plain:
            for i, mine in zip(group.members, group.messages(rows)):
                messages[i] = mine
        moves = []
        for i, seq in enumerate(decoding):
            if messages[i] is None:
                messages[i], move = seq.decide(rows, on.segment(len(chunks) + i), on, self._steps)
                if move is not None:
                    moves.append(move)
        if moves:
            self.worker.move(torch.cat([m[0] for m in moves]), torch.cat([m[1] for m in moves]))
        if not self.first_step_with_prompt:
            self._prefilled(chunks)
        ended = []
        if decoding:
            for seq in decoding:  # what the outcome does not decide, while the device computes
                seq.drafter.before_read(self.rehearse and len(decoding) == 1)
            gathered = self.comm.all_gather(self._stamped(messages, decoding)).cpu().numpy()
            self.observe.message_read()
            at = 0
            for seq, mine in zip(decoding, messages):
                size = mine.shape[0]
                if seq.advance(np.ascontiguousarray(gathered[:, at : at + size]), self.eos):
                    ended.append(seq)
                at += size
        for seq in ended:
            seq.finish()
            self.running.remove(seq)
            if self.memory is not None and seq.cfg.memory:
                seq.drafter.teach(seq.request.prompt, seq.result.output_ids)
        return ended

    def _plain(self, decoding: list[Sequence], step: PackedStep, first: int) -> list[PlainSteps]:
        """The step's plain sequences (`Sequence.plain`) by message shape, what their messages need
        on the device copied now, before the forward; `first`: the first decoding segment in `step`."""
        groups: dict[tuple[int, int, int, int], list[int]] = {}
        for i, seq in enumerate(decoding):
            if seq.plain:
                groups.setdefault(seq.message_shape, []).append(i)
        made = []
        for shape, members in groups.items():
            states = [decoding[i].state for i in members]
            known = np.array(
                [
                    step.row_starts[first + np.array(members)],  # x0's row: a segment's first (StepLayout.X0_ROW)
                    [s.pending[-1] for s in states],
                    [s.length for s in states],
                    [s.checksum for s in states],
                ],
                dtype=np.int64,
            )
            made.append(PlainSteps(members, shape, on_device(known, self.worker.device)))
        return made

    def _prefilled(self, chunks: list[tuple[Sequence, int]]) -> None:
        """The step's prompt chunks count as written (they are, or are in the step about to run): a
        sequence whose whole prompt is in decodes."""
        for seq, n in chunks:
            seq.prefilled_chunk(n)
            if seq.decoding:
                self.observe.prefill_done()

    def _stamped(self, messages: list[torch.Tensor], decoding: list[Sequence]) -> torch.Tensor:
        """The step's messages in one tensor, each with its halt slot set to rank 0's answer to its
        `cancelled` (all-reduced in a tensor-parallel group, whose ranks share no message)."""
        mine = torch.cat(messages)
        polled = [i for i, seq in enumerate(decoding) if seq.hooks.cancelled is not None]
        if not polled:
            return mine
        halts = [int(decoding[i].hooks.polls and decoding[i].hooks.cancelled()) for i in polled]
        flags = torch.tensor(halts, dtype=mine.dtype, device=mine.device)
        tp = self.worker.tp
        if tp.size > 1:
            flags = tp.all_reduce(flags)
        starts = np.concatenate(([0], np.cumsum([m.shape[0] for m in messages])))
        index = torch.as_tensor(starts[polled] + HALT, device=mine.device)
        return mine.index_copy_(0, index, flags)

    def _admit(self) -> None:
        """Waiting requests join, first come first, while sequences and the cache have room."""
        pool = self.worker.kv.pool
        while self.waiting and len(self.running) < self.max_batch:
            request = self.waiting[0]
            most = self._most(request)
            if pages_for(most) > pool.lendable:
                break
            self.waiting.popleft()
            if self.comm.world_size > 1:
                self._handshake(request)
            cfg = request.cfg
            kv = self.worker.sequence(
                len(request.prompt) + cfg.max_new_tokens, largest_share(cfg, self.comm.world_size)
            )
            seq = Sequence(
                request,
                kv,
                self.worker.vocab_size,
                P=self.comm.world_size,
                rank=self.comm.rank,
                tp=self.worker.tp,
                memory=self.memory,
            )
            self.running.append(seq)
            self._prepare(seq)
            if len(self._steps) < cfg.max_commit:
                self._steps = torch.arange(cfg.max_commit, device=self.worker.device)
            if seq.decoding:
                self.observe.prefill_done()

    def _prepare(self, seq: Sequence) -> None:
        """At fixed shapes, compile (and capture) now every bucket of the decoding steps the running
        sequences can take together, and their kept drafts' moves, so that none is compiled inside
        a decode's clock (prompt chunks may compile theirs while they prefill, and with
        `first_step_with_prompt` a first step beside its prompt's last chunk)."""
        P = self.comm.world_size
        W, N, _, _ = seq.cfg.step_shape
        fewest = RankPlan(range(W), range(0)).cost(N, pending=1, candidate_tokens=1) if P == 1 else 1
        most = sum(largest_share(s.cfg, P) for s in self.running)
        moves = sum(s.cfg.max_commit - 1 for s in self.running if s.keep)
        self.worker.prepare(most, fewest + len(self.running) - 1, moves)

    def _handshake(self, request: Request) -> None:
        """Refuse to decode unless every rank got the same prompt and settings and holds the same
        draft memory (one all-gather per sequence, so a mismatch is an error rather than a garbled
        or hung step)."""
        remembered = self.memory.fingerprint if self.memory is not None else 0
        mine = torch.tensor(
            [fingerprint(request.cfg), fingerprint(request.prompt), remembered, self.comm.world_size],
            dtype=torch.long,
            device=self.worker.device,
        )
        seen = self.comm.all_gather(mine).cpu()
        if (seen != seen[0]).any():
            raise LPError(
                "rank mismatch: ranks were given different prompts or settings, or hold different draft "
                f"memories (fingerprints {seen[:, :3].tolist()})"
            )

    def _chunks(self) -> list[tuple[Sequence, int]]:
        """This step's prompt chunks: the prefilling sequences first come first, `prefill_chunk`
        tokens in all."""
        room, out = self.prefill_chunk, []
        for seq in self.running:
            n = min(seq.to_prefill, room)
            if n:
                out.append((seq, n))
                room -= n
            if not room:
                break
        return out

    def _plan(self, base: int) -> None:
        """Every decoding sequence's next step: its part of the step's budget (with `base` prompt
        tokens in the step), its tree grown (to at most the step's nodes: none where the budget
        gives none), cut, laid out."""
        seqs = [s for s in self.running if s.decoding]
        claims = []
        for seq in seqs:
            fixed, pending = seq.fixed_tokens(), len(seq.state.pending)
            shared = seq.request.shared and seq.drafter.shape.shared
            claims.append(Claim(fixed, seq.drafter.cap(pending), shared, window=fixed - pending))
        total = self.budget.total(claims, base)
        # the step's successor rows: none where the budget chose plain batched decoding (it gives no
        # node, and would give none without the step's prompt chunk), so lookahead under load costs
        # what plain decoding does; a tree that found nothing to draft, or whose nodes a prompt
        # chunk crowded out, still learns
        plain = (self.budget.total(claims) if base else total) == 0
        self._successors = max(
            (seq.cfg.successors_sent for seq, claim in zip(seqs, claims) if not (plain and claim.shared)), default=0
        )
        grown = []
        for seq, claim in zip(seqs, claims):
            # no shared tree gets more than the step's nodes: growing more is host work for nothing
            chances = seq.drafter.grow(len(seq.state.pending), min(claim.cap, total) if claim.shared else claim.cap)
            grown.append(replace(claim, chances=np.zeros(0) if chances is None else chances))
        counts = self.budget.split(grown, total)
        for seq, claim, k in zip(seqs, grown, counts):
            seq.plan = seq.drafter.plan(seq.state.pending, k if claim.shared else None)
            self.observe.planned(seq.plan, seq.state.length - 1)

    def drain(self) -> Iterator[Sequence]:
        """Step until every submitted request is done, yielding each as it ends."""
        while not self.idle:
            yield from self.step()


__all__ = ["PREFILL_CHUNK", "Batch", "Request", "StepObserver"]

"""The decode loop: exact greedy lookahead decoding (or plain autoregressive decoding) under
Lookahead Parallelism. World size 1 and P run this same code; per step each rank runs one
forward over its share, then one all-gather merges the results, so window, pool and output
stay identical on all ranks."""

from __future__ import annotations

import time

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.drafter import Drafter, warm_up
from lp.decode.hooks import Cancelled, OnTokens, StepHooks, Stop
from lp.decode.plan import Split, StepPlan, plan_step
from lp.decode.record import Generation, collector_paused
from lp.decode.shares import largest_share
from lp.decode.state import DecodeState, decide, fingerprint, message
from lp.engine import step_tensors
from lp.errors import LPError
from lp.lookahead.tree import TreeBuilder
from lp.message import merge, successor_rows
from lp.partition import RankPlan
from lp.verify.verifier import Verifier, verifier_for
from lp.worker import Worker


class StepObserver:
    """Watches a decode from outside (the benchmark times forwards with it). Every method is a
    no-op here; none may change the decode."""

    def prefill_done(self) -> None:
        """The prompt's KV is queued (not necessarily computed) on the device, and the host has
        indexed the prompt for drafts: the decode's clock starts here."""

    def planned(self, step: StepPlan, position: int) -> None:
        """A step is planned (its tree, every rank's share, this rank's layout). x0 sits at
        sequence position `position`; the KV cache holds the `position + 1 - step.layout.m`
        tokens before the step's pending ones."""

    def forward_start(self) -> None:
        """A step's forward is about to be queued."""

    def forward_done(self) -> None:
        """A step's forward is queued."""

    def message_read(self) -> None:
        """A step's gathered messages are on the host: from here to the next `forward_start`
        is host work that a device waits for (except in `mode=ar` one step ahead, where the
        next step is queued before this read)."""


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the host's compiled code of a decode: the drafter's and
    the layout's padding, before any decode's clock starts."""
    warm_up()
    step_tensors.compile_kernels()


class Decoder:
    """Decodes with one Worker per rank; all ranks call `generate` with the same arguments."""

    def __init__(
        self,
        worker: Worker,
        collective: Collective,
        eos_ids: set[int],
        max_context: int,
        ahead: bool | None = None,
        rehearse: bool | None = None,
    ) -> None:
        """`ahead`: run greedy `mode=ar` one step ahead of the host (`_decode_ahead`); None: where
        the device runs asynchronously to the host (CUDA) and the all-gather does not wait for
        it (not over gloo through host memory). Elsewhere it would only add a step. `rehearse`:
        rehearse each step's plan while the device computes (lp/decode/phases.py `before_read`); None:
        where the device runs asynchronously to the host (CUDA). A CPU's forward would wait for it."""
        self.worker = worker
        self.comm = collective
        self.eos_ids = frozenset(eos_ids)
        self._eos = np.array(sorted(self.eos_ids), dtype=np.int64)  # as the compiled observe reads them
        self.max_context = max_context
        cuda = worker.device.type == "cuda"
        self.ahead = cuda and not collective.staged if ahead is None else ahead
        self.rehearse = cuda if rehearse is None else rehearse
        compile_kernels()

    def _handshake(self, prompt: list[int], cfg: DecodeConfig) -> None:
        """Refuse to decode unless every rank got the same prompt and settings (one all-gather
        per sequence, so a mismatch is an error rather than a garbled or hung step)."""
        mine = torch.tensor(
            [fingerprint(cfg), fingerprint(prompt), self.comm.world_size], dtype=torch.long, device=self.worker.device
        )
        seen = self.comm.all_gather(mine).cpu()
        if (seen != seen[0]).any():
            raise LPError(
                f"rank mismatch: ranks were given different prompts or settings (fingerprints {seen[:, :2].tolist()})"
            )

    def generate(
        self,
        prompt_ids: list[int],
        cfg: DecodeConfig,
        stream: int = 0,
        *,
        verifier: Verifier | None = None,
        observer: StepObserver | None = None,
        on_tokens: OnTokens | None = None,
        stop: Stop | None = None,
        cancelled: Cancelled | None = None,
    ) -> Generation:
        """Decode one prompt. With `cfg.temperature > 0`, `stream` selects the random stream
        (with `cfg.seed`), so several prompts of one run draw independent samples. `verifier`:
        the acceptance rule (default: greedy, or sampling with cfg's settings); `observer`:
        watches each step (lp.bench times forwards with it). `on_tokens`, `stop`, `cancelled`:
        each step's committed tokens, and what ends a decode early (lp/decode/hooks.py).

        Python's cyclic garbage collector is paused while it decodes (and resumed after, if it
        was on): a full collection scans every object of the process, about 200 ms with
        SmolLM2 loaded, and would stall a step. A decode makes no reference cycles."""
        cfg.validate()
        if not prompt_ids:
            raise LPError("empty prompt")
        L = len(prompt_ids)
        if L + cfg.max_new_tokens > self.max_context:
            raise LPError(
                f"prompt ({L} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                f"{self.max_context} tokens this model decodes (its context, or max_seq_len)"
            )
        with collector_paused():
            self._handshake(prompt_ids, cfg)
            verify = verifier or verifier_for(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, stream=stream)
            observe = observer or StepObserver()
            W, N, _, _ = cfg.step_shape
            # the smallest: one pending token and every column (one rank), or a rank's 1-token share
            P = self.comm.world_size
            fewest = RankPlan(range(W), range(0)).cost(N, pending=1, candidate_tokens=1) if P == 1 else 1
            # one replica keeps its accepted drafts' KV; over P ranks a draft's KV lies on one of them
            keep = P == 1 and cfg.step_shape[3] > 0
            most = largest_share(cfg, P)
            self.worker.reset(L + cfg.max_new_tokens, most, fewest, kept=cfg.max_commit - 1 if keep else 0)
            t0 = time.perf_counter()
            self.worker.prefill(torch.tensor(prompt_ids[:-1], dtype=torch.long, device=self.worker.device))
            # the prompt's drafting state, while a GPU prefills
            drafter = Drafter(cfg, prompt_ids, self.worker.vocab_size, P=P, rank=self.comm.rank, keep=keep)
            observe.prefill_done()
            if self.worker.device.type == "cuda":
                torch.cuda.synchronize(self.worker.device)
            t1 = time.perf_counter()
            state = DecodeState(prompt_ids)
            self._hooks = StepHooks.of(on_tokens, stop, cancelled, self.comm.rank, self.worker.tp)  # both loops'
            if self.ahead and not cfg.lookahead and cfg.temperature == 0 and verifier is None:
                self._decode_ahead(state, cfg, observe)
            else:
                self._decode(state, drafter, cfg, verify=verify, observe=observe)
            if self.worker.device.type == "cuda":  # the decode's time ends with the device's last op
                torch.cuda.synchronize(self.worker.device)
            return Generation(
                output_ids=state.output,
                steps=len(state.accepted),
                prefill_seconds=t1 - t0,
                seconds=time.perf_counter() - t1,
                accepted_per_step=state.accepted,
                fed_per_step=state.fed_per_step,
            )

    def _decode(
        self, state: DecodeState, drafter: Drafter, cfg: DecodeConfig, *, verify: Verifier, observe: StepObserver
    ) -> None:
        """Lookahead decoding (and plain decoding, its W = G = 0 case) until `max_new_tokens`, an EOS or a hook."""
        W, _, _, budget = cfg.step_shape
        k, rows, keep = cfg.successors_sent, successor_rows(W, budget), drafter.shape.keep
        step: StepPlan | None = drafter.first_step(state.pending)
        last: tuple[list[int], int] | None = None  # a step's committed tokens and fed count, until the state takes them
        while step is not None:
            x0 = state.length - 1 + (len(last[0]) if last is not None else 0)
            observe.planned(step, x0)
            # a new layout goes to the device once, before the forward is queued (which waits for it)
            on_device = self.worker.on_device(step.layout)
            ids = self.worker.upload(step.ids)

            # forward: one masked pass, no communication
            observe.forward_start()
            logits = self.worker.step(ids, step.layout, x0)
            observe.forward_done()
            if last is not None:  # the last step's outcome, taken while the device computes
                state.advance(*last, keep)

            # accept on this rank (the lookahead branch stays greedy), then pack this rank's message
            decision = decide(
                verify,
                logits,
                ids,
                step,
                on_device=on_device,
                steps_done=len(state.accepted),
                max_commit=cfg.max_commit,
            )
            # every used row's input token and its top-k next tokens, for the successor table (but
            # the rows of nodes fed again: another rank's, which sends them)
            top = (
                torch.cat([ids[on_device.rows[: on_device.n_rows], None], logits.topk(k, dim=-1).indices], dim=1)
                if k
                else None
            )
            if top is not None and step.dups:
                own = 1 + len(step.layout.columns)
                top = torch.cat([top[:own], top[own + step.dups :]])
            mine = self._hooks.stamp(message(state, step, decision, W=W, successors=top, rows=rows))
            # the pending tokens' KV stays whatever the step decides: kept before the read
            self.worker.commit(len(state.pending))
            if keep:  # and the accepted drafts', moved after them on the device
                _, _, acc = decision
                if acc.path is None:
                    raise LPError("the verifier's Acceptance has no path: one replica keeps its accepted drafts' KV")
                self.worker.keep(acc.path, step.layout, acc.accepted)

            # all-gather: the step's one device sync; what the outcome does not decide, meanwhile
            drafter.before_read(self.rehearse)
            fed, remaining = step.layout.size, cfg.max_new_tokens - len(state.output)
            gathered = self.comm.all_gather(mine).cpu().numpy()
            observe.message_read()

            # merge, feed the sources and plan the next step (unless the decode ends): one call
            tokens, state.stopped, step = drafter.after_read(gathered, step, remaining, self._eos)
            last = tokens, fed
            if self._hooks.ended(tokens, gathered):
                state.stopped, step = True, None
            if keep and step is not None:  # the device kept the drafts: the host follows
                self.worker.commit(len(tokens) - 1, on_device=False)
        if last is not None:
            state.advance(*last, keep)

    def _decode_ahead(self, state: DecodeState, cfg: DecodeConfig, observe: StepObserver) -> None:
        """Greedy `mode=ar` with the device one step ahead of the host: a step's input is the
        last step's argmax where it lies, on the device, so step i+1 is queued before step i's
        message is read, and the device never waits for the host's read, merge and checks (as in
        gpt-fast, whose decode loop reads no token per step). A step is one worker call (on a GPU
        one graph replay: forward, argmax, message, its length and checksum kept on the device),
        then one all-gather, and its message read one step late. The messages come to pinned host
        memory by a copy queued right after their all-gather, so reading step i's waits for step
        i, not for step i+1 behind it. The price: a sequence that stops at an EOS computes one
        step past it, whose KV the next sequence overwrites. Every step is planned alike
        (`observe.planned` gets the first step's plan, its ids the prompt's last token)."""
        L, hooks = len(state.prompt), self._hooks
        step = plan_step(state.pending, None, TreeBuilder(0).tree(), Split(0, 2, self.comm.world_size, self.comm.rank))
        ids = self.worker.upload(step.ids)

        # two host buffers and their copies' events, alternating: step i's is read before step i+2's lands
        pinned: list[tuple[torch.Tensor, torch.cuda.Event]] = []

        def fetch(gathered: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
            """Queue step i's messages' copy to the host; the event marks its end (None: already there)."""
            if not gathered.is_cuda:
                return gathered, None
            if not pinned:
                pinned.extend(
                    (torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True), torch.cuda.Event())
                    for _ in range(2)
                )
            host, done = pinned[i % 2]
            host.copy_(gathered, non_blocking=True)
            done.record()
            return host, done

        def read(fetched: tuple[torch.Tensor, torch.cuda.Event | None]) -> None:
            """Take a step's token from its gathered messages into `state`."""
            host, done = fetched
            if done is not None:
                done.synchronize()
            messages = host.numpy()
            observe.message_read()
            # each rank fed its own y1 to its next step: all must agree (every rank raises alike)
            if (messages[:, 0] != messages[0, 0]).any():
                raise LPError(f"ranks diverged: their next tokens were {messages[:, 0].tolist()}")
            tokens = state.clip(merge(messages, step.plans, 1).tokens, cfg.max_new_tokens, self.eos_ids)
            state.advance(tokens, 1)
            state.stopped = hooks.ended(tokens, messages) or state.stopped

        unread = None  # the last step's gathered messages
        self.worker.greedy_start(ids, L - 1, state.length, state.checksum)
        for i in range(cfg.max_new_tokens):
            observe.planned(step, L - 1 + i)
            observe.forward_start()
            message = hooks.stamp(self.worker.greedy_step())  # forward to message, its token committed: one replay
            observe.forward_done()
            gathered = fetch(self.comm.all_gather(message), i)
            if unread is not None:
                read(unread)
                if state.stopped:
                    return
            unread = gathered
        if unread is not None:
            read(unread)


__all__ = ["Decoder", "StepObserver", "StepPlan", "compile_kernels"]

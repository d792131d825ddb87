"""The decode loop: exact greedy lookahead decoding (or plain autoregressive decoding) under
Lookahead Parallelism. World size 1 and P run this same code; per step each rank runs one
forward over its share, then one all-gather merges the results, so window, pool and output
stay identical on all ranks."""

from __future__ import annotations

import gc
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode import throughput
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool, step_layout
from lp.lookahead.drafts import TextIndex
from lp.lookahead.mask import StepLayout
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import DraftTree, TreeBuilder
from lp.message import CHECK_MOD as _CHECK_MOD
from lp.message import merge, pack, successor_rows
from lp.partition import RankPlan, partition
from lp.verify.verifier import StepRows, Verifier, verifier_for
from lp.worker import Worker


@dataclass(frozen=True)
class Generation:
    """One sequence's result: the record every decoder returns (lp.frontend.runtime.Result and the
    benchmark's rows extend it), its figures computed here once. `prefill_seconds` is the
    prompt's prefill, with the host's indexing of the prompt for drafts (which a GPU's prefill
    hides); `seconds` the decode time after it; `accepted_per_step` the tokens committed by each step, `step_tokens`
    the tokens of this rank's forward in each step (empty where a decoder cannot tell)."""

    output_ids: list[int]
    steps: int
    prefill_seconds: float
    seconds: float
    accepted_per_step: list[int]
    step_tokens: list[int]

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def compression(self) -> float:
        """S: generated tokens per decoding step."""
        return throughput.compression(self.new_tokens, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return throughput.tokens_per_s(self.new_tokens, self.seconds)


def _fingerprint(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[tuple[int, ...]]:
    """The step's candidates, best first: the text's longest-suffix continuations (with
    `drafts="pool+text"`), then the pool's n-grams under x0, newest (or most frequent) first
    (duplicates dropped). With `rank="context"` (the default), the pool's n-grams that start
    with the last two tokens come first (what follows them, N-2 tokens): two matched tokens
    predict better than one. The successor table's paths fill what the budget has left
    (`_tree`)."""
    out = text.tokens
    x0 = out[-1]
    ranked = text.drafts(cfg.draft_len, cfg.text_drafts) if cfg.drafts == "pool+text" else []
    if cfg.rank == "context" and len(out) > 1 and pool.n > 2:
        ranked += [t[1:] for t in pool.best(out[-2]) if t[0] == x0]
    ranked += pool.best(x0, cfg.rank == "frequent")
    return list(dict.fromkeys(ranked))


def _tree(
    cfg: DecodeConfig, budget: int, pool: NGramPool, text: TextIndex, successors: SuccessorTable | None
) -> DraftTree:
    """The step's verification tree: `_drafts`, then the likeliest paths through the
    successor table, within `budget` nodes (without sharing: the paths to its leaves)."""
    builder = TreeBuilder(budget, cfg.tree)
    for draft in _drafts(cfg, pool, text) if budget else ():
        builder.add(draft)
        if builder.full:
            break
    if successors is not None and not builder.full:
        x0 = text.tokens[-1]
        if cfg.tree:
            successors.grow(builder, x0, cfg.max_draft)
        else:  # each path to a leaf of the budget's likeliest recycled nodes is a chain of its own
            recycled = TreeBuilder(budget)
            successors.grow(recycled, x0, cfg.max_draft)
            for path in recycled.leaf_paths():
                builder.add(path)
    return builder.tree()


@dataclass(frozen=True)
class StepPlan:
    """One rank's share of a step, all host-side: its input ids (in `layout`'s order) and layout,
    every rank's plan, and this rank's window columns and tree nodes."""

    ids: np.ndarray
    layout: StepLayout
    plans: tuple[RankPlan, ...]
    rank: int
    tree: DraftTree
    mine: DraftTree  # this rank's subtrees of `tree`: nodes `plan.candidates`

    @property
    def plan(self) -> RankPlan:
        return self.plans[self.rank]


def rank_share(
    m: int, tree: DraftTree, W: int, N: int, P: int, rank: int
) -> tuple[tuple[RankPlan, ...], DraftTree, StepLayout]:
    """A step with `m` pending tokens split over P ranks: every rank's plan, then rank `rank`'s
    subtrees and layout (what tools.project replays for each rank)."""
    plans = partition(W, N, tree.size, P, tree.groups(), width=1)
    plan = plans[rank]
    mine = tree.slice(plan.candidates.start, plan.candidates.stop)
    return plans, mine, step_layout(m, W, N, plan.columns, mine.parents)


def plan_step(
    pending: list[int], window: JacobiWindow | None, tree: DraftTree, W: int, N: int, P: int, rank: int
) -> StepPlan:
    """Split the step over P ranks and lay out rank `rank`'s forward: the pending tokens (x0
    last), its window columns with their row-0 prefix, then its verification subtrees."""
    plans, mine, layout = rank_share(len(pending), tree, W, N, P, rank)
    rows = window.rows.ravel() if window is not None else mine.tokens[:0]
    source = np.concatenate([np.asarray(pending, dtype=np.int64), rows, mine.tokens])
    return StepPlan(source[layout.gather], layout, plans, rank, tree, mine)


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


class Decoder:
    """Decodes with one Worker per rank; all ranks call `generate` with the same arguments."""

    def __init__(
        self, worker: Worker, collective: Collective, eos_ids: set[int], max_context: int, ahead: bool | None = None
    ) -> None:
        """`ahead`: run greedy `mode=ar` one step ahead of the host (`_decode_ahead`); None: where
        the device runs asynchronously to the host (CUDA) and the all-gather does not wait for
        it (not over gloo through host memory). Elsewhere it would only add a step."""
        self.worker = worker
        self.comm = collective
        self.eos_ids = frozenset(eos_ids)
        self.max_context = max_context
        self.ahead = worker.device.type == "cuda" and not collective.staged if ahead is None else ahead

    def _handshake(self, prompt: list[int], cfg: DecodeConfig) -> None:
        """Refuse to decode unless every rank got the same prompt and settings (one all-gather
        per sequence, so a mismatch is an error rather than a garbled or hung step)."""
        mine = torch.tensor(
            [_fingerprint(cfg), _fingerprint(prompt), self.comm.world_size], dtype=torch.long, device=self.worker.device
        )
        seen = self.comm.all_gather(mine).cpu()
        if (seen != seen[0]).any():
            raise LPError(
                f"rank mismatch: ranks were given different prompts or settings (fingerprints {seen[:, :2].tolist()})"
            )

    def _successor_table(self, k: int) -> SuccessorTable | None:
        """An empty successor table of k tokens per row (None for k = 0)."""
        if k > self.worker.vocab_size:
            raise LPError(f"recycle={k} is more than the model's {self.worker.vocab_size} tokens")
        return SuccessorTable(k) if k else None

    def generate(
        self,
        prompt_ids: list[int],
        cfg: DecodeConfig,
        stream: int = 0,
        *,
        verifier: Verifier | None = None,
        observer: StepObserver | None = None,
    ) -> Generation:
        """Decode one prompt. With `cfg.temperature > 0`, `stream` selects the random stream
        (with `cfg.seed`), so several prompts of one run draw independent samples. `verifier`:
        the acceptance rule (default: greedy, or sampling with cfg's settings); `observer`:
        watches each step (lp.bench times forwards with it).

        Python's cyclic garbage collector is paused while it decodes (and resumed after, if it
        was on): a full collection scans every object of the process, about 200 ms with
        SmolLM2 loaded, and would stall a step. A decode makes no reference cycles."""
        with collector_paused():
            return self._generate(prompt_ids, cfg, stream, verifier, observer)

    def _generate(
        self,
        prompt_ids: list[int],
        cfg: DecodeConfig,
        stream: int,
        verifier: Verifier | None,
        observer: StepObserver | None,
    ) -> Generation:
        cfg.validate()
        if not prompt_ids:
            raise LPError("empty prompt")
        L = len(prompt_ids)
        if L + cfg.max_new_tokens > self.max_context:
            raise LPError(
                f"prompt ({L} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                f"{self.max_context} tokens this model decodes (its context, or max_seq_len)"
            )
        self._handshake(prompt_ids, cfg)
        verify = verifier or verifier_for(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, stream)
        observe = observer or StepObserver()
        W, N, G, budget = cfg.step_shape
        width, k, rows = cfg.step_width, cfg.successors_sent, successor_rows(W, budget)
        successors = self._successor_table(k)
        P, rank, dev = self.comm.world_size, self.comm.rank, self.worker.device
        # the largest step: `width` pending tokens, every column and the whole tree on one rank; the
        # smallest: one pending token and every column (one rank), or a rank's 1-token share
        fewest = RankPlan(range(W), range(0)).cost(N, 1, 1) if P == 1 else 1
        self.worker.reset(L + cfg.max_new_tokens, RankPlan(range(W), range(budget)).cost(N, width, 1), fewest)

        t0 = time.perf_counter()
        self.worker.prefill(torch.tensor(prompt_ids[:-1], dtype=torch.long, device=dev))
        # the prompt's n-grams are host work on the prompt's length: done while a GPU prefills,
        # and counted in the prefill's time
        pool = NGramPool(N, cfg.pool_capacity)
        text = TextIndex(prompt_ids, indexed=cfg.drafts == "pool+text" and budget > 0)
        if G and cfg.pool_from_prompt:
            pool.add_sequence(prompt_ids)
            pool.flush()
        observe.prefill_done()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()

        if self.ahead and not cfg.lookahead and cfg.temperature == 0 and verifier is None:
            output = self._decode_ahead(prompt_ids, cfg, observe)
            return self._finish(output, [1] * len(output), [1] * len(output), t0, t1)

        out = text.tokens  # the sequence so far (prompt and output), extended as tokens commit
        length = L
        pending = [prompt_ids[-1]]  # committed tokens whose KV the next step writes (x0 last)
        checksum = _fingerprint(prompt_ids)
        window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        accepted: list[int] = []
        step_tokens: list[int] = []
        while length - L < cfg.max_new_tokens:
            # plan: drafts -> tree -> this rank's ids and layout
            tree = _tree(cfg, budget, pool, text, successors)
            step = plan_step(pending, window, tree, W, N, P, rank)
            observe.planned(step, length - 1)
            layout = step.layout
            # a new layout goes to the device once, before the forward is queued (which waits for it)
            on_device = self.worker.on_device(layout)
            ids = self.worker.upload(step.ids)

            # forward: one masked pass, no communication
            observe.forward_start()
            logits = self.worker.step(ids, layout, length - 1)
            observe.forward_done()

            # accept on this rank; the lookahead branch stays greedy
            argmax = logits.argmax(dim=-1)  # one pass over every used row
            y1, acc = verify(
                StepRows(
                    logits,
                    argmax,
                    layout,
                    tree,
                    step.plan.candidates,
                    ids[layout.node_tokens],
                    on_device.parents,
                    on_device.tree_depth,
                    on_device.tree_ancestors,
                    len(accepted),
                    width,
                )
            )
            new = argmax[layout.column_rows]
            # every used row's input token and its top-k next tokens, for the successor table
            top = (
                torch.cat([ids[on_device.rows[: on_device.n_rows], None], logits.topk(k, dim=-1).indices], dim=1)
                if k
                else None
            )

            # all-gather and merge: the step's one device sync
            message = pack(y1, acc, step.plan.candidates.start, new, length, checksum, W, top, rows)
            pool.flush()  # the last step's n-grams that this step's drafts did not read, while the device computes
            gathered = self.comm.all_gather(message).cpu().numpy()
            observe.message_read()
            outcome = merge(gathered, step.plans, width, k)

            # advance: cache, window, pool, output
            self.worker.commit(len(pending))
            tokens = outcome.tokens[: cfg.max_new_tokens - (length - L)]
            stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            if stop is not None:
                tokens = tokens[: stop + 1]
            if window is not None:
                if G and window.ready:
                    pool.add_rows(window.ngrams(out[-1], outcome.new))
                window.update(outcome.new)
            if successors is not None:
                successors.observe([out[-1], *tokens])  # the table the drafts used
                successors.update(outcome.successors)
            for t in tokens:
                checksum = (checksum * 31 + t) % _CHECK_MOD
            text.extend(tokens)
            length += len(tokens)
            if G and cfg.pool_from_output:
                # the n-grams that end in the new tokens: free candidates, as in prompt lookup
                pool.add_sequence(out[max(length - len(tokens) - N + 1, 0) : length])
            pending = tokens
            accepted.append(len(tokens))
            step_tokens.append(layout.size)
            if stop is not None:
                break
        return self._finish(out[L:], accepted, step_tokens, t0, t1)

    def _finish(
        self, output: list[int], accepted: list[int], step_tokens: list[int], t0: float, t1: float
    ) -> Generation:
        """The sequence's record, its decode timed from `t1` (the prefill's end) to the device's
        last op."""
        if self.worker.device.type == "cuda":
            torch.cuda.synchronize(self.worker.device)
        return Generation(output, len(accepted), t1 - t0, time.perf_counter() - t1, accepted, step_tokens)

    def _decode_ahead(self, prompt_ids: list[int], cfg: DecodeConfig, observe: StepObserver) -> list[int]:
        """Greedy `mode=ar` with the device one step ahead of the host: a step's input is the
        last step's argmax where it lies, on the device, so step i+1 is queued before step i's
        message is read, and the device never waits for the host's read, merge and checks (as in
        gpt-fast, whose decode loop reads no token per step). A step is one worker call (on a GPU
        one graph replay: forward, argmax, message, its length and checksum kept on the device),
        then one all-gather, and its message read one step late. The messages come to pinned host
        memory by a copy queued right after their all-gather, so reading step i's waits for step
        i, not for step i+1 behind it. The price: a sequence that stops at an EOS computes one step
        past it, whose KV the next sequence overwrites. Every step is planned alike (`observe.planned` gets the first
        step's plan, its ids the prompt's last token). Returns the output tokens."""
        L = len(prompt_ids)
        step = plan_step(prompt_ids[-1:], None, TreeBuilder(0).tree(), 0, 2, self.comm.world_size, self.comm.rank)
        ids = self.worker.upload(step.ids)
        output: list[int] = []

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

        def read(fetched: tuple[torch.Tensor, torch.cuda.Event | None]) -> bool:
            """Take a step's token from its gathered messages; True at an EOS."""
            host, done = fetched
            if done is not None:
                done.synchronize()
            messages = host.numpy()
            observe.message_read()
            # each rank fed its own y1 to its next step: all must agree (every rank raises alike)
            if (messages[:, 0] != messages[0, 0]).any():
                raise LPError(f"ranks diverged: their next tokens were {messages[:, 0].tolist()}")
            token = merge(messages, step.plans, 1).tokens[0]
            output.append(token)
            return token in self.eos_ids

        unread = None  # the last step's gathered messages
        self.worker.greedy_start(ids, L - 1, L, _fingerprint(prompt_ids))
        for i in range(cfg.max_new_tokens):
            observe.planned(step, L - 1 + i)
            observe.forward_start()
            message = self.worker.greedy_step()  # forward to message, its token committed: one replay on a GPU
            observe.forward_done()
            gathered = fetch(self.comm.all_gather(message), i)
            if unread is not None and read(unread):
                return output
            unread = gathered
        if unread is not None:
            read(unread)
        return output


__all__ = ["Decoder", "Generation", "StepObserver", "StepPlan", "collector_paused", "plan_step", "rank_share"]

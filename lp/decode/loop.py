"""The decoder: exact greedy lookahead decoding (or plain autoregressive decoding, or exact
sampling) of one prompt or many, under Lookahead Parallelism. Every call runs a batch
(lp/decode/batch.py): one prompt is a batch of one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.batch import PREFILL_CHUNK, Batch, StepObserver
from lp.decode.budget import Budget
from lp.decode.drafter import warm_up
from lp.decode.hooks import Cancelled, OnTokens, Stop
from lp.decode.plan import StepPlan
from lp.decode.record import Generation, collector_paused
from lp.decode.sequence import Request, Sequence
from lp.lookahead.memory import DraftMemory
from lp.verify.verifier import Verifier
from lp.worker import Worker


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the host's compiled code of a decode, before any
    decode's clock starts."""
    warm_up()


class Decoder:
    """Decodes with one Worker per rank; all ranks call it with the same arguments."""

    def __init__(
        self,
        worker: Worker,
        collective: Collective,
        eos_ids: set[int],
        max_context: int,
        rehearse: bool | None = None,
        memory: DraftMemory | None = None,
    ) -> None:
        """`rehearse`: rehearse a lone sequence's plan while the device computes
        (lp/decode/phases.py `before_read`); None: where the device runs asynchronously to the
        host (CUDA). A CPU's forward would wait for it. `memory`: the draft memory every batch's
        sequences draw on and teach (lp/lookahead/memory.py; None: none)."""
        self.worker, self.memory = worker, memory
        self.comm = collective
        self.eos_ids = frozenset(eos_ids)
        self.max_context = max_context
        self.rehearse = worker.device.type == "cuda" if rehearse is None else rehearse
        compile_kernels()

    def batch(
        self,
        max_batch: int = 1,
        budget: Budget | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        observer: StepObserver | None = None,
        first_step_with_prompt: bool = False,
    ) -> Batch:
        """A batch of at most `max_batch` sequences at once (lp/decode/batch.py)."""
        return Batch(
            self.worker,
            self.comm,
            self.eos_ids,
            self.max_context,
            max_batch=max_batch,
            prefill_chunk=prefill_chunk,
            budget=budget,
            observer=observer,
            memory=self.memory,
            rehearse=self.rehearse,
            first_step_with_prompt=first_step_with_prompt,
        )

    def run(self, requests: Iterable[Request], batch: Batch) -> Iterator[Sequence]:
        """Decode `requests` in `batch`, each joining as soon as there is room: every sequence as
        it ends (not in order). Python's cyclic garbage collector is paused meanwhile (a full
        collection with a model loaded takes about 200 ms, and would stall a step; a decode makes
        no reference cycles)."""
        pending = iter(requests)
        with collector_paused():
            for request in pending:
                batch.submit(request)
                while len(batch.waiting) >= batch.max_batch:  # keep the queue short: stream the rest
                    yield from batch.step()
            yield from batch.drain()

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
        budget: Budget | None = None,
        shared: bool = False,
    ) -> Generation:
        """Decode one prompt. With `cfg.temperature > 0`, `stream` selects the random stream
        (with `cfg.seed`), so several prompts of one run draw independent samples. `verifier`:
        the acceptance rule (default: greedy, or sampling with cfg's settings); `observer`:
        watches each step (lp.bench times forwards with it). `on_tokens`, `stop`, `cancelled`:
        each step's committed tokens, and what ends a decode early (lp/decode/hooks.py).
        `budget`, `shared`: the step's budget, and whether it may cut this tree
        (lp/decode/budget.py)."""
        request = Request(list(prompt_ids), cfg, stream, verifier, on_tokens, stop, cancelled, shared)
        (seq,) = self.run([request], self.batch(budget=budget, observer=observer))
        return seq.result


__all__ = ["Decoder", "Request", "StepObserver", "StepPlan", "compile_kernels"]

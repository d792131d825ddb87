"""The decoder side of the server: continuous batching. Rank 0's main thread (`Engine.run`) runs a batch
(lp/decode/batch.py): before each step it takes queued requests while the batch has room
(`max_batch` sequences), hands them to every rank (lp/serve/channel.py), and they join the running
sequences at that step; their prompts are prefilled in chunks that share steps with the others'
decoding; each step's text goes to the waiting handlers; a request that ends (an EOS, max_tokens,
a stop string, its client gone) leaves at once and frees its KV pages. Requests beyond the batch
wait in a bounded FIFO queue (`max_queue`; past it, 429). The other ranks run `follow`: the same
requests, submitted at the same steps, the same batch.

A step that fails (a rank died or hung: a collective timed out) fails every request in the batch
and in the queue with 503, and stops the server: the ranks can no longer agree on a step."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lp.errors import LPError
from lp.serve.channel import TICK_S, Channel
from lp.serve.prepare import DecodeRequest
from lp.serve.protocol import ApiError


@dataclass
class Job:
    """A queued request and the way back to its handler, which awaits `events` on the server's
    event loop: ("text", str) per step that adds text (streamed requests only), then
    ("done", Result) or ("error", ApiError)."""

    request: DecodeRequest
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left

    def emit(self, *event: Any) -> None:
        """From the decode thread: put an event on the handler's queue (none once the server's
        event loop has closed: no handler waits any more)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            self.cancelled.set()


def _batch(lm: Any, max_batch: int, prefill_chunk: int) -> Any:
    """The server's batch, alike on every rank (their steps must pack alike): a request's first
    step shares its prompt's last forward (lp/decode/batch.py)."""
    return lm.decoder.batch(
        max_batch=max_batch, budget=lm.budget(), prefill_chunk=prefill_chunk, first_step_with_prompt=True
    )


def _ask(lm: Any, request: DecodeRequest, batch: Any, tag: Any = None, **hooks: Any) -> Any:
    """`request` made ready to join `batch` (W=auto priced beside the sequences already in it)."""
    others = len(batch.running) + len(batch.waiting)
    return lm.ask(request.ids, stop=request.stop or None, others=others, tag=tag, **hooks, **request.settings)


class Engine:
    """Rank 0's decode thread, its batch and its queue."""

    def __init__(
        self,
        lm: Any,
        channel: Channel,
        max_batch: int,
        max_queue: int,
        prefill_chunk: int,
        on_failure: Callable[[], None],
    ) -> None:
        """`on_failure`: called once from the decode thread when a step failed (stops the server)."""
        self.lm, self.channel, self.on_failure = lm, channel, on_failure
        self.batch = _batch(lm, max_batch, prefill_chunk)
        self.jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.failure: str | None = None  # why the ranks can no longer decode
        self.served = 0  # requests answered whole
        self.last: dict[str, Any] = {}  # the last request that ended: its tokens, steps, end (/health shows it)
        self.most_queued = 0  # the most requests that waited at once
        self._asks: dict[int, tuple[Job, Any]] = {}  # the batch's requests: their jobs and asks
        self._stopping = threading.Event()
        self._ended = threading.Event()  # `run` has ended: it answered every job it took or found queued

    @property
    def decoding(self) -> int:
        """Sequences in the batch (decoding, prefilling or waiting for pages)."""
        return len(self.batch.running) + len(self.batch.waiting)

    def submit(self, job: Job) -> None:
        """Queue a job (from the HTTP thread); ApiError 429 when the queue is full, 503 when the
        server cannot decode."""
        if self.failure is not None or self._stopping.is_set():
            raise ApiError(503, self.failure or "the server is shutting down")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise ApiError(429, f"{self.jobs.maxsize} requests are waiting: try again later") from None
        self.most_queued = max(self.most_queued, self.jobs.qsize())

    def alive(self) -> bool:
        """Whether the engine runs, or is about to (it answers every job it takes or finds queued)."""
        return not self._ended.is_set()

    def stop(self) -> None:
        """Stop `run` after its next step (the batch's decoding sequences halt in it); the queued
        jobs are answered 503 and the other ranks told."""
        self._stopping.set()

    def run(self, stop_when: Callable[[], bool] = lambda: False) -> None:
        """Decode until `stop`, or `stop_when()` (the HTTP side has ended), or a failed step."""
        try:
            while True:
                if stop_when():
                    self._stopping.set()
                stopping = self._stopping.is_set()  # then one last step: the decoding sequences halt in it
                joins = [] if stopping else self._take()
                self.channel.send([job.request for job, _ in joins])
                for job, ask in joins:
                    self.batch.submit(ask.request)
                    self._asks[id(job)] = (job, ask)
                if not self.batch.idle:
                    for seq in self.batch.step():
                        self._answer(seq)
                if stopping:
                    break
            self.channel.stop()
        except Exception as e:  # a rank died or hung: no further step can agree
            self.failure = f"a rank failed, the server stops: {' '.join(str(e).split())}"
            self.on_failure()
        finally:
            self._stopping.set()
            self._ended.set()
            error = ApiError(503, self.failure or "the server is shutting down")
            for job, _ in self._asks.values():
                job.emit("error", error)
            while not self.jobs.empty():
                self.jobs.get_nowait().emit("error", error)

    def _take(self) -> list[tuple[Job, Any]]:
        """The queued jobs that join before the next step, while the batch has room (waiting up to
        TICK_S for one while nothing decodes); a job whose client left costs nothing."""
        joins = []
        while self.decoding + len(joins) < self.batch.max_batch:
            try:
                job = self.jobs.get(timeout=TICK_S) if self.batch.idle and not joins else self.jobs.get_nowait()
            except queue.Empty:
                break
            if job.cancelled.is_set():
                continue
            try:
                ask = _ask(
                    self.lm,
                    job.request,
                    self.batch,
                    tag=id(job),
                    on_text=(lambda text, job=job: job.emit("text", text)) if job.stream else None,
                    cancelled=lambda job=job: job.cancelled.is_set() or self._stopping.is_set(),
                )
            except LPError as e:  # checked before it was queued: only what the model may still refuse
                job.emit("error", ApiError(400, str(e)))
                continue
            joins.append((job, ask))
        return joins

    def _answer(self, seq: Any) -> None:
        """A sequence ended: its job answered."""
        job, ask = self._asks.pop(seq.request.tag)
        result = self.lm.result(ask, seq.result)
        self.served += 1
        self.last = {
            "new_tokens": result.new_tokens,
            "steps": result.steps,
            "finish_reason": "cancelled" if job.cancelled.is_set() else result.finish_reason,
        }
        job.emit("done", result)


def follow(lm: Any, channel: Channel, max_batch: int, prefill_chunk: int) -> None:
    """A rank other than 0: the same requests joining the same batch at the same steps, until rank
    0 stops the server."""
    batch = _batch(lm, max_batch, prefill_chunk)
    asks: dict[int, Any] = {}
    tags = itertools.count()
    while (joins := channel.receive()) is not None:
        made = [_ask(lm, request, batch, tag=next(tags), cancelled=lambda: False) for request in joins]
        for ask in made:
            batch.submit(ask.request)
            asks[ask.request.tag] = ask
        if not batch.idle:
            for seq in batch.step():
                lm.result(asks.pop(seq.request.tag), seq.result)  # as rank 0 does: W=auto learns alike


__all__ = ["Engine", "Job", "follow"]

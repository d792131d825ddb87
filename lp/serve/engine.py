"""The decoder side of the server. lp decodes at batch size 1, so requests wait in a bounded
FIFO queue and one thread of rank 0 (`Engine`) decodes them one at a time: it hands each request
to every rank (lp/serve/channel.py), decodes it with them, and sends its text to the waiting
handler step by step. The other ranks run `follow`: receive a request, decode it, again.

A decode that fails (a rank died or hung: its collective timed out) fails its request with 503
and the queued ones too, and stops the server: the ranks can no longer agree on a step."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


class Engine:
    """Rank 0's decode thread and its queue."""

    def __init__(self, lm: Any, channel: Channel, max_queue: int, on_failure: Callable[[], None]) -> None:
        """`on_failure`: called once from the decode thread when a decode failed (stops the server)."""
        self.lm, self.channel, self.on_failure = lm, channel, on_failure
        self.jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.failure: str | None = None  # why the ranks can no longer decode
        self.decoding = False
        self.served = 0  # requests decoded
        self.last: dict[str, Any] = {}  # the last decode: its tokens, steps, end (/health shows it)
        self.most_queued = 0  # the most requests that waited at once
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lp-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; ApiError 429 when the queue is full, 503 when the server cannot decode."""
        if self.failure is not None or self._stopping.is_set():
            raise ApiError(503, self.failure or "the server is shutting down")
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise ApiError(429, f"{self.jobs.maxsize} requests are waiting: try again later") from None
        self.most_queued = max(self.most_queued, self.jobs.qsize())

    def alive(self) -> bool:
        """Whether the decode thread runs (it answers every job it takes or finds queued when it ends)."""
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        """Stop after the decode in progress (ended at its next step), answer the queued jobs 503,
        tell the other ranks; wait at most `timeout` seconds for the thread."""
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        current: Job | None = None
        try:
            while not self._stopping.is_set():
                try:
                    current = self.jobs.get(timeout=TICK_S)
                except queue.Empty:
                    self.channel.tick()
                    continue
                if not current.cancelled.is_set():  # a client that left while queued costs nothing
                    self._decode(current)
                current = None
            self.channel.send(None)
        except Exception as e:  # a rank died or hung: no further decode can agree
            self.failure = f"a rank failed, the server stops: {' '.join(str(e).split())}"
            if current is not None:
                current.emit("error", ApiError(503, self.failure))
            self.on_failure()
        finally:
            self._stopping.set()
            while not self.jobs.empty():
                self.jobs.get_nowait().emit("error", ApiError(503, self.failure or "the server is shutting down"))

    def _decode(self, job: Job) -> None:
        self.channel.send(job.request)
        self.decoding = True
        stopping = self._stopping.is_set
        try:
            result = self.lm.generate(
                job.request.ids,
                **job.request.settings,
                stop=job.request.stop,
                on_text=(lambda text: job.emit("text", text)) if job.stream else None,
                cancelled=lambda: job.cancelled.is_set() or stopping(),
            )
        finally:
            self.decoding = False
        self.served += 1
        self.last = {
            "new_tokens": result.new_tokens,
            "steps": result.steps,
            "finish_reason": "cancelled" if job.cancelled.is_set() else result.finish_reason,
        }
        job.emit("done", result)


def follow(lm: Any, channel: Channel) -> None:
    """A rank other than 0: decode every request rank 0 hands on, until it stops the server."""
    while (request := channel.receive()) is not None:
        lm.generate(request.ids, **request.settings, stop=request.stop, cancelled=lambda: False)


__all__ = ["Engine", "Job", "follow"]

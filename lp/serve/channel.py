"""How requests reach every rank: before each step of the batch (and every `TICK_S` while it is
idle), rank 0 broadcasts a fixed-size header (what comes: the requests joining the batch now, or
none, or the server's stop; and the payload's size), then the joining requests as JSON bytes, over
the world's process group (every rank of every replica). Every rank then submits the same requests
at the same step and steps the same batch, so their plans stay in step. While nothing is decoding,
the idle headers keep the other ranks' waits well within the collectives' timeout, and a rank 0
that died fails them after `timeout_s` instead of never."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from lp.collective import Collective
from lp.errors import LPError
from lp.serve.prepare import DecodeRequest

NONE, JOIN, STOP = 0, 1, 2  # the header's first slot; the second: the payload's bytes
TICK_S = 1.0  # rank 0's headers while nothing decodes: at most this far apart


class Channel:
    """Rank 0's side sends (`send`, `stop`); the other ranks' side receives (`receive`)."""

    def __init__(self, comm: Collective) -> None:
        self.rank, self.world_size = comm.rank, comm.world_size
        # NCCL broadcasts device tensors; gloo host ones (also where ranks share a GPU)
        nccl = self.world_size > 1 and dist.get_backend() == "nccl"
        self.device = comm.device if nccl else torch.device("cpu")

    def send(self, requests: list[DecodeRequest]) -> None:
        """Rank 0: the requests that join before the next step (none: a tick)."""
        if not requests:
            self._broadcast(self._header(NONE, 0))
            return
        payload = json.dumps([r.to_json() for r in requests]).encode()
        self._broadcast(self._header(JOIN, len(payload)))
        self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device))

    def stop(self) -> None:
        """Rank 0: the server stops."""
        self._broadcast(self._header(STOP, 0))

    def receive(self) -> list[DecodeRequest] | None:
        """Any other rank: the requests joining before the next step (maybe none); None when the
        server stops."""
        header = self._header(NONE, 0)
        self._broadcast(header)
        kind, size = header.cpu().tolist()
        if kind == STOP:
            return None
        if kind == NONE:
            return []
        payload = torch.empty(size, dtype=torch.uint8, device=self.device)
        self._broadcast(payload)
        return [DecodeRequest(**r) for r in json.loads(payload.cpu().numpy().tobytes())]

    def _header(self, kind: int, size: int) -> torch.Tensor:
        return torch.tensor([kind, size], dtype=torch.long, device=self.device)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        if self.world_size == 1:
            return
        try:
            dist.broadcast(tensor, src=0)
        except RuntimeError as e:  # gloo/NCCL: a peer died, hung past the timeout, or left
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LPError(f"rank {self.rank}: the request broadcast failed, another rank died or hung ({first})") from e


__all__ = ["JOIN", "NONE", "STOP", "TICK_S", "Channel"]

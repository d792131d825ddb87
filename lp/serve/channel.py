"""How a request reaches every rank: rank 0 broadcasts a fixed-size header (what comes, and its
size), then the request as JSON bytes, over the world's process group (every rank of every
replica). While no request is queued rank 0 broadcasts an idle header every `TICK_S`, so the
other ranks wait for requests as long as the server runs, each wait a collective well within
the timeout, and a rank 0 that died fails them after `timeout_s` instead of never."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from lp.collective import Collective
from lp.errors import LPError
from lp.serve.prepare import DecodeRequest

IDLE, REQUEST, STOP = 0, 1, 2  # the header's first slot; the second: the payload's bytes
TICK_S = 1.0  # rank 0's idle broadcasts: at most this far apart


class Channel:
    """Rank 0's side sends (`send`, `tick`); the other ranks' side receives (`receive`)."""

    def __init__(self, comm: Collective) -> None:
        self.rank, self.world_size = comm.rank, comm.world_size
        # NCCL broadcasts device tensors; gloo host ones (also where ranks share a GPU)
        nccl = self.world_size > 1 and dist.get_backend() == "nccl"
        self.device = comm.device if nccl else torch.device("cpu")

    def send(self, request: DecodeRequest | None) -> None:
        """Rank 0: hand every rank a request (None: the server stops)."""
        if request is None:
            self._broadcast(self._header(STOP, 0))
            return
        payload = json.dumps(request.to_json()).encode()
        self._broadcast(self._header(REQUEST, len(payload)))
        self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device))

    def tick(self) -> None:
        """Rank 0: no request now; the other ranks wait on."""
        self._broadcast(self._header(IDLE, 0))

    def receive(self) -> DecodeRequest | None:
        """Any other rank: the next request, through any idle ticks; None when the server stops."""
        while True:
            header = self._header(IDLE, 0)
            self._broadcast(header)
            kind, size = header.cpu().tolist()
            if kind == STOP:
                return None
            if kind == REQUEST:
                payload = torch.empty(size, dtype=torch.uint8, device=self.device)
                self._broadcast(payload)
                return DecodeRequest(**json.loads(payload.cpu().numpy().tobytes()))

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


__all__ = ["IDLE", "REQUEST", "STOP", "TICK_S", "Channel"]

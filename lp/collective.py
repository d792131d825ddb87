"""The only communication of Lookahead Parallelism: one all-gather of a fixed-size integer
tensor per step. A no-op for one rank; NCCL on GPUs, gloo on CPU; every collective has a
timeout so a dead or hung rank never hangs the others forever."""
from __future__ import annotations

import os
import re
from datetime import timedelta

import torch
import torch.distributed as dist

from lp.errors import LPError


# torch >= 2.10 renamed all_gather_into_tensor; both gather into one flat buffer.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_device(device: str) -> None:
    """Refuse a device this machine cannot use, before anything is loaded onto it."""
    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", str(device)):
        raise LPError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise LPError(f"device={device} but torch sees no CUDA device on this machine; use device=cpu or device=auto")


class Collective:
    """Rank, world size, device, and the per-step all-gather. `calls` counts all-gathers."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.calls = 0

    @classmethod
    def from_env(cls, device: str = "auto", timeout_s: float = 300.0) -> "Collective":
        """Join the process group that torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK), or
        run alone when it describes none."""
        check_device(device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
        dev = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(dev)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo",
                timeout=timedelta(seconds=timeout_s),
                device_id=dev if use_cuda else None,
            )
        return cls(rank, world, dev)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        """Gather every rank's 1D integer `message` (same size everywhere) into `[P, K]`."""
        self.calls += 1
        if self.world_size == 1:
            return message[None]
        out = torch.empty(self.world_size * message.numel(), dtype=message.dtype, device=message.device)
        try:
            _all_gather(out, message.contiguous())
        except RuntimeError as e:  # gloo/NCCL: a peer died, hung past the timeout, or left
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LPError(f"rank {self.rank}: the step's all-gather failed, another rank died or hung ({first})") from e
        return out.view(self.world_size, -1)

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

"""The only communication of Lookahead Parallelism: one all-gather of a fixed-size integer
tensor per step. A no-op for one rank; NCCL on GPUs, gloo on CPU; every collective has a
timeout so a dead or hung rank never hangs the others forever.

Ranks may outnumber the GPUs (one GPU, or CUDA_VISIBLE_DEVICES limiting them): NCCL refuses two
ranks on one device, so they then share the GPUs round-robin and gather over gloo, the message
(a few hundred bytes) staged through host memory."""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from lp.errors import LPError

# torch >= 2.10 renamed all_gather_into_tensor; both gather into one flat buffer.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

BACKENDS = ("auto", "nccl", "gloo")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise LPError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def plan_backend(backend: str, use_cuda: bool, local_rank: int, local_world: int, gpus: int) -> tuple[str, int | None]:
    """The process-group backend and this rank's GPU index (None on CPU) for `backend`.

    auto: NCCL with one GPU per rank, gloo when ranks share GPUs or run on CPU."""
    check_backend(backend)
    if not use_cuda:
        if backend == "nccl":
            raise LPError("backend=nccl needs CUDA; on CPU use backend=gloo (or auto)")
        return "gloo", None
    shared = local_world > gpus
    if backend == "nccl" and shared:
        raise LPError(
            f"backend=nccl needs one GPU per rank, but {local_world} ranks share {gpus} visible GPU(s): "
            f"use backend=auto or gloo, or fewer ranks"
        )
    return (("gloo" if shared else "nccl") if backend == "auto" else backend), local_rank % gpus


def check_device(device: str) -> None:
    """Refuse a device this machine cannot use, before anything is loaded onto it."""
    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", str(device)):
        raise LPError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise LPError(f"device={device} but torch sees no CUDA device on this machine; use device=cpu or device=auto")


class Collective:
    """Rank, world size, device, and the per-step all-gather, over the whole world or over a
    `group` of it (with tensor parallelism, the ranks of one shard: lp/mesh.py)."""

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
        staged: bool = False,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.staged = staged  # gather on the host: gloo for messages that live on a GPU
        self.group = group  # None: the default (world) group

    @classmethod
    def from_env(cls, device: str = "auto", timeout_s: float = 300.0, backend: str = "auto") -> Collective:
        """Join the process group that torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK,
        LOCAL_WORLD_SIZE), or run alone when it describes none."""
        check_device(device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
        gpus = torch.cuda.device_count() if use_cuda else 0
        kind, gpu = plan_backend(backend, use_cuda, local, local_world if world > 1 else 1, gpus=gpus)
        dev = torch.device(f"cuda:{gpu}") if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(dev)
        staged = use_cuda and kind == "gloo"
        if world > 1 and not dist.is_initialized():
            if staged and rank == 0:
                print(
                    f"lp: {local_world} ranks share {gpus} GPU(s): the step's all-gather goes over gloo, "
                    f"staged through host memory",
                    file=sys.stderr,
                )
            dist.init_process_group(
                backend=kind,
                timeout=timedelta(seconds=timeout_s),
                device_id=dev if kind == "nccl" else None,
            )
        return cls(rank, world, dev, staged and world > 1)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        """Gather every rank's 1D integer `message` (same size everywhere) into `[P, K]`."""
        if self.world_size == 1:
            return message[None]
        if self.staged:  # the result stays on the host, where the caller reads it anyway
            message = message.cpu()
        out = torch.empty(self.world_size * message.numel(), dtype=message.dtype, device=message.device)
        try:
            _all_gather(out, message.contiguous(), group=self.group)
        except RuntimeError as e:  # gloo/NCCL: a peer died, hung past the timeout, or left
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LPError(f"rank {self.rank}: the step's all-gather failed, another rank died or hung ({first})") from e
        return out.view(self.world_size, -1)

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

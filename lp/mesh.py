"""The mesh of the ranks: P LP replicas, each a tensor-parallel group of T consecutive ranks.

World rank r is rank r % T of tensor-parallel group r // T (its replica) and rank r // T of LP
group r % T. The LP groups {t, t+T, t+2T, ...} hold the ranks with the same shard of the
model, one per replica: each step's all-gather runs inside them, so a rank gathers the
messages of the P replicas from the ranks that computed them alike (every rank of a
tensor-parallel group ends a step with the same logits and decisions). Consecutive ranks
share a tensor-parallel group because the all-reduces of every layer are the heavy traffic:
they stay inside a node (NVLink) while the one small all-gather per step may cross nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from lp.collective import Collective
from lp.engine.tp import ALONE, TensorGroup
from lp.errors import LPError


@dataclass(frozen=True)
class Mesh:
    """World size and T: the arithmetic of the mesh, no process groups."""

    world_size: int
    tp: int

    def __post_init__(self) -> None:
        if self.tp == "auto":
            raise LPError("tp=auto is resolved to a number before the layout is built")
        check_tp(self.tp)
        if self.world_size % self.tp:
            raise LPError(f"tp={self.tp} must divide the number of ranks ({self.world_size})")

    @property
    def replicas(self) -> int:
        """P: the LP replicas (tensor-parallel groups)."""
        return self.world_size // self.tp

    def tp_groups(self) -> list[list[int]]:
        """Every tensor-parallel group's world ranks: T consecutive ranks each."""
        T = self.tp
        return [list(range(p * T, (p + 1) * T)) for p in range(self.replicas)]

    def lp_groups(self) -> list[list[int]]:
        """Every LP group's world ranks: the ranks of one tensor-parallel index."""
        return [list(range(t, self.world_size, self.tp)) for t in range(self.tp)]


def check_tp(tp: object) -> None:
    """Refuse a `tp` that no world size could take (before anything loads): "auto" (lp/decode/mesh_cost.py)
    or an integer >= 1."""
    if tp == "auto":
        return
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise LPError(f"tp must be auto or an integer >= 1, got {tp!r}")


def split(world: Collective, tp: int, timeout_s: float) -> tuple[Collective, TensorGroup]:
    """This rank's LP collective (the all-gather between replicas) and tensor-parallel group.

    tp=1: the world itself and no group (no process group is created). Every rank creates every
    group, in the same order, as torch.distributed requires; each group's collectives time out
    after `timeout_s`."""
    mesh = Mesh(world.world_size, tp)
    if tp == 1:
        return world, ALONE
    timeout = timedelta(seconds=timeout_s)
    r = world.rank
    tp_group = lp_group = None
    for ranks in mesh.tp_groups():
        g = dist.new_group(ranks, timeout=timeout)
        tp_group = g if r in ranks else tp_group
    for ranks in mesh.lp_groups():
        g = dist.new_group(ranks, timeout=timeout) if mesh.replicas > 1 else None
        lp_group = g if r in ranks else lp_group
    nccl = dist.get_backend(tp_group) == "nccl"
    lp = Collective(r // tp, mesh.replicas, world.device, world.staged and mesh.replicas > 1, lp_group)
    return lp, TensorGroup(r % tp, tp, tp_group, capturable=nccl)


__all__ = ["Mesh", "check_tp", "split"]

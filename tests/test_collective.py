"""The all-gather's backend and each rank's GPU (lp/collective.py): NCCL with one GPU per rank,
gloo with host-staged messages when ranks share GPUs, one-line errors for what cannot work."""

import pytest
import torch

from lp.collective import Collective, plan_backend
from lp.errors import LPError


def test_one_gpu_per_rank_uses_nccl():
    assert [plan_backend("auto", True, r, 4, 8) for r in range(4)] == [("nccl", r) for r in range(4)]


def test_ranks_sharing_gpus_use_gloo_round_robin():
    assert [plan_backend("auto", True, r, 4, 1) for r in range(4)] == [("gloo", 0)] * 4
    assert [plan_backend("auto", True, r, 4, 2)[1] for r in range(4)] == [0, 1, 0, 1]
    assert plan_backend("gloo", True, 1, 2, 2) == ("gloo", 1)  # explicit gloo with a GPU each


def test_cpu_uses_gloo():
    assert plan_backend("auto", False, 3, 4, 0) == ("gloo", None)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("nccl", True, 0, 2, 1), "backend=nccl needs one GPU per rank, but 2 ranks share 1"),
        (("nccl", False, 0, 2, 0), "backend=nccl needs CUDA"),
        (("mpi", False, 0, 1, 0), "backend must be one of auto, nccl, gloo"),
    ],
)
def test_misconfigurations_are_one_line_errors(args, fragment):
    with pytest.raises(LPError, match=fragment):
        plan_backend(*args)


def test_single_rank_gathers_in_place():
    msg = torch.arange(6)
    assert torch.equal(Collective().all_gather(msg), msg[None])

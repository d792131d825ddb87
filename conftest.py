"""Shared by both test folders (tests/, tests_distributed/): tests/ goes on sys.path, so both
import the one helper module, tests/helpers.py, as `helpers`; tests marked `cuda` need a GPU and
are skipped where torch sees none, so the CPU suite stays green on machines without one; lp's
compiled loops are compiled (or loaded from numba's cache) once, before any test starts ranks;
the linear layers' formulation is fixed (`LP_KERNELS`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
# One matmul formulation for the whole suite (and the ranks it starts), whatever this machine's
# timing would choose: outputs then never depend on timer noise. Tests of the timed choice pass
# their own setting and a fake timer; `LP_KERNELS=wx pytest` runs the suite under another.
os.environ.setdefault("LP_KERNELS", "linear")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile lp's numba loops in this process first: on a fresh checkout, ranks started
    together before their cache is written would each compile them (about 30 s of CPU each,
    minutes for a batch of processes on two cores, beyond the time limits of the tests that
    launch them)."""
    from lp.decode.loop import compile_kernels

    compile_kernels()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `pytest -n 2 --dist loadgroup` (the README's command): tests/ on one worker beside the tests
    # that start ranks, those one at a time on the other (several at once would time each other out)
    ranks = pytest.mark.xdist_group("ranks")
    for item in items:
        if "tests_distributed" in item.path.parts:
            item.add_marker(ranks)
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_tests:
        return
    import torch  # only when a cuda test was collected

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is false")
    for item in cuda_tests:
        item.add_marker(skip)

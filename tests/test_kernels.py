"""The small-M matmul path of lp's CPU forwards (lp/engine/kernels.py): same values as torch's linear,
taken only for few-token inputs."""

from __future__ import annotations

import pytest
import torch

from lp.engine import kernels


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("M", [1, 2, 7, kernels.SMALL_M])
def test_small_m_matches_linear(M, bias, monkeypatch):
    calls = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a: calls.append(1) or mm(*a))
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(M, 24)
    got = kernels.linear(x, layer.weight, layer.bias)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert calls == [1]  # the W @ x.T path


def test_default_path_for_large_m(monkeypatch):
    monkeypatch.setattr(torch, "mm", lambda *a: pytest.fail("small-M path taken"))
    layer = torch.nn.Linear(24, 40)
    big = torch.randn(kernels.SMALL_M + 1, 24)
    assert torch.equal(
        kernels.linear(big, layer.weight, layer.bias), torch.nn.functional.linear(big, layer.weight, layer.bias)
    )

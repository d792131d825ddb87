"""The small-M matmul path of lp's CPU forwards (lp/kernels.py): same values as torch's linear,
taken only inside `small_m()` and only for few-token inputs."""
from __future__ import annotations

import pytest
import torch

from lp import kernels


@pytest.fixture
def layers():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(24, 40), torch.nn.Linear(24, 40, bias=False)
    kernels.install(torch.nn.Sequential(a, b))
    return a, b


@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (2, 24), (1, 7, 24), (kernels.SMALL_M, 24)])
def test_small_m_matches_linear(layers, shape, monkeypatch):
    calls = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a: calls.append(1) or mm(*a))
    x = torch.randn(shape)
    for layer in layers:
        want = torch.nn.functional.linear(x, layer.weight, layer.bias)
        with kernels.small_m():
            got = layer(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2  # both layers took the W @ x.T path


def test_default_path_outside_the_block_and_for_large_m(layers, monkeypatch):
    monkeypatch.setattr(torch, "mm", lambda *a: pytest.fail("small-M path taken"))
    a, _ = layers
    x = torch.randn(3, 24)
    assert torch.equal(a(x), torch.nn.functional.linear(x, a.weight, a.bias))  # outside small_m()
    with kernels.small_m():
        big = torch.randn(kernels.SMALL_M + 1, 24)
        assert torch.equal(a(big), torch.nn.functional.linear(big, a.weight, a.bias))
    assert kernels._state.depth == 0


def test_only_plain_linear_layers_are_patched():
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Custom(4, 4), torch.nn.ReLU())
    kernels.install(model)
    assert "forward" in vars(model[0]) and "forward" not in vars(model[1])

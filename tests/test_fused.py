"""One matrix for each layer's q/k/v and one for its gate/up (lp/engine/fused.py): the model's
projections become views of it (no second copy, the model's own outputs unchanged), a second
worker on the same model finds it fused, and a shard of each fuses as the whole does."""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny, make_prompt

from lp.engine.fused import fused
from lp.engine.tp import TensorGroup, shard
from lp.worker import Worker


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids[None]).logits[0]


@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("llama", dict(attention_bias=True)), ("qwen2", {})])
def test_projections_become_views_of_one_matrix(arch, overrides):
    model = build_tiny(arch, seed=2, **overrides)
    ids = torch.tensor(make_prompt(3, 20, 1))
    before = _logits(model, ids)
    attn = model.model.layers[0].self_attn
    q, k, v = (p.weight.detach().clone() for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    worker = Worker(model, graphs=False)
    qkv = worker.forward.layers[0].qkv
    assert torch.equal(qkv.weight, torch.cat([q, k, v]))
    rows = [0, q.shape[0], q.shape[0] + k.shape[0]]
    for p, start in zip((attn.q_proj, attn.k_proj, attn.v_proj), rows):
        assert p.weight.data_ptr() == qkv.weight[start:].data_ptr()  # a view, not a copy
    assert (qkv.bias is None) == (attn.q_proj.bias is None)
    assert torch.equal(_logits(model, ids), before)  # the model computes what it did
    again = Worker(model, graphs=False).forward.layers[0].qkv
    assert again.weight.data_ptr() == qkv.weight.data_ptr()  # found fused, not fused again


def test_a_missing_bias_adds_zeros():
    lin = [torch.nn.Linear(4, 3, bias=True), torch.nn.Linear(4, 2, bias=False)]
    m = fused(lin)
    assert m.bias.shape == (5,) and torch.equal(m.bias[3:], torch.zeros(2))
    assert lin[1].bias is None and lin[0].bias.data_ptr() == m.bias.data_ptr()
    x = torch.randn(2, 4)
    torch.testing.assert_close(torch.nn.functional.linear(x, m.weight, m.bias), torch.cat([lin[0](x), lin[1](x)], 1))


def test_a_shard_fuses_its_own_rows():
    """Under tensor parallelism a rank stacks its shard of q, k and v (its heads), as loaded."""
    model = build_tiny("llama", seed=5)
    attn = model.model.layers[0].self_attn
    whole = [p.weight.detach().clone() for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    shard(model, TensorGroup(1, 2))
    qkv = Worker(model, graphs=False, tp=TensorGroup(1, 2)).forward.layers[0].qkv
    halves = [w[w.shape[0] // 2 :] for w in whole]
    assert torch.equal(qkv.weight, torch.cat(halves))

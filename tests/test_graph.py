"""Fixed-shape steps (lp/graph.py), the form a step takes to be captured as a CUDA graph. On CPU
they run eagerly, which checks everything but the capture: padding, the scattered KV writes,
the whole-buffer mask, bucket reuse across steps and prompts."""
from __future__ import annotations

import pytest
import torch

from unit_helpers import ARCHS, reference_greedy
from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decoder import Decoder
from lp.graph import BUCKET, CAPACITY_QUANTUM, bucket, pad_layout
from lp.lookahead.mask import step_layout
from lp.worker import Worker
from test_decoder import make_prompt


def test_bucket_and_padding():
    assert [bucket(t) for t in (1, BUCKET, BUCKET + 1)] == [BUCKET, BUCKET, 2 * BUCKET]
    layout = step_layout(2, 5, 3, range(1, 4), 3)
    p = pad_layout(layout, torch.device("cpu"))
    T, S = layout.size, bucket(layout.size)
    assert p.block.shape == (S, S) and p.size == T and p.n_rows == len(layout.logit_rows)
    assert torch.equal(p.block[:T, :T], torch.from_numpy(layout.mask))
    # pad tokens see only themselves, and nothing real sees them
    assert torch.equal(p.block[T:, T:], torch.eye(S - T, dtype=torch.bool))
    assert not p.block[T:, :T].any() and not p.block[:T, T:].any()
    assert p.rows[:p.n_rows].tolist() == layout.logit_rows.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_step_equals_dynamic_step(arch, tiny_models):
    """Same logits from both forms of the same step, after the same committed prefix."""
    model = tiny_models[arch]
    prompt = torch.tensor(make_prompt(3, 10, 2))
    layout = step_layout(3, 5, 4, range(0, 5), 4)
    ids = torch.randint(3, 256, (layout.size,), generator=torch.Generator().manual_seed(0))
    out = []
    for graphs in (False, True):
        w = Worker(model, graphs=graphs)
        w.reset(len(prompt) + 2 * layout.size)
        w.prefill(prompt)
        first = w.step(ids, layout, len(prompt) + 2)
        w.commit(layout.m)  # a second step on top of a committed one, as in decoding
        out.append((first, w.step(ids, layout, len(prompt) + 5), w.kv.capacity))
    (a1, a2, cap_dynamic), (b1, b2, cap_static) = out
    torch.testing.assert_close(b1, a1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b2, a2, rtol=1e-5, atol=1e-5)
    assert cap_static % CAPACITY_QUANTUM == 0 and cap_static >= cap_dynamic


@pytest.mark.parametrize("N,W,G", [(3, 3, 3), (5, 7, 7), (2, 5, 5), (4, 4, 0)])
@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_decoding_equals_greedy(arch, N, W, G, tiny_models):
    """Whole generations, several prompts on one decoder (buckets reused, capacity kept)."""
    model = tiny_models[arch]
    worker = Worker(model, graphs=True)
    dec = Decoder(worker, Collective(), set(), 512)
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=40)
    for prompt in (make_prompt(1, 8, 3), make_prompt(2, 5, 2)):
        assert dec.generate(prompt, cfg).output_ids == reference_greedy(model, prompt, 40)
    assert len(worker.static._buckets) >= 1
    assert all(S % BUCKET == 0 for S in worker.static._buckets)


def test_api_switch(tiny_model_dir):
    from lp import LP
    from lp.errors import LPError

    with pytest.raises(LPError, match="graphs=true needs attention=sdpa"):
        LP(str(tiny_model_dir), device="cpu", graphs=True, attention="split")
    fixed, dynamic = LP(str(tiny_model_dir), device="cpu", graphs=True), LP(str(tiny_model_dir), device="cpu")
    assert fixed.decoder.worker.static is not None and dynamic.decoder.worker.static is None
    kw = dict(W=4, N=3, G=4, max_new_tokens=12)
    assert fixed.generate("w1 w2 w3 w1 w2", **kw).output_ids == dynamic.generate("w1 w2 w3 w1 w2", **kw).output_ids

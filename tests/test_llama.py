"""lp's lean Llama-family forward (lp/engine/llama.py) against transformers' own logits, and the
transformers-modules forward (lp/engine/forward.py) for a model outside the family."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY, build_tiny, make_prompt, reference_greedy

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder
from lp.engine import llama as lp_llama
from lp.engine.forward import TransformersForward
from lp.engine.llama import LlamaForward
from lp.lookahead.mask import step_layout
from lp.worker import Worker

VARIANTS = {
    "llama": ("llama", {}),
    "llama-bias-mha": ("llama", dict(attention_bias=True, num_key_value_heads=4)),
    "llama3-rope": (
        "llama",
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            )
        ),
    ),
    "qwen2": ("qwen2", {}),
    "mistral": ("mistral", {}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_is_transformers_bit_for_bit(dtype):
    """The lean forward's RoPE (a roll and a signed sine table, 4 ops) equals transformers'
    `apply_rotary_pos_emb` (rotate_half, 7 ops) exactly, not just closely."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = build_tiny(VARIANTS["llama"][0], **VARIANTS["llama"][1]).to(dtype)
    forward = LlamaForward(model, Worker(model, graphs=False).kv, 64)
    positions = torch.tensor([3, 4, 9, 40])
    q = torch.randn(1, 4, len(positions), forward.head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    cos, sin = model.model.rotary_emb(q, positions[None])
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    got = lp_llama._rotate(q[0], forward.cos[positions], forward.signed_sin[positions])
    assert torch.equal(got, want[0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_lean_forward_logits_match_transformers(variant):
    arch, overrides = VARIANTS[variant]
    model = build_tiny(arch, seed=3, **overrides)
    ids = torch.tensor(make_prompt(5, 40, 1))
    with torch.inference_mode():
        want = model(ids[None]).logits[0]
    w = Worker(model, graphs=False)
    assert isinstance(w.forward, LlamaForward)
    kv = w.sequence(len(ids), 8)
    w.prefill(kv, ids[:32].numpy())
    layout = step_layout(8, 1, 2, range(0), 0)  # 8 causal tokens; logits at the last
    got = w.step(kv, layout, ids[32:].numpy())
    torch.testing.assert_close(got[0], want[39], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("graphs", [False, True])
def test_other_architectures_run_through_their_own_modules(graphs):
    model = build_tiny("gemma", head_dim=16)
    worker = Worker(model, graphs=graphs)
    assert isinstance(worker.forward, TransformersForward)
    dec = Decoder(worker, Collective(), set(), 512)
    for prompt in (make_prompt(1, 8, 3), make_prompt(2, 6, 2)):
        assert dec.generate(prompt, DecodeConfig(W=5, N=3, G=5, max_new_tokens=24)).output_ids == reference_greedy(
            model, prompt, 24
        )


def test_cache_is_sized_once():
    """The cache's pages are allocated once (`kv_tokens`, whole key blocks of 128 with the pad
    page); a sequence past max_seq_len or past the cache is refused before it decodes."""
    from lp.errors import LPError

    model = build_tiny("llama")
    assert Worker(model).max_seq_len == TINY["max_position_embeddings"]
    w = Worker(model, max_seq_len=40, kv_tokens=300)
    assert w.max_seq_len == 40 and w.kv.slots == 384 and w.kv_tokens == 384 - 16
    dec = Decoder(w, Collective(), set(), 512)
    with pytest.raises(LPError, match="exceeds the 40 tokens"):
        dec.generate(make_prompt(1, 8, 3), DecodeConfig(W=5, N=3, G=5, max_new_tokens=24))
    short = dec.generate(make_prompt(1, 4, 2), DecodeConfig(W=2, N=3, G=2, max_new_tokens=8))
    assert short.output_ids == reference_greedy(model, make_prompt(1, 4, 2), 8)
    small = Decoder(Worker(model, kv_tokens=128), Collective(), set(), 512)
    with pytest.raises(LPError, match="more than the cache's"):
        small.generate(make_prompt(1, 20, 4), DecodeConfig(W=5, N=3, G=5, max_new_tokens=200))

"""lp's split attention (committed KV + in-step block merged by log-sum-exp) equals sdpa."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lp import attention, models
from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decoder import Decoder
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def _model(impl: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).eval()


def test_step_logits_match_sdpa():
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6])
    layout = step_layout(2, 4, 4, range(4), 3)
    ids = torch.randint(0, 200, (layout.size,), generator=torch.Generator().manual_seed(1))
    logits = {}
    for impl in ("sdpa", attention.NAME):
        w = Worker(_model(impl))
        w.reset(64)
        w.prefill(prompt)
        logits[impl] = w.step(ids, layout, len(prompt) + 1)
    torch.testing.assert_close(logits[attention.NAME], logits["sdpa"], rtol=1e-5, atol=1e-5)


def test_decoding_with_split_attention_is_exact():
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6, 7]
    outs = {}
    for impl in ("sdpa", attention.NAME):
        dec = Decoder(Worker(_model(impl)), Collective(), set(), 512)
        outs[impl] = [dec.generate(prompt, DecodeConfig(W, N, G, 40)).output_ids for W, N, G in [(5, 3, 5), (7, 5, 7)]]
    assert outs[attention.NAME] == outs["sdpa"]


def test_backend_choice_falls_back_without_cuda_or_flash():
    cpu = torch.device("cpu")
    assert models.attention_backend("auto", cpu) == "sdpa"
    assert models.attention_backend("split", cpu) == attention.NAME
    with pytest.raises(LPError):
        models.attention_backend("flash3", cpu)

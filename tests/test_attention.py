"""The attention backends (lp/engine/attention.py): masks built on the device from the committed
length, split attention (committed KV + in-step block merged by log-sum-exp) equal to sdpa, and
the backend choice with its one-line errors."""

import pytest
import torch
from helpers import build_tiny

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder
from lp.engine import attention
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def test_dense_mask():
    block = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    for start in (0, 4):
        m = attention.dense_mask(torch.tensor(start), block, start + 3 + 2)[0, 0]
        assert m[:, :start].all()  # every step token sees the committed slots
        assert torch.equal(m[:, start : start + 3], block)  # and its chain within the step
        assert not m[:, start + 3 :].any()  # never the tail
        # per group head (CUDA's sdpa folds a kv head's query heads into its rows)
        grouped = attention.dense_mask(torch.tensor(start), block, start + 3 + 2, groups=3)[0, 0]
        assert torch.equal(grouped, torch.cat([m] * 3))


def test_split_step_logits_match_sdpa():
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6])
    layout = step_layout(2, 4, 4, range(4), 3)
    ids = torch.randint(0, 200, (layout.size,), generator=torch.Generator().manual_seed(1))
    model = build_tiny("llama")
    logits = {}
    for impl in ("sdpa", "split"):
        w = Worker(model, attention=impl, graphs=False)
        w.reset(64, layout.size)
        w.prefill(prompt)
        logits[impl] = w.step(ids, layout, len(prompt) + 1)
    torch.testing.assert_close(logits["split"], logits["sdpa"], rtol=1e-5, atol=1e-5)


def test_decoding_with_split_attention_is_exact():
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6, 7]
    model = build_tiny("qwen2")
    outs = {}
    for impl in ("sdpa", "split"):
        dec = Decoder(Worker(model, attention=impl, graphs=False), Collective(), set(), 512)
        outs[impl] = [dec.generate(prompt, DecodeConfig(W, N, G, 40)).output_ids for W, N, G in [(5, 3, 5), (7, 5, 7)]]
    assert outs["split"] == outs["sdpa"]


def test_backend_choice():
    model = build_tiny("llama")
    assert Worker(model).attention == "sdpa"  # CPU, auto
    assert Worker(model, graphs=True).attention == "sdpa"
    for kw, fragment in (
        (dict(attention="flex", graphs=False), "attention=flex needs fixed-shape steps"),
        (dict(attention="split", graphs=True), "attention=split needs graphs=false"),
        (dict(attention="flash3"), "attention must be one of"),
        (dict(graphs="yes"), "graphs must be true, false or auto"),
        (dict(max_seq_len=1), "max_seq_len must be an integer >= 2"),
        (dict(compile=True, graphs=False), "compile=true needs fixed-shape steps"),
        (dict(compile=True), "compile=true needs fixed-shape steps"),  # graphs=auto: off on CPU
    ):
        with pytest.raises(LPError, match=fragment):
            Worker(model, **kw)


@pytest.mark.parametrize("W,N,G", [(2, 3, 2), (7, 5, 7)])  # 16 and 64 slots: 32 and 128 query rows
def test_flex_fixed_steps_match_sdpa(W, N, G):
    """FlexAttention over the whole cache with its block mask (eager here; compiled and captured on
    CUDA) gives sdpa's logits, on both sides of DECODE_ROWS (the main kernel past it on CUDA)."""
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6])
    layout = step_layout(1, W, N, range(W), G * (N - 1))
    ids = torch.randint(0, 200, (layout.size,), generator=torch.Generator().manual_seed(2))
    model = build_tiny("llama")  # 2 query heads per kv head
    logits = {}
    for impl in ("sdpa", "flex"):
        w = Worker(model, attention=impl, graphs=True, compile=False)
        w.reset(64, layout.size)
        w.prefill(prompt)
        logits[impl] = w.step(ids, layout, len(prompt))
    torch.testing.assert_close(logits["flex"], logits["sdpa"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("S", [1, 16, 64])
def test_flex_mask_full_blocks_equal_dense_mask(S):
    """The block mask, expanded (full blocks: all seen; partial blocks: mask_mod; the rest: none),
    is the dense mask, wherever the committed length falls; committed blocks are full blocks."""
    capacity, B = 768, attention.FLEX_BLOCK
    g = torch.Generator().manual_seed(S)
    block = (torch.rand(S, S, generator=g) < 0.5).tril() | torch.eye(S, dtype=torch.bool)
    start = torch.zeros((), dtype=torch.long)
    mask = attention.FlexMask(start, block, capacity)
    rows = mask.rows
    q, kv = torch.arange(rows)[:, None], torch.arange(capacity)[None]
    for committed in (0, 5, B - 1, B, 200, 300, capacity - 2 * B):
        start.fill_(committed)
        mask.update(committed)
        full, partial = int(mask.full[0, 0, 0]), int(mask.partial[0, 0, 0])
        assert full == committed // B and full + partial == -(-(committed + S) // B)
        seen = torch.zeros(rows, capacity, dtype=torch.bool)
        for i in mask._order[0, 0, 0, :full].tolist():
            seen[:, i * B : (i + 1) * B] = True
        evaluated = mask.block_mask.mask_mod(0, 0, q, kv)
        for i in mask.indices[0, 0, 0, :partial].tolist():
            seen[:, i * B : (i + 1) * B] = evaluated[:, i * B : (i + 1) * B]
        assert torch.equal(seen[:S], attention.dense_mask(start, block, capacity)[0, 0]), committed
        # the same from the device-held length (a captured mode=ar step's way)
        host = [t.clone() for t in (mask.full, mask.partial, mask.indices)]
        mask.follow(start)
        assert all(torch.equal(a, b) for a, b in zip(host, (mask.full, mask.partial, mask.indices)))


def test_compiled_flex_one_token_step_equals_eager():
    """The 1-token bucket compiled with FlexAttention on CPU (its query padded to 2 rows), after
    a prompt longer than a block (full blocks). tools.buckets checks every bucket."""
    from tools.buckets import compare

    model = build_tiny("llama", num_hidden_layers=1)
    assert compare(model, [1], "flex", prompt_len=150)[0]["max_abs_diff"] < 1e-5

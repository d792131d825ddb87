"""Fixed-shape steps (lp/engine/fixed_steps.py), the form a packed step takes to be compiled and
captured as a CUDA graph. On CPU they run eagerly, which checks everything but the capture:
padding, the KV writes at the slots the step names, the whole-cache masks (sdpa and
FlexAttention), bucket reuse across steps, sequences and batches, and a cache that never moves."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import ARCHS, build_tiny, make_prompt, reference_greedy, two_segments

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder, Request, StepObserver
from lp.engine.packed import BUCKETS, bucket, padded
from lp.engine.pages import PAD
from lp.errors import LPError
from lp.worker import Worker


def test_bucket_sizes():
    assert [bucket(t) for t in (1, 2, 16, 17, 120, 481, 512, 513, 700)] == [1, 16, 16, 32, 128, 512, 512, 768, 768]
    assert all(bucket(b) == b for b in BUCKETS)


def test_padded_packed_step():
    """Pad tokens write to the pad page's first slot and see only it; pad rows read row 0; the
    segments' blocks lie on the diagonal, apart."""
    worker = Worker(build_tiny("llama"), graphs=False)
    step, layout, _ = two_segments(worker, [make_prompt(1, 9, 2), make_prompt(2, 4, 3)])
    T, R = step.tokens, len(step.rows)
    assert T == layout.size + 5 and R == len(layout.logit_rows) + 1
    B = bucket(T)
    p = padded(step, B)
    assert (p["slots"][T:] == 0).all() and (p["owner"][T:] == PAD).all() and (p["length"][T:] == 1).all()
    assert (p["size"][T:] == 0).all() and p["rows"][:R].tolist() == step.rows.tolist() and (p["rows"][R:] == 0).all()
    assert np.array_equal(p["block"][:T, :T], step.block) and np.array_equal(
        p["block"][T:, T:], np.eye(B - T, dtype=bool)
    )
    n = layout.size
    assert np.array_equal(step.block[:n, :n], layout.mask) and not step.block[:n, n:].any()
    assert np.array_equal(step.block[n:, n:], np.tri(5, dtype=bool))


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_step_equals_eager_step(arch, attention, tiny_models):
    """Same logits from both forms of the same packed step (two sequences: a lookahead step and a
    prompt chunk), after the same committed prefixes."""
    model = tiny_models[arch]
    prompts = [make_prompt(3, 10, 2), make_prompt(4, 7, 3)]
    out = []
    for kw in (dict(graphs=False), dict(graphs=True, attention=attention)):
        w = Worker(model, **kw)
        step, _, _ = two_segments(w, prompts)
        out.append(w.run(step)[0].clone())
    torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("N,W,G", [(3, 3, 3), (5, 7, 7), (2, 5, 5), (4, 4, 0)])
@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_decoding_equals_greedy(arch, N, W, G, tiny_models):
    """Whole generations, several prompts decoded together and one after another on one decoder:
    buckets reused, cache never moved. With sdpa, the default; FlexAttention's step equals the
    eager one on every architecture (`test_fixed_shape_step_equals_eager_step`), compiled too
    (`test_compiled_step_equals_eager`)."""
    model = tiny_models[arch]
    worker = Worker(model, graphs=True, attention="sdpa")
    dec = Decoder(worker, Collective(), set(), 512)
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=40)
    buffers = [t.data_ptr() for t in worker.kv.k]
    prompts = (make_prompt(1, 8, 3), make_prompt(2, 5, 2), make_prompt(4, 30, 2))
    done = {
        s.request.tag: s.result for s in dec.run([Request(p, cfg, tag=i) for i, p in enumerate(prompts)], dec.batch(2))
    }
    assert [done[i].output_ids for i in range(3)] == [reference_greedy(model, p, 40) for p in prompts]
    assert dec.generate(prompts[0], cfg).output_ids == done[0].output_ids
    assert worker.fixed._buckets and all(S in BUCKETS for S in worker.fixed._buckets)
    assert [t.data_ptr() for t in worker.kv.k] == buffers


def test_fixed_shape_decoding_of_capped_shapes(tiny_models):
    """W=auto's shapes whose trees shrink with the pending tokens (empty ones too: their size
    caps the step) run at fixed shapes and stay greedy."""
    from lp.decode.ladder import LADDER

    model = tiny_models["llama"]
    dec = Decoder(Worker(model, graphs=True, attention="sdpa"), Collective(), set(), 512)
    prompt = make_prompt(1, 8, 3)
    for shape in (s for s in LADDER if s.tree_tokens is not None):
        cfg = replace(shape.config, max_new_tokens=40)
        assert dec.generate(prompt, cfg).output_ids == reference_greedy(model, prompt, 40), shape.name


def test_api_switch(tiny_model_dir):
    from lp import LP

    fixed, eager = LP(str(tiny_model_dir), device="cpu", graphs=True), LP(str(tiny_model_dir), device="cpu")
    assert fixed.decoder.worker.fixed is not None and eager.decoder.worker.fixed is None  # auto: off on CPU
    kw = dict(W=4, N=3, G=4, max_new_tokens=12)
    assert fixed.generate("w1 w2 w3 w1 w2", **kw).output_ids == eager.generate("w1 w2 w3 w1 w2", **kw).output_ids


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_compiled_step_equals_eager(tiny_models, attention):
    """torch.compile of the fixed-shape step (with sdpa, the CUDA default; with FlexAttention),
    run on CPU: the same tokens as transformers' greedy decoding, lookahead and plain, and the
    same logits as the eager step for a packed step of two sequences."""
    model = tiny_models["qwen2"]
    prompt = make_prompt(5, 10, 2)
    compiled = Worker(model, graphs=True, compile=True, attention=attention)
    dec = Decoder(compiled, Collective(), set(), 512)
    want = reference_greedy(model, prompt, 30)
    assert dec.generate(prompt, DecodeConfig(W=5, N=3, G=5, max_new_tokens=30)).output_ids == want
    assert dec.generate(prompt, DecodeConfig(mode="ar", max_new_tokens=30)).output_ids == want
    eager = Worker(model, graphs=True, attention=attention)
    logits = []
    for w in (compiled, eager):
        step, _, _ = two_segments(w, [prompt, make_prompt(2, 6, 3)])
        logits.append(w.run(step)[0].clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_compile_without_fixed_shapes_is_refused(tiny_models):
    """compile=true compiles the fixed-shape step; with graphs=false it would silently run eager."""
    with pytest.raises(LPError, match="compile=true needs fixed-shape steps"):
        Worker(tiny_models["llama"], graphs=False, compile=True)


class _Counts(StepObserver):
    """dynamo's compiled graphs and the worker's ready buckets when the decode's clock starts,
    and after each step."""

    def __init__(self, worker: Worker) -> None:
        self.worker, self.at_start, self.after_steps = worker, None, []

    def _now(self) -> tuple[int, int]:
        return torch._dynamo.utils.counters["stats"]["unique_graphs"], len(self.worker.fixed._buckets)

    def prefill_done(self) -> None:
        self.at_start = self._now()

    def forward_done(self) -> None:
        self.after_steps.append(self._now())


def test_compiled_decode_compiles_nothing_once_started(monkeypatch):
    """A sequence's admission compiles every bucket its decoding steps reach (W15 N5 G15: 121-130
    tokens, buckets 128 and 256; W7 N5 G7: 56-66, buckets 64 and 128), so the varying pending
    tokens of its steps compile nothing while it is timed. dynamo's graphs are counted; inductor,
    which turns each into code (minutes here on shared cores), is left out: tools.buckets checks
    its output."""
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile(fn, **kw, backend="eager"))
    model = build_tiny("llama", seed=3, num_hidden_layers=1)
    worker = Worker(model, graphs=True, compile=True, attention="sdpa")
    dec = Decoder(worker, Collective(), set(), 512)
    sizes = set()
    for W, N, G in ((15, 5, 15), (7, 5, 7)):
        cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=24)
        for prompt in (make_prompt(1, 8, 3), make_prompt(2, 5, 4), make_prompt(6, 23, 2)):
            counts = _Counts(worker)
            out = dec.generate(prompt, cfg, observer=counts)
            assert out.output_ids == reference_greedy(model, prompt, 24)
            assert set(counts.after_steps) == {counts.at_start}, (W, prompt)
            sizes |= set(out.fed_per_step)
    assert len({bucket(t) for t in sizes}) > 2  # the steps did cross buckets


def test_failed_capture_leaves_the_worker_as_it_was(monkeypatch, tiny_models):
    """A capture that fails raises one LPError and stores nothing (no half-made graph replayed);
    the next attempt captures afresh. On CPU the capture itself is stood in for."""
    model = tiny_models["llama"]
    prompts = [make_prompt(3, 10, 2), make_prompt(1, 5, 3)]
    eager = Worker(model, graphs=True)
    step, _, _ = two_segments(eager, prompts)
    want = eager.run(step)[0].clone()

    w = Worker(model, graphs=True)
    w.fixed.capture = True

    def failing(b):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(w.fixed, "_record", failing)
    with pytest.raises(LPError, match=r"^capturing the step of 32 tokens as a CUDA graph failed \(RuntimeError: "):
        w.prepare(20, 20)
    assert w.fixed._buckets == {} and w.fixed.capture_seconds == {}

    class Replay:  # a graph whose replay runs the forward into its recorded output
        def __init__(self, b):
            self.b, self.out = b, w.fixed.run(b)

        def replay(self):
            self.out.copy_(w.fixed.run(self.b))

    monkeypatch.setattr(w.fixed, "_record", lambda b: (g := Replay(b), g.out))
    w.prepare(20, 20)
    assert list(w.fixed._buckets) == [32]
    w.fixed.capture = False  # the prompts' prefills, eagerly; the packed step replays the "graph"
    step, _, _ = two_segments(w, prompts)
    w.fixed.capture = True
    torch.testing.assert_close(w.run(step)[0], want)


def test_an_n2_step_at_a_bucket_edge_is_prepared_at_admission(tiny_models):
    """W1 N2 with a 15-node tree in a 16-token limit: a 16-token step reads 17 logits rows, so it runs
    in the 32-token bucket, which the sequence's admission builds, not the step."""
    worker = Worker(tiny_models["llama"], graphs=True, attention="sdpa")

    class Buckets(StepObserver):
        def prefill_done(self):
            self.at_start = set(worker.fixed._buckets)

        def forward_done(self):
            assert set(worker.fixed._buckets) == self.at_start

    prompt = make_prompt(1, 8, 3)
    cfg = DecodeConfig(W=1, N=2, G=5, tree_tokens=15, step_tokens=16, max_new_tokens=24)
    out = Decoder(worker, Collective(), set(), 512).generate(prompt, cfg, observer=Buckets())
    assert 32 in worker.fixed._buckets and out.output_ids == reference_greedy(tiny_models["llama"], prompt, 24)


def test_a_captured_move_equals_the_eager_one(monkeypatch, tiny_models):
    """The kept drafts' KV move (lp/engine/kv.py `move`), padded to its bucket with the pad page's
    first slot onto itself, as a GPU's graph replays it (stood in for here): the same cache."""
    model = tiny_models["llama"]
    a, b = Worker(model, graphs=True), Worker(model, graphs=True)
    prompt = make_prompt(2, 20, 2)
    for w in (a, b):
        kv = w.sequence(len(prompt), 8)
        w.prefill(kv, prompt)
    src, dst = torch.tensor([20, 33, 17]), torch.tensor([30, 31, 32])
    a.move(src, dst)

    class Graph:
        def replay(self):
            b.kv.move(*b.fixed._moves[16][:2])

    @contextlib.contextmanager
    def recording(graph):
        yield

    b.fixed.capture = True
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", recording)
    b.move(src, dst)
    for x, y in zip(a.kv.k + a.kv.v, b.kv.k + b.kv.v):
        assert torch.equal(x, y)

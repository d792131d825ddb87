"""Fixed-shape steps (lp/engine/fixed_steps.py), the form a step takes to be compiled and captured as a CUDA
graph. On CPU they run eagerly, which checks everything but the capture: padding, the KV writes
at the device-held committed length, the whole-cache masks (sdpa and FlexAttention), bucket
reuse across steps and prompts, and a cache that never moves."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from helpers import ARCHS, build_tiny, make_prompt, reference_greedy

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder, StepObserver
from lp.engine.step_tensors import BUCKETS, bucket, step_tensors
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def test_bucket_sizes():
    assert [bucket(t) for t in (1, 2, 16, 17, 120, 481, 512, 513, 700)] == [1, 16, 16, 32, 128, 512, 512, 768, 768]
    assert all(bucket(b) == b for b in BUCKETS)


@pytest.mark.parametrize("packed", [False, True])  # packed: one buffer, one copy (the GPU's way)
def test_padded_layout(packed):
    layout = step_layout(
        2, 5, 3, range(1, 4), (-1, 0, 0, -1, 3, 4)
    )  # T=14: unpadded, 196 mask bytes (not a multiple of 8)
    p = step_tensors(layout, torch.device("cpu"), fixed=True, packed=packed)
    T, S = layout.size, bucket(layout.size)
    assert p.block.shape == (S, S) and p.size == T and p.n_rows == len(layout.logit_rows)
    assert torch.equal(p.block[:T, :T], torch.from_numpy(layout.mask))
    # pad tokens see only themselves, and nothing real sees them
    assert torch.equal(p.block[T:, T:], torch.eye(S - T, dtype=torch.bool))
    assert not p.block[T:, :T].any() and not p.block[:T, T:].any()
    assert p.rows.shape == (S,) and p.rows[: p.n_rows].tolist() == layout.logit_rows.tolist()
    assert p.depth.tolist() == layout.depth.tolist() + [0] * (S - T)
    exact = step_tensors(layout, torch.device("cpu"), fixed=False, packed=packed)
    assert exact.block.shape == (T, T) and exact.rows.tolist() == layout.logit_rows.tolist()
    assert torch.equal(exact.block, torch.from_numpy(layout.mask)) and exact.depth.tolist() == layout.depth.tolist()
    n = len(layout.tree)
    for d in (p, exact):  # the tree's parents, and its depths and ancestors as the verifier reads them
        assert d.parents.tolist() == list(layout.tree) and d.block.dtype == torch.bool
        assert d.tree_depth.tolist() == layout.depth[T - n :].tolist()
        assert torch.equal(d.tree_ancestors, torch.from_numpy(layout.mask[T - n :, T - n :]))


@pytest.mark.parametrize("packed", [False, True])
def test_a_layout_with_more_rows_than_tokens_takes_the_bucket_of_its_rows(packed):
    """W1 N2 with no tree: x0 alone, its row read twice (y1 and the column's new token)."""
    layout = step_layout(1, 1, 2, range(1), ())
    assert layout.size == 1 and len(layout.logit_rows) == 2
    p = step_tensors(layout, torch.device("cpu"), fixed=True, packed=packed)
    assert p.block.shape == (16, 16) and p.rows[:2].tolist() == layout.logit_rows.tolist() and p.n_rows == 2


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_step_equals_eager_step(arch, attention, tiny_models):
    """Same logits from both forms of the same step, after the same committed prefix."""
    model = tiny_models[arch]
    prompt = torch.tensor(make_prompt(3, 10, 2))
    layout = step_layout(3, 5, 4, range(0, 5), 4)
    ids = torch.randint(3, 256, (layout.size,), generator=torch.Generator().manual_seed(0))
    out = []
    for kw in (dict(graphs=False), dict(graphs=True, attention=attention)):
        w = Worker(model, **kw)
        w.reset(len(prompt) + layout.size, layout.size)
        w.prefill(prompt)
        first = w.step(ids, layout, len(prompt) + 2)
        w.commit(layout.m)  # a second step on top of a committed one, as in decoding
        out.append((first, w.step(ids, layout, len(prompt) + 5)))
    (a1, a2), (b1, b2) = out
    torch.testing.assert_close(b1, a1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b2, a2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("N,W,G", [(3, 3, 3), (5, 7, 7), (2, 5, 5), (4, 4, 0)])
@pytest.mark.parametrize("arch", ARCHS)
def test_fixed_shape_decoding_equals_greedy(arch, N, W, G, tiny_models):
    """Whole generations, several prompts on one decoder: buckets reused, cache never moved."""
    model = tiny_models[arch]
    worker = Worker(model, graphs=True, attention="flex" if N == 5 else "sdpa")
    dec = Decoder(worker, Collective(), set(), 512)
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=40)
    buffers = [t.data_ptr() for t in worker.kv.k]
    for prompt in (make_prompt(1, 8, 3), make_prompt(2, 5, 2), make_prompt(4, 30, 2)):
        assert dec.generate(prompt, cfg).output_ids == reference_greedy(model, prompt, 40)
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


def test_compiled_step_equals_eager(tiny_models):
    """torch.compile of the fixed-shape FlexAttention step (the CUDA default), run on CPU: the
    same tokens as transformers' greedy decoding, and the same logits as the eager step; a plain
    step (`mode=ar`) compiled whole: embedding, layers, head, argmax and message."""
    model = tiny_models["qwen2"]
    prompt = make_prompt(5, 10, 2)
    compiled = Worker(model, graphs=True, compile=True, attention="flex")
    dec = Decoder(compiled, Collective(), set(), 512)
    want = reference_greedy(model, prompt, 30)
    assert dec.generate(prompt, DecodeConfig(W=5, N=3, G=5, max_new_tokens=30)).output_ids == want
    assert dec.generate(prompt, DecodeConfig(mode="ar", max_new_tokens=30)).output_ids == want
    eager = Worker(model, graphs=True, attention="flex")
    layout = step_layout(2, 5, 3, range(5), 5)
    ids = torch.randint(3, 256, (layout.size,), generator=torch.Generator().manual_seed(0))
    logits = []
    for w in (compiled, eager):
        w.reset(len(prompt) + 1, layout.size)
        w.prefill(torch.tensor(prompt))
        logits.append(w.step(ids, layout, len(prompt) + 1))
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
    """A decode's reset compiles every bucket its steps reach (W15 N5 G15: 121-130 tokens, buckets
    128 and 256; W7 N5 G7: 56-66, buckets 64 and 128), so the varying pending tokens of its steps
    compile nothing while it is timed. dynamo's graphs are counted; inductor, which turns each
    into code (minutes here on shared cores), is left out: tools.buckets checks its output."""
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
    layout = step_layout(2, 5, 3, range(5), 5)
    prompt = torch.tensor(make_prompt(3, 10, 2))
    ids = torch.randint(3, 256, (layout.size,), generator=torch.Generator().manual_seed(0))
    eager = Worker(model, graphs=True)
    eager.reset(len(prompt) + 1, layout.size)
    eager.prefill(prompt)
    want = eager.step(ids, layout, len(prompt) + 1)

    w = Worker(model, graphs=True)
    w.fixed.capture = True

    def failing(b):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(w.fixed, "_record", failing)
    with pytest.raises(LPError, match=r"^capturing the step of 32 tokens as a CUDA graph failed \(RuntimeError: "):
        w.reset(len(prompt) + 1, layout.size)
    assert w.fixed._buckets == {} and w.fixed.capture_seconds == {}

    class Replay:  # a graph whose replay runs the forward into its recorded output
        def __init__(self, b):
            self.b, self.out = b, w.fixed.run(b.inputs)

        def replay(self):
            self.out.copy_(w.fixed.run(self.b.inputs))

    monkeypatch.setattr(w.fixed, "_record", lambda b: (g := Replay(b), g.out))
    w.reset(len(prompt) + 1, layout.size)
    assert list(w.fixed._buckets) == [32]
    w.prefill(prompt)
    torch.testing.assert_close(w.step(ids, layout, len(prompt) + 1), want)


def test_an_n2_step_at_a_bucket_edge_is_prepared_at_reset(tiny_models):
    """W1 N2 with a 15-node tree in a 16-token limit: a 16-token step reads 17 logits rows, so it runs in the 32-token
    bucket, which the decode's reset builds, not the step."""
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


def test_the_compiled_plain_step_is_compiled_before_its_recording(monkeypatch, tiny_models):
    """On a GPU the whole plain step (forward, argmax, message) is recorded as one CUDA graph; its
    compiled message must be compiled before the recording starts, since compiling may run
    kernels that a recording refuses, and the warm-up must leave the step's state as it was. On
    CPU the recording is stood in for: it checks that dynamo made no graph inside it, and, as a
    recording does, runs nothing (the state is put back); a replay runs the step."""
    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile(fn, **kw, backend="eager"))
    model = tiny_models["llama"]
    w = Worker(model, graphs=True, compile=True, attention="sdpa")
    w.fixed.capture = True

    class Replay:  # a bucket's graph: its replay runs the forward into its recorded output
        def __init__(self, b):
            self.b, self.out = b, w.fixed.run(b.inputs)

        def replay(self):
            self.out.copy_(w.fixed.run(self.b.inputs))

    monkeypatch.setattr(w.fixed, "_record", lambda b: (g := Replay(b), g.out))
    made_inside = []

    class Graph:  # the plain step's graph: its replay runs the step into the recorded message
        def replay(self):
            w.fixed._greedy[2].copy_(w.fixed._greedy_step(w._plain))

    @contextlib.contextmanager
    def recording(graph):
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        kept = [t.clone() for t in (*w._plain.tensors, w.kv.start)]
        yield
        made_inside.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - before)
        for t, value in zip((*w._plain.tensors, w.kv.start), kept):
            t.copy_(value)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", recording)
    prompt = make_prompt(4, 9, 2)
    w.reset(len(prompt) + 20, 1)
    w.prefill(torch.tensor(prompt[:-1]))
    w.greedy_start(torch.tensor(prompt[-1:]), len(prompt) - 1, 0, 0)
    out = [int(w.greedy_step()[0]) for _ in range(20)]  # each message's y1, read at once
    assert made_inside == [0] and out == reference_greedy(model, prompt, 20)

"""The matmul formulations of lp's forwards (lp/engine/kernels.py) and their choice by timing
(lp/engine/kernel_choice.py): every formulation gives `F.linear`'s values at every size it may
be chosen for, to fp32 rounding; the choice follows the timer; the timings are cached per
machine and model shape, and not when other load disturbed them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import build_tiny, make_prompt, reference_greedy

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder
from lp.engine import kernel_choice
from lp.engine.kernel_choice import SIZES, choose, table
from lp.engine.kernels import EXACT_ROWS, FORMULATIONS, Kernels, Matrix, padded_rows
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.worker import TIMED_CONTEXT, Worker

CPU = torch.device("cpu")
HERE = [n for n, f in FORMULATIONS.items() if f.available(CPU, torch.float32)]


class Quiet:
    """A watch of other processes' load that saw none."""

    def cores(self) -> float:
        return 0.0


def idle(name: str, M: int):
    """Forwards a fake timer never runs."""
    return lambda: None


def fake_timer(fastest):
    """A timer under which `fastest(M)` is the fastest formulation at size M; runs nothing."""
    return lambda name, M, run: 1.0 if name == fastest(M) else 2.0


def matrices(seed: int = 0, bias: bool = True) -> dict[str, list[Matrix]]:
    g = torch.Generator().manual_seed(seed)

    def m(out: int, inp: int) -> Matrix:
        b = torch.randn(out, generator=g) * 0.1 if bias else None
        return Matrix(torch.randn(out, inp, generator=g) * 0.05, b)

    return {"qkv": [m(96, 64), m(96, 64)], "o": [m(64, 64)] * 2, "head": [m(256, 64)]}


def test_this_machine_has_more_than_one_formulation():
    assert "linear" in HERE and "wx" in HERE


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", HERE)
def test_every_formulation_is_linear_at_every_size(name, bias):
    """The sizes a choice is made at, some between them (oneDNN's padded ones among them) and one
    past the last (prefills)."""
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 576, generator=g) * 0.05
    m = FORMULATIONS[name].prepare(Matrix(weight, torch.randn(200, generator=g) if bias else None))
    for M in (*SIZES, 5, 17, 33, 100, 300):
        x = torch.randn(M, 576, generator=g)
        got = FORMULATIONS[name].run(x, m)
        assert got.shape == (M, 200)
        torch.testing.assert_close(got, F.linear(x, weight, m.bias), rtol=1e-5, atol=1e-5, msg=f"{name} at M={M}")


def test_onednn_meets_a_bounded_set_of_row_counts():
    """A server's packed steps take every size: oneDNN sees few, each at most 1/8 more rows."""
    rows = [padded_rows(M) for M in range(1, 4097)]
    assert rows[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))
    assert all(M <= r <= M * 9 / 8 for M, r in enumerate(rows, start=1))
    assert len(set(rows)) <= EXACT_ROWS + 8 * 8  # 8 an octave from 16 to 4096
    assert rows == sorted(rows) and padded_rows(rows[99]) == rows[99]


@pytest.mark.parametrize("name", HERE)
def test_the_timer_picks_each_formulation(name):
    chosen = choose(matrices(), CPU, forward=idle, timer=fake_timer(lambda M: name), cache=False, load=Quiet)
    assert chosen.names == {name}
    assert all(chosen.pick(M).name == name for M in (*SIZES, 1000))


def test_the_timer_picks_per_size():
    want = {M: HERE[i % len(HERE)] for i, M in enumerate(SIZES)}
    chosen = choose(matrices(), CPU, forward=idle, timer=fake_timer(want.get), cache=False, load=Quiet)
    assert {M: chosen.pick(M).name for M in SIZES} == want
    # between two sizes their times interpolated (a tie keeps the smaller's); past the last, the last's
    assert chosen.pick(5).name == want[4] and chosen.pick(4096).name == want[SIZES[-1]]


def test_between_sizes_the_interpolated_times_choose():
    """A formulation whose time grows with the rows (oneDNN's) keeps the sizes just past a timed
    one where another's is flat and wins only further on."""
    seconds = {16: {"onednn": 38.0, "wx": 42.0}, 32: {"onednn": 52.0, "wx": 48.0}}
    # 38 + 0.875 a row against 42 + 0.375: equal at 24 rows, wx 5% faster (the hysteresis) from 29
    assert table(seconds, "").table == ((28, "onednn"), (32, "wx"))


def test_every_formulation_and_size_is_timed_in_whole_forwards():
    ran, timed = [], []

    def forward(name, M):
        return lambda: ran.append((name, M))

    def timer(name, M, run):
        run()
        timed.append((name, M))
        return 1.0 if name == "linear" else 9.0

    kernel_choice.measure(HERE, SIZES, forward, timer, reps=3)
    assert ran == timed and set(timed) == {(n, M) for n in HERE for M in SIZES}
    assert timed.count(("wx", 1)) == 2  # far behind after two passes: not timed again
    timed.clear()
    kernel_choice.measure(HERE, SIZES, forward, timer, reps=3, drop=False)  # ranks timing together
    assert timed.count(("wx", 1)) == 3


def test_near_ties_keep_the_last_sizes_choice():
    """Timer noise between neighbouring sizes does not make the choice flip back and forth."""
    seconds = {1: {"linear": 1.0, "wx": 2.0}, 2: {"linear": 1.03, "wx": 1.0}, 4: {"linear": 1.5, "wx": 1.0}}
    assert table(seconds, "").table == ((2, "linear"), (4, "wx"))


def test_a_worker_times_whole_forwards_within_its_cache(tmp_path, monkeypatch):
    """The probe's context and sizes fit a small cache (its pages given back after), and the weight
    copies no chosen formulation reads are dropped."""
    monkeypatch.setenv("LP_CACHE", str(tmp_path))
    seen = []

    def timer(name, M, run):
        run()  # a whole forward, every matmul by `name`
        seen.append(M)
        return 1.0 if name == "linear" else 2.0

    w = Worker(build_tiny("llama"), graphs=False, kv_tokens=128, kernels="auto", kernel_timer=timer)
    # a 256-token context and 128 tokens do not fit this cache: the probe's context shrank
    assert w.kv_tokens < TIMED_CONTEXT + max(seen) and w.kernels.names == {"linear"}
    assert w.kv.pool.lendable == w.kv.pool.pages - 1
    assert all(m.packed is None for mats in w.forward.matrices().values() for m in mats)


def test_a_setting_forces_one_formulation():
    def timer(name, M, run):
        pytest.fail("a forced choice times nothing")

    assert choose(matrices(), CPU, forward=idle, choice="wx", timer=timer).table == ((1, "wx"),)
    with pytest.raises(LPError, match="kernels must be one of"):
        choose(matrices(), CPU, forward=idle, choice="fast", timer=timer)
    with pytest.raises(LPError, match="kernels=onednn does not run here"):
        choose(matrices(), CPU, forward=idle, choice="onednn", compiled=True, timer=timer)
    with pytest.raises(LPError, match="kernels must be one of"):
        Worker(build_tiny("llama"), kernels="fast")


def test_cuda_times_nothing():
    """On CUDA torch's linear is the only formulation: no timing, no tensor made."""

    def timer(name, M, run):
        pytest.fail("nothing to choose between")

    assert choose(matrices(), torch.device("cuda"), forward=idle, timer=timer).table == ((1, "linear"),)


def test_timings_are_cached_per_machine_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("LP_CACHE", str(tmp_path))
    first = choose(matrices(), CPU, forward=idle, timer=fake_timer(lambda M: "wx"), load=Quiet)
    assert "timed on" in first.how and len(list((tmp_path / "kernels").iterdir())) == 1

    def timer(name, M, run):
        pytest.fail("a cached shape is not timed again")

    again = choose(matrices(seed=1), CPU, forward=idle, timer=timer, load=Quiet)  # other weights, the same shapes
    assert again.table == first.table and "cached in" in again.how
    other = {**matrices(), "o": [Matrix(torch.zeros(32, 64))]}
    choose(other, CPU, forward=idle, timer=fake_timer(lambda M: "linear"), load=Quiet)
    assert len(list((tmp_path / "kernels").iterdir())) == 2
    # forwards timed after another context are other timings
    choose(matrices(), CPU, forward=idle, context=64, timer=fake_timer(lambda M: "wx"), load=Quiet)
    assert sum("whole forwards after 64 tokens" in f.read_text() for f in (tmp_path / "kernels").iterdir()) == 1


def test_timings_under_other_load_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LP_CACHE", str(tmp_path))

    class Busy:
        def cores(self) -> float:
            return 1.0

    chosen = choose(matrices(), CPU, forward=idle, timer=fake_timer(lambda M: "wx"), load=Busy)
    assert chosen.names == {"wx"} and "not cached" in chosen.how
    assert not (tmp_path / "kernels").exists()


def test_ranks_choose_by_their_summed_timings():
    """A rank that found `wx` fastest takes `linear` when the group's sum says so."""

    def group_sum(t: torch.Tensor) -> torch.Tensor:  # another rank whose linear is far faster
        if t.numel() == 1:  # whether any rank lacks cached timings: this one does
            return t
        names = HERE
        other = torch.tensor([0.0 if n == "linear" else 10.0 for _ in SIZES for n in names], dtype=t.dtype)
        return t + other

    chosen = choose(
        matrices(), CPU, forward=idle, timer=fake_timer(lambda M: "wx"), cache=False, agree=group_sum, load=Quiet
    )
    assert chosen.names == {"linear"}


def test_a_rank_times_with_its_group_even_with_its_timings_cached(tmp_path, monkeypatch):
    """A forward all-reduces inside under tensor parallelism: where another rank of the group has no
    cached timings, this one times its forwards too (else the group's collectives would not match)."""
    monkeypatch.setenv("LP_CACHE", str(tmp_path))
    choose(matrices(), CPU, forward=idle, timer=fake_timer(lambda M: "wx"), load=Quiet)  # cached now
    timed = []

    def timer(name, M, run):
        timed.append(name)
        return 1.0 if name == "linear" else 9.0  # far behind: a rank timing alone would drop them

    def another_lacks_them(t: torch.Tensor) -> torch.Tensor:
        return t + 1 if t.numel() == 1 else 2 * t

    choose(matrices(), CPU, forward=idle, timer=timer, agree=another_lacks_them, load=Quiet)
    assert len(timed) == len(HERE) * len(SIZES) * kernel_choice.REPS  # every one, none dropped


def test_the_choice_reads_as_words():
    k = Kernels(((1, "wx"), (2, "wx"), (4, "onednn"), (128, "onednn")), "timed on X")
    assert k.describe() == "wx up to 2 tokens, onednn from 3; timed on X"
    assert Kernels.only("linear").describe() == "linear"
    assert k.switches == {2, 3} and not Kernels.only("wx").switches  # both sides of each change


@pytest.mark.parametrize("name", HERE)
def test_the_forward_under_each_formulation_is_transformers(name):
    model = build_tiny("llama", seed=3, attention_bias=True, num_key_value_heads=4)
    ids = torch.tensor(make_prompt(5, 40, 1))
    with torch.inference_mode():
        want = model(ids[None]).logits[0]
    w = Worker(model, graphs=False, kernels=name)
    assert w.kernels.names == {name}
    kv = w.sequence(len(ids), 8)
    w.prefill(kv, ids[:32].numpy())
    for T in (1, 3, 8):  # steps of T causal tokens after the prefill, logits of each
        got = w.step(kv, step_layout(T, 1, 2, range(0), 0), ids[32 : 32 + T].numpy())
        torch.testing.assert_close(got[0], want[31 + T], rtol=1e-4, atol=1e-4)


def test_a_worker_takes_the_timers_choice(tmp_path, monkeypatch):
    """End to end: the worker's forward runs what its fake timer made fastest, at each size."""
    monkeypatch.setenv("LP_CACHE", str(tmp_path))
    want = {M: "wx" if M <= 2 else HERE[-1] for M in SIZES}
    model = build_tiny("llama", seed=3)
    w = Worker(model, graphs=False, kernels="auto", kernel_timer=fake_timer(want.get))
    assert {M: w.kernels.pick(M).name for M in SIZES} == want
    prompt = make_prompt(2, 8, 3)
    dec = Decoder(w, Collective(), set(), 512)
    cfg = DecodeConfig(W=3, N=3, G=5, max_new_tokens=24)
    assert dec.generate(prompt, cfg).output_ids == reference_greedy(model, prompt, 24)


@pytest.mark.parametrize("name", HERE)
def test_decoding_under_each_formulation_is_greedy(name):
    model = build_tiny("qwen2", seed=4)
    dec = Decoder(Worker(model, graphs=False, kernels=name), Collective(), set(), 512)
    for prompt in (make_prompt(1, 8, 3), make_prompt(6, 20, 2)):
        for cfg in (DecodeConfig(W=5, N=3, G=5, max_new_tokens=32), DecodeConfig(mode="ar", max_new_tokens=32)):
            assert dec.generate(prompt, cfg).output_ids == reference_greedy(model, prompt, 32), (name, cfg.mode)


def test_the_report_names_the_cpu_the_floor_and_every_formulation(tiny_model_dir, tmp_path, monkeypatch):
    from lp.bench.kernels import report

    monkeypatch.setenv("LP_CACHE", str(tmp_path))
    text = report(str(tiny_model_dir), reps=1)
    assert kernel_choice.cpu_name() in text and "weight-read floor" in text
    rows = [line.split(" | ")[0].strip("| ") for line in text.splitlines() if line.startswith("| ")]
    assert set(HERE) | {"auto"} <= set(rows) and "the `auto` rows below ran lp's own choice at load" in text

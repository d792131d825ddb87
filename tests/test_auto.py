"""`W=auto` (lp/decode/auto.py): the same input on the same machine gets the same choice despite
calibration noise, and what it predicts is reported next to what it achieves."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import lp.decode.auto
from lp.decode.auto import AutoTuner, CostCurve
from lp.decode.ladder import LADDER, rank_tokens

SIZES = (1, 2, 4, 8, 16, 32, 64)
ROOT = Path(__file__).resolve().parent.parent


def curve(per_token: float, noise: float = 0.0, rng: random.Random | None = None) -> CostCurve:
    """A step costing 1 + per_token x (T - 1), each size timed with up to `noise` relative error."""
    return CostCurve(
        SIZES, tuple((1 + per_token * (T - 1)) * (1 + (rng.uniform(-noise, noise) if rng else 0)) for T in SIZES)
    )


def choices(per_token: float, runs: int = 40, noise: float = 0.02) -> set:
    rng = random.Random(0)
    return {AutoTuner(curve(per_token, noise, rng)).choose()[0] for _ in range(runs)}


def _ties() -> tuple[float, float]:
    """Per-token costs (of `curve`) at which, with the prior, the cheapest shape is expected to run
    exactly as fast as plain decoding, and exactly as fast as the next shape."""
    (t0, s0), (t1, s1) = ((T, 1 + lp.decode.auto.PRIOR_SLOPE * math.log2(T)) for T in map(rank_tokens, LADDER[:2]))
    return (s0 - 1) / (t0 - 1), (s1 - s0) / (s0 * (t1 - 1) - s1 * (t0 - 1))


# At those ties (within 0.5%), timings of the same machine differ by ~2%.
@pytest.mark.parametrize("tie,expected", [(0, None), (1, LADDER[0])])
def test_choice_is_stable_under_calibration_noise(tie, expected):
    assert choices(_ties()[tie] * 1.002) == {expected}


def test_without_the_margin_the_same_noise_flips_the_choice(monkeypatch):
    """Control for the test above: its near ties do flip when any gain wins."""
    monkeypatch.setattr(lp.decode.auto, "MARGIN", 1.0)
    assert all(len(choices(per_token * 1.002)) > 1 for per_token in _ties())


def test_predictions_follow_what_is_achieved():
    """A machine and model where S - 1 = 0.06 x log2(step tokens) (weaker than the prior): after
    a few sequences of 64 steps, the predicted S of the shape used is within 0.05 of the achieved
    S; a short one (a warm-up's 4 steps) hardly moves the prior."""
    short = AutoTuner(curve(0.001))
    short.observe(5, 1.0, 4)
    assert short.slope() > 0.28
    rng = random.Random(1)
    tuner = AutoTuner(curve(0.001))  # a flat step cost, as on a GPU
    errors = []
    for _ in range(12):
        shape, _ = tuner.choose()
        assert shape is not None  # steps are cheap here: lookahead always pays
        achieved = 1 + 0.06 * math.log2(rank_tokens(shape)) + rng.uniform(-0.02, 0.02)
        errors.append(abs(tuner.expect(shape)[0] - achieved))
        tuner.observe(rank_tokens(shape), achieved, 64)
    assert max(errors[5:]) < 0.05 and errors[1] < errors[0] / 2, errors


def test_the_reason_reads_as_words():
    plain = AutoTuner(curve(0.5)).choose()[1]
    cheapest = "W=1 N=2 G=15 step_tokens=11 tree_tokens=9 lone_matches=true"
    assert plain.startswith(f"plain decoding: even the cheapest lookahead step ({cheapest}, 11 tokens)")
    assert "nothing decoded yet" in plain and "((" not in plain and "(s)" not in plain
    tuner = AutoTuner(curve(0.01))
    tuner.observe(rank_tokens(LADDER[0]), 1.3, 64)
    chosen = tuner.choose()[1]
    assert "fitted on 1 sequence:" in chosen and "-token step costs" in chosen


def test_results_report_the_configuration_used(tiny_model_dir):
    """A plain decode (asked for, or chosen by auto) has no window; an auto result carries
    the S and tokens/s it predicted next to the achieved ones."""
    from lp import LP

    lm = LP(str(tiny_model_dir))
    ids = [4, 5, 6, 7, 4, 5, 6, 7]
    ar = lm.generate(ids, mode="ar", max_new_tokens=4)
    assert (ar.mode, ar.W, ar.N, ar.G, ar.predicted) == ("ar", None, None, None, None)
    auto = lm.generate(ids, W="auto", N="auto", G="auto", max_new_tokens=4)
    assert auto.auto and set(auto.predicted) == {"S", "tokens_per_s"} and auto.predicted["tokens_per_s"] > 0
    if auto.mode == "ar":
        assert (auto.W, auto.N, auto.G) == (None, None, None) and auto.predicted["S"] == 1.0
    else:
        assert min(auto.W, auto.N, auto.G) >= 1 and auto.predicted["S"] > 1.0
    fixed = lm.generate(ids, W=2, N=3, G=2, max_new_tokens=4)
    assert (fixed.mode, fixed.W, fixed.N, fixed.G, fixed.auto, fixed.predicted) == ("lookahead", 2, 3, 2, None, None)
    lm.close()


def test_fixed_shape_costs_are_their_buckets():
    """With fixed-shape steps a T-token step runs padded to its bucket: it costs the bucket's
    forward, not a value interpolated between buckets."""
    c = CostCurve((1, 16, 32, 64), (1.0, 1.5, 2.0, 3.0), padded=True)
    assert c.seconds_at(17) == c.seconds_at(32) == 2.0 and c.seconds_at(2) == 1.5
    assert CostCurve(c.tokens, c.seconds).seconds_at(24) == 1.75


@pytest.mark.parametrize("padded", [False, True])
def test_costs_of_many_sizes_at_once_are_each_sizes(padded):
    """`seconds_of` (a step's budget prices thousands of sizes with it) is `seconds_at` of each,
    between the measured sizes and beyond them, bucket by bucket where steps are padded."""
    from lp.engine.packed import bucket, buckets

    sizes = np.arange(1, 3000)
    assert buckets(sizes).tolist() == [bucket(int(T)) for T in sizes]
    c = CostCurve((1, 16, 32, 64, 256), (1.0, 1.5, 2.0, 3.0, 6.0), padded=padded)
    T = np.array([1, 8.5, 17, 48, 300, 768])
    # exact sizes: interpolated, and beyond 256 the last slope (3/192 a token); padded: 8.5 -> 16,
    # 17 -> 32, 48 -> 64, 300 -> 512, 768 -> 768 (buckets), 128 between 64 and 256
    want = (
        [1.0, 1.5, 2.0, 3.0, 6.0 + 256 * 3 / 192, 6.0 + 512 * 3 / 192]
        if padded
        else [1.0, 1.25, 1.53125, 2.5, 6.0 + 44 * 3 / 192, 6.0 + 512 * 3 / 192]
    )
    assert c.seconds_of(T) == pytest.approx(want) and [c.seconds_at(x) for x in T] == pytest.approx(want)
    dip = CostCurve((1, 64, 128), (1.0, 3.0, 2.0), padded=padded)  # a bucket's cost can dip: none beyond it
    assert dip.seconds_of(np.array([1024])) == pytest.approx([2.0])


def test_calibration_builds_every_bucket_auto_can_use(tiny_models):
    """Fixed-shape steps: calibration times (so compiles and captures, on a GPU) every bucket a
    ladder shape's step uses, before any decode; exact-size steps keep the short sizes."""
    from lp.decode.auto import calibrate
    from lp.engine.packed import bucket
    from lp.worker import Worker

    worker = Worker(tiny_models["llama"], graphs=True, kv_tokens=1024)
    cost = calibrate(worker, reps=1)
    # every rank's share of a ladder step, one pending token or the most, up to what the cache
    # holds: the largest shape's 1024-token step does not fit this cache after the context
    assert bucket(rank_tokens(LADDER[-1])) == 1024 and worker.step_slots(1024) > worker.kv_tokens - 256
    assert cost.padded and cost.tokens == (1, 16, 32, 64, 128, 256, 512)
    assert set(cost.tokens) <= set(worker.fixed._buckets)
    assert worker.kv.pool.lendable == worker.kv.pool.pages - 1  # the calibration's pages given back
    # at 8 ranks a share is cut to 128 tokens (lp/decode/shares.py): no rank builds the buckets it never runs
    eight = calibrate(Worker(tiny_models["llama"], graphs=True), reps=1, world_size=8)
    assert eight.tokens == (1, 16, 32, 64, 128)
    exact_size = Worker(tiny_models["llama"], graphs=False)
    plain = calibrate(exact_size, reps=1)
    assert not plain.padded and plain.tokens == (*SIZES, 128, 256)
    assert exact_size.kv.pool.lendable == exact_size.kv.pool.pages - 1  # the drafting batch's pages too
    # a small cache: the drafting batch's context shrinks to what it lends, as the curve's does
    small = Worker(tiny_models["llama"], graphs=False, kv_tokens=128)
    assert calibrate(small, reps=1).drafting >= 0 and small.kv.pool.lendable == small.kv.pool.pages - 1
    assert 0 < cost.plain_seconds < math.inf and 0 < plain.plain_seconds < math.inf


def test_what_drafts_add_to_a_step_is_in_a_shapes_price():
    """A shape that pays on the curve alone does not where what its drafts add to a step
    (`CostCurve.drafting`) eats the tokens they make."""
    cheap = curve(0.001)
    assert AutoTuner(cheap).choose()[0] is not None
    shape, reason = AutoTuner(replace(cheap, drafting=4.0)).choose()  # four plain steps' cost more
    assert shape is None and reason.startswith("plain decoding: even the cheapest lookahead step")
    assert "costs 5.0" in reason  # its forward and what its drafts add, against a plain step


def test_a_shape_is_priced_beside_the_other_sequences():
    """Beside other sequences in the same steps, a shape's step costs what it adds to theirs: where
    a step's cost grows with its tokens (a CPU), a shape that pays alone loses to plain decoding
    beside many; where it hardly grows (a GPU's bucket), it still pays."""
    steep = CostCurve((1, 16, 32, 64), (1.0, 1.3, 1.9, 3.0))
    assert AutoTuner(steep).choose()[0] is not None
    assert AutoTuner(steep).choose(others=31)[0] is None
    flat = CostCurve((1, 16, 32, 64, 128), (1.0, 1.01, 1.02, 1.04, 1.1))
    assert AutoTuner(flat).choose(others=31)[0] is not None
    assert AutoTuner(steep).expect(None, others=31) == (1.0, 32 / steep.seconds_at(32), 1.0)


def test_the_runtime_keeps_fixed_shape_costs_padded(tiny_model_dir):
    from lp import LP

    lm = LP(str(tiny_model_dir), graphs=True)
    lm.generate([4, 5, 6, 7, 4, 5, 6, 7], W="auto", N="auto", G="auto", max_new_tokens=4)
    assert lm._tuner.cost.padded and lm._tuner.cost.tokens[-1] == 512
    lm.close()


def test_the_prior_is_the_budget_sweeps_slope():
    """PRIOR_SLOPE is the slope `auto` fits (S - 1 against log2 of the largest step) to the lp rows
    of the budget sweep that the ladder comes from: rerunning the sweep means refitting the prior."""
    doc = json.loads((ROOT / "results" / "sweep" / "spec_bench_48" / "sweep.json").read_text())
    rows = [
        (rank_tokens(next(s for s in LADDER if s.name == r["config"])), r["S"])
        for r in doc["rows"]
        if r["decoder"] == "lp"
    ]
    assert len(rows) == len(LADDER)
    fit = sum(math.log2(T) * (S - 1) for T, S in rows) / sum(math.log2(T) ** 2 for T, _ in rows)
    assert round(fit, 2) == lp.decode.auto.PRIOR_SLOPE


def test_a_shapes_name_is_its_config():
    """Shape.name spells every key that differs from its default, as lp.bench parses it."""
    from lp.bench.shapes import parse_lookahead
    from lp.config import DecodeConfig

    Shape = lp.decode.ladder.Shape
    odd = Shape(W=1, N=2, G=15, step_tokens=16, tree_tokens=10, successors=16, lone_matches=True, draft_len=16)
    for shape in (*LADDER, odd):
        assert Shape.of(DecodeConfig(**parse_lookahead(shape.name))) == shape, shape.name
    assert Shape(W=1, N=2, G=15, step_tokens=11, tree_tokens=10, lone_matches=True).name == "W1N2G15-L11-B10-lone"
    assert Shape(W=3, N=3, G=15, step_tokens=1024, successors=16, draft_len=16).name == "W3N3G15-L1024-R16-D16"
    # a shape's size is its largest step, whatever gave it: the tree's limit follows from it
    assert Shape.of(DecodeConfig(W=3, N=3, G=15, tree_tokens=112)).name == "W3N3G15-L128"


def test_the_command_line_leaves_the_shapes_keys_to_auto():
    """`python -m lp.generate`'s defaults (W, N and G auto) give none of the other keys a shape
    sets, so W=auto's choice sets them all (it sets only keys not given); a key given on the
    command line is kept."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    import lp.generate

    cfg = OmegaConf.load(ROOT / "configs" / "generate.yaml")
    given = lp.generate.settings_of(cfg)
    keys = {f.name for f in fields(lp.decode.ladder.Shape)} - {"W", "N", "G"}
    assert (given["W"], given["N"], given["G"]) == ("auto", "auto", "auto")
    assert not given.keys() & keys
    for key in keys:  # each a setting of the command line
        assert key in cfg and key in lp.generate.SETTINGS, key
    cfg.draft_len, cfg.continuation_len = 12, 16
    assert [lp.generate.settings_of(cfg)[k] for k in ("draft_len", "continuation_len")] == [12, 16]


@pytest.mark.parametrize("P", [1, 2, 3, 4, 6, 8])
def test_the_ladder_is_sized_so_shares_fill_buckets(P):
    """Over P replicas each shape's step is P shares of a bucket (where an even share reaches one
    past a single token), its shares cut to that bucket: W=auto prices what the engine runs."""
    from lp.decode.ladder import LADDER, ladder
    from lp.decode.shares import share_cap
    from lp.engine.packed import BUCKETS

    for shape, sized in zip(LADDER, ladder(P)):
        assert sized.step_tokens <= shape.step_tokens and sized.name.split("-")[0] == shape.name.split("-")[0]
        cap = share_cap(sized.config, P)
        if P == 1:
            assert sized == shape and cap == 0
            continue
        assert rank_tokens(sized, P) <= cap + 1  # an N = 2 window reads one row more than it feeds
        if shape.step_tokens / P >= BUCKETS[1]:
            assert sized.step_tokens % P == 0 and sized.step_tokens // P in BUCKETS
    if P in (2, 4, 8):
        assert ladder(P) == LADDER  # the ladder's powers of two fill buckets already


def test_a_batch_made_before_any_w_auto_request_prices_its_steps(tiny_model_dir, monkeypatch):
    """`LP.stream` and the server make their batch before the first request chooses its shape
    (and so measures the step costs): the batch's budget still prices W=auto's trees with them."""
    import lp.frontend.runtime
    from lp import LP
    from lp.decode.budget import Claim

    lm = LP(str(tiny_model_dir))
    budget = lm.budget()
    assert lm._tuner is None  # nothing measured yet
    flat = CostCurve((1, 64), (1.0, 1.0))  # nodes cost nothing: a step takes all it can
    monkeypatch.setattr(lp.frontend.runtime, "calibrate_ranks", lambda *args: flat)
    lm.ask([4, 5, 6, 7], W="auto", N="auto", G="auto", max_new_tokens=4)
    assert budget.total([Claim(1, 40, True)]) == 40
    lm.close()

"""The benchmark's metric code on synthetic inputs: S, the accepted-tokens histogram, medians,
step intervals, speedup against the baseline, exactness, and per-category aggregation."""

from __future__ import annotations

import math

import pytest

from lp.bench import metrics as m


def test_tokens_per_step():
    assert m.tokens_per_step(128, 64) == 2.0
    assert m.tokens_per_step(10, 10) == 1.0
    assert math.isnan(m.tokens_per_step(5, 0))


def test_accepted_histogram():
    assert m.accepted_histogram([1, 3, 1, 2, 3, 3]) == {1: 2, 2: 1, 3: 3}
    assert list(m.accepted_histogram([4, 1, 2]).keys()) == [1, 2, 4]  # sorted by tokens per step
    assert m.accepted_histogram([]) == {}
    with pytest.raises(ValueError):
        m.accepted_histogram([1, -1])
    # the histogram accounts for every token and every step
    acc = [1, 2, 5, 1, 1, 3]
    h = m.accepted_histogram(acc)
    assert sum(k * v for k, v in h.items()) == sum(acc)
    assert sum(h.values()) == len(acc)


def test_merge_histograms_accepts_json_keys():
    assert m.merge_histograms([{1: 2, 2: 1}, {"1": 3, "4": 1}, None]) == {1: 5, 2: 1, 4: 1}
    assert m.histogram_fractions({1: 3, 2: 1}) == {1: 0.75, 2: 0.25}


def test_median_and_intervals():
    assert m.median([3.0, 1.0, 2.0]) == 2.0
    assert m.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(m.median([]))
    assert m.intervals([0.0, 1.0, 3.0], 6.0) == [1.0, 2.0, 3.0]
    assert m.intervals([], 1.0) == []
    with pytest.raises(ValueError):
        m.intervals([2.0, 1.0], 3.0)


def test_speedup():
    assert m.speedup(10.0, 5.0) == 2.0
    assert m.speedup(5.0, 10.0) == 0.5
    for bad in ((None, 1.0), (1.0, None), (0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0)):
        assert math.isnan(m.speedup(*bad))
    assert m.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(m.geomean([float("nan")]))


def test_outside_forward():
    assert m.outside_forward(0.9, 1.0) == pytest.approx(0.1)
    assert m.outside_forward(1.2, 1.0) == 0.0  # timer jitter never gives a negative share
    assert math.isnan(m.outside_forward(0.5, 0.0))


def test_first_mismatch():
    assert m.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert m.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert m.first_mismatch([1, 2], [1, 2, 3]) == 2  # a shorter output is a mismatch
    assert m.first_mismatch([], []) is None


def _row(decoder, category, new, steps, secs, base, hist, matches=True, lat=(0.1,), status="ok"):
    return dict(
        decoder=decoder,
        label=decoder,
        kind=decoder,
        category=category,
        world_size=1,
        new_tokens=new,
        steps=steps,
        decode_seconds=secs,
        prefill_seconds=0.01,
        baseline_seconds=base,
        speedup=m.speedup(base, secs),
        accepted_hist=hist,
        step_latencies=list(lat),
        matches_greedy=matches,
        status=status,
    )


def test_summarize_pools_tokens_steps_and_seconds():
    rows = [
        _row("ar", "qa", 10, 10, 2.0, 2.0, {1: 10}),
        _row("lp", "qa", 10, 5, 1.0, 2.0, {2: 5}, lat=(0.2, 0.2)),
        _row("ar", "math", 30, 30, 6.0, 6.0, {1: 30}),
        _row("lp", "math", 30, 10, 4.0, 6.0, {1: 2, 3: 6, 4: 1, 5: 1}, matches=False, lat=(0.3, 0.5, 0.4)),
        _row("lp", "math", 0, 0, 0.0, None, {}, status="error: boom"),
    ]
    rows[1]["forward_seconds"], rows[3]["forward_seconds"] = 0.9, 3.8  # lp: time inside the forward
    s = {(r["decoder"], r["category"]): r for r in m.summarize(rows)}
    qa, math_, all_ = s[("lp", "qa")], s[("lp", "math")], s[("lp", "all")]
    assert all_["outside_forward"] == pytest.approx(1 - 4.7 / 5.0)  # pooled over prompts
    assert math.isnan(s[("ar", "all")]["outside_forward"])  # no forward timing: no share
    assert qa["S"] == 2.0 and qa["speedup"] == 2.0 and qa["matches_greedy"] is True
    assert math_["S"] == 3.0 and math_["speedup"] == 1.5
    assert math_["matches_greedy"] is False and math_["mismatches"] == 1
    assert math_["prompts"] == 1 and math_["status"].startswith("ok (1 not run")
    assert math_["step_latency_median"] == 0.4
    # all categories pooled: (10 + 30) tokens over (5 + 10) steps; (2 + 6) s over (1 + 4) s
    assert all_["S"] == pytest.approx(40 / 15)
    assert all_["S_mean"] == pytest.approx((2.0 + 3.0) / 2)
    assert all_["speedup"] == pytest.approx(8 / 5)
    assert all_["speedup_geomean"] == pytest.approx(math.sqrt(2.0 * 1.5))
    assert all_["tokens_per_s"] == pytest.approx(40 / 5)
    assert all_["accepted_hist"] == {1: 2, 2: 5, 3: 6, 4: 1, 5: 1}
    assert s[("ar", "all")]["S"] == 1.0 and s[("ar", "all")]["speedup"] == 1.0
    # order: decoders as first seen, their categories as first seen, "all" last
    order = [(r["decoder"], r["category"]) for r in m.summarize(rows)]
    assert order == [("ar", "qa"), ("ar", "math"), ("ar", "all"), ("lp", "qa"), ("lp", "math"), ("lp", "all")]


def test_summarize_group_that_never_ran():
    rows = [_row("tp", "qa", 0, 0, 0.0, None, {}, status="unsupported: heads")]
    (only, _all) = m.summarize(rows)
    assert only["prompts"] == 0 and only["status"] == "unsupported: heads"
    assert math.isnan(only["S"]) and math.isnan(only["speedup"])


def test_speedup_ignores_prompts_without_baseline():
    rows = [_row("lp", "qa", 10, 5, 1.0, 3.0, {2: 5}), _row("lp", "qa", 10, 5, 1.0, None, {2: 5})]
    (qa, _all) = m.summarize(rows)
    assert qa["speedup"] == 3.0 and qa["decode_seconds"] == 2.0

"""The cost model of a tensor-parallel group (lp/decode/mesh_cost.py), `tp=auto`'s choice with given
costs, and tools.layouts' projection: the fit reproduces the published speedups it is fitted to,
the choice follows the costs, a group never spans nodes, a node-crossing all-gather is charged,
and the best step shape is the fastest sweep row."""

from pathlib import Path

import pytest

from lp.decode.auto import CostCurve
from lp.decode.mesh_cost import PUBLISHED_TP, GroupModel, choose, fit, group_sizes
from tools import layouts

SWEEP = Path(__file__).parent / "data" / "sweep_small.json"
# one GPU's step: a flat weight read up to 64 tokens, then growing (an H100-like shape)
ONE_GPU = CostCurve((1, 64, 128, 512), (0.0065, 0.0068, 0.0081, 0.0160))


def test_fit_reproduces_the_published_speedups():
    model = fit()
    step1 = 1e3 / PUBLISHED_TP[1]
    for T, tok_s in PUBLISHED_TP.items():
        predicted = step1 / model.step_ms(step1, T, 1)
        assert abs(predicted - tok_s / PUBLISHED_TP[1]) < 0.05 * tok_s / PUBLISHED_TP[1], T
    assert 0 < model.a < 0.5 and 0 < model.lat_ms < 0.05


def test_one_gpu_is_the_measured_step_and_more_tokens_cost_more():
    model = GroupModel(0.2, 0.004, 150.0)
    assert model.step_ms(8.0, 1, 100) == 8.0
    assert model.step_ms(8.0, 4, 128) > model.step_ms(8.0, 4, 1)
    assert model.one_gpu_ms(model.step_ms(8.0, 4, 50), 4, 50) == pytest.approx(8.0)


def test_auto_picks_a_large_group_when_all_reduces_are_cheap():
    cheap = GroupModel(a=0.05, lat_ms=0.002)
    best, priced = choose(8, [1, 2, 4, 8], ONE_GPU.seconds_at, cheap, allgather_ms=0.05)
    assert best.T == 8 and best.P == 1 and best.shape is not None
    assert [x.T for x in priced] == [1, 2, 4, 8] and best.tok_s == max(x.tok_s for x in priced)


def test_auto_picks_replicas_when_all_reduces_are_slow():
    slow = GroupModel(a=0.05, lat_ms=5.0)
    best, _ = choose(8, [1, 2, 4, 8], ONE_GPU.seconds_at, slow, allgather_ms=0.05)
    assert (best.T, best.P) == (1, 8)


def test_auto_skips_group_sizes_that_do_not_divide_the_heads():
    assert group_sizes(8, 12, 4, 11008) == [1, 2, 4]  # 8 does not divide 12 heads
    assert group_sizes(6, 9, 3, 1536) == [1, 3]  # SmolLM2-135M on 6 ranks
    assert group_sizes(4, 9, 3, 1536) == [1]
    best, priced = choose(8, group_sizes(8, 12, 4, 11008), ONE_GPU.seconds_at, GroupModel(0.05, 0.002), 0.05)
    assert best.T == 4 and {x.T for x in priced} == {1, 2, 4}


def _rows(Ps=(1, 2, 4, 8)) -> list[dict]:
    return [
        {
            "P": P,
            "W": 5 * P,
            "N": 3,
            "G": 5 * P,
            "S": 2.0 + P / 10,
            "slowest_rank_ms_mean": 8.0,
            "slowest_rank_tokens_mean": 100.0,
            "ar_tok_s": 150.0,
        }
        for P in Ps
    ]


def test_every_layout_of_a_node_is_priced():
    priced = layouts.price(_rows(), fit(), 8, 8, allgather_ms=0.05, cross_node_ms=0.5)
    assert [(x["T"], x["P"]) for x in priced] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    lp8 = priced[0]
    assert lp8["step_ms"] == 8.0 + 0.05 and not lp8["spans_nodes"]  # one node: the in-node all-gather
    assert priced[-1]["step_ms"] == fit().step_ms(8.0, 8, 100.0)  # one replica: no all-gather


def test_two_nodes_never_split_a_group_and_charge_the_crossing_all_gather():
    model = fit()
    near = layouts.price(_rows(), model, 16, 8, allgather_ms=0.05, cross_node_ms=0.05)
    far = layouts.price(_rows(), model, 16, 8, allgather_ms=0.05, cross_node_ms=0.5)
    assert max(x["T"] for x in far) == 8 and all(x["P"] >= 2 for x in far)
    assert [x["tok_s"] for x in far if x["P"] == 16] == [None]  # the projection has no P = 16 row
    for a, b in zip(near, far):
        if a["tok_s"] is not None:
            assert b["spans_nodes"] and b["step_ms"] - a["step_ms"] == pytest.approx(0.45)
    assert layouts.verdict(far, 400.0)["best"]["T"] == 8


def test_the_best_step_shape_is_the_fastest_sweep_row():
    sweep = layouts.read_sweep(SWEEP)
    assert [r["config"] for r in sweep["rows"]] == ["W4N3G4", "W15N5G15"]  # lp rows only
    shapes = layouts.price_shapes(sweep, ONE_GPU, fit(), 8)
    best = layouts.best_shape(shapes)
    assert best["tok_s"] == max(x["tok_s"] for x in shapes) and best["config"] == "W15N5G15"
    assert shapes[0]["one_gpu_ms"] == pytest.approx(1e3 * ONE_GPU.seconds_at(14.0))
    priced = layouts.price(_rows(), fit(), 8, 8, 0.05, 0.5, shapes={8: best})
    assert priced[-1]["source"] == "sweep" and priced[-1]["config"] == "W15N5G15"


def test_a_bench_result_directory_reads_as_a_sweep(tmp_path):
    (tmp_path / "meta.json").write_text('{"device": "cpu", "started": "2026-11-23T07:25:53", "prompts": 48}')
    (tmp_path / "summary.json").write_text(
        '[{"decoder": "lp[W8N5G15-B88]", "category": "all", "S": 2.76, "step_tokens": 96.4},'
        ' {"decoder": "lp[W8N5G15-B88]", "category": "qa", "S": 2.4, "step_tokens": 90.0},'
        ' {"decoder": "hf-greedy", "category": "all", "S": 1.0, "step_tokens": 1.0}]'
    )
    sweep = layouts.read_sweep(tmp_path)
    assert sweep["rows"] == [{"config": "W8N5G15-B88", "step_tokens": 130, "step_tokens_mean": 96.4, "S": 2.76}]
    assert sweep["prompts"] == 48 and sweep["date"] == "2026-11-23"


def test_a_sweep_row_longer_than_the_measured_steps_is_not_priced():
    sweep = layouts.read_sweep(SWEEP)
    longest = max(sweep["rows"], key=lambda r: r["step_tokens"])
    short = CostCurve((1, longest["step_tokens"] - 1), (0.0065, 0.0070))
    assert longest["config"] not in [x["config"] for x in layouts.price_shapes(sweep, short, fit(), 8)]
    assert len(layouts.price_shapes(sweep, ONE_GPU, fit(), 8)) == len(sweep["rows"])

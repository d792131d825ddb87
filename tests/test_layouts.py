"""The cost model of a tensor-parallel group (lp/decode/mesh_cost.py), `tp=auto`'s choice with given
costs, and tools.layouts' projection: the fit reproduces the published speedups it is fitted to,
the choice follows the costs, a group never spans nodes, a node-crossing all-gather is charged,
and each mesh is priced at its fastest shape."""

import json

import pytest
from test_project import LADDER_S, steps_result, sweep

from lp.decode.auto import CostCurve
from lp.decode.ladder import rank_tokens
from lp.decode.mesh_cost import PUBLISHED_TP, GroupModel, choose, fit, group_sizes, priced_shapes
from tools import layouts, pricing

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


def test_drafts_cost_their_shapes_what_they_add_and_plain_decoding_nothing():
    """A shape with drafts pays what they add to a step (as W=auto prices it); where they cost more
    than any shape makes, plain decoding is the fastest mesh."""
    model = GroupModel(a=1.0, lat_ms=0.0)
    free, dear = (priced_shapes(1, 1, ONE_GPU.seconds_at, model, 0.0, drafting_s=d) for d in (0.0, 0.05))
    assert free[0].shape is None and dear[0].tok_s == free[0].tok_s
    for a, b in zip(free[1:], dear[1:]):
        assert b.tok_s == pytest.approx(b.S / (1e3 * ONE_GPU.seconds_at(rank_tokens(b.shape)) + 50) * 1e3)
        assert b.tok_s < a.tok_s
    assert max(free, key=lambda x: x.tok_s).shape is not None
    assert choose(1, [1], ONE_GPU.seconds_at, model, 0.0, drafting_s=0.05)[0].shape is None
    group = GroupModel(a=0.2, lat_ms=0.004)
    for free, dear in zip(*(priced_shapes(2, 2, ONE_GPU.seconds_at, group, 0.05, drafting_s=d) for d in (0.0, 0.05))):
        assert dear.S / dear.tok_s == pytest.approx(free.S / free.tok_s + 0.05)  # seconds a step


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


@pytest.fixture
def priced(tmp_path):
    costs, swept = tmp_path / "steps.json", tmp_path / "sweep.json"
    costs.write_text(json.dumps(steps_result()))
    swept.write_text(json.dumps(sweep(LADDER_S)))
    return pricing.bucket_costs(costs)[0], pricing.SweepS(swept)


def test_every_mesh_of_a_node_is_priced_at_its_fastest_shape(priced):
    curve, S = priced
    model = fit()
    meshes = layouts.price(curve, S, model, 8, 8, allgather_ms=0.05, cross_node_ms=0.5)
    assert [(x["T"], x["P"]) for x in meshes] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    for x in meshes:
        assert x["tok_s"] == max(s["tok_s"] for s in x["shapes"]) and not x["spans_nodes"]
        shape = next(p for p in priced_shapes(x["T"], x["P"], curve.seconds_at, model, x["allgather_ms"], S_of=S)
                     if (p.shape.name if p.shape else "ar") == x["config"])  # fmt: skip
        share = 1 if shape.shape is None else rank_tokens(shape.shape, x["P"])
        gather = 0.05 if x["P"] > 1 else 0.0
        assert x["step_ms"] == pytest.approx(model.step_ms(1e3 * curve.seconds_at(share), x["T"], share) + gather)
    refs = layouts.references(curve, S, model, 8, 8)
    assert refs["tp_ar_tok_s"] == pytest.approx(1e3 / model.step_ms(6.5, 8, 1))
    verdict = layouts.verdict(meshes, refs)
    assert verdict["lp_alone_vs_one_gpu"] == pytest.approx(meshes[0]["tok_s"] / refs["one_gpu_best"]["tok_s"])


def test_two_nodes_never_split_a_group_and_charge_the_crossing_all_gather(priced):
    curve, S = priced
    near = layouts.price(curve, S, fit(), 16, 8, allgather_ms=0.05, cross_node_ms=0.05)
    far = layouts.price(curve, S, fit(), 16, 8, allgather_ms=0.05, cross_node_ms=0.5)
    assert max(x["T"] for x in far) == 8 and all(x["P"] >= 2 for x in far)
    for a, b in zip(near, far):
        assert b["spans_nodes"] and b["allgather_ms"] - a["allgather_ms"] == pytest.approx(0.45)
        assert b["tok_s"] <= a["tok_s"]


def test_the_cli_writes_the_projection(tmp_path, capsys):
    layouts.main(["--gpus", "8", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "layouts.json").read_text())
    assert doc["label"] == layouts.LABEL and (tmp_path / "layouts.png").exists()
    assert capsys.readouterr().out.startswith(f"**{layouts.LABEL}.**")
    assert [(x["T"], x["P"]) for x in doc["scenarios"][0]["layouts"]] == [(1, 8), (2, 4), (4, 2), (8, 1)]

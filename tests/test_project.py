"""The projections' inputs and `python -m tools.project` (LP replicas priced from one GPU's step
costs and a sweep's S): a bucket costs the median of every step timed in it, S is the sweep's row
on one replica and priced at the step size the cut shares leave on more, the arithmetic of a
row, the PROJECTION label in every output, one-line errors."""

from __future__ import annotations

import json
import math

import pytest

from lp.decode.ladder import ladder, rank_tokens
from lp.errors import LPError
from tools import pricing, project

# ms a step of that many tokens, as tools.steps writes them: causal blocks, then W=auto's ladder
CAUSAL = {1: 6.5, 16: 6.6, 32: 7.0, 64: 7.4, 120: 7.9, 128: 8.1, 256: 9.0, 512: 14.0}
LADDER_ROWS = {11: 6.8, 128: 7.7, 1024: 30.0}


def steps_result(graphs: bool = True) -> dict:
    rows = [{"kind": "causal", "tokens": t, "median_ms": ms} for t, ms in CAUSAL.items()]
    rows += [{"kind": "ladder", "tokens": t, "median_ms": ms} for t, ms in LADDER_ROWS.items()]
    about = {"arch": "llama-7b", "device_name": "Some GPU", "dtype": "bfloat16", "started": "then", "torch": "2.x"}
    return {"tool": "tools.steps", "graphs": graphs, "steps": rows, **about}


def sweep(rows: dict[str, tuple[int, float]]) -> dict:
    return {
        "label": "test",
        "prompts": 48,
        "date": "today",
        "model": "smollm2-135m",
        "dataset": "spec_bench",
        "rows": [
            {"decoder": "lp", "config": name, "step_tokens": T, "step_tokens_mean": T * 0.9, "S": S}
            for name, (T, S) in rows.items()
        ]
        + [{"decoder": "prompt-lookup", "config": "k10m2", "step_tokens": 11, "step_tokens_mean": 6.0, "S": 9.0}],
    }


LADDER_S = {s.name: (s.step_tokens, 1 + 0.3 * math.log2(s.step_tokens)) for s in ladder(1)}


@pytest.fixture
def inputs(tmp_path) -> tuple[str, str]:
    costs, swept = tmp_path / "steps.json", tmp_path / "sweep.json"
    costs.write_text(json.dumps(steps_result()))
    swept.write_text(json.dumps(sweep(LADDER_S)))
    return str(costs), str(swept)


def test_a_bucket_costs_the_median_of_every_step_timed_in_it(inputs):
    curve, about = pricing.bucket_costs(inputs[0])
    assert curve.padded and curve.tokens == (1, 16, 32, 64, 128, 256, 512, 1024)
    assert curve.seconds_at(128) == pytest.approx(7.9e-3)  # 120, 128 and the ladder's 128: 7.9, 8.1, 7.7
    assert curve.seconds_at(11) == pytest.approx(6.6e-3 / 2 + 6.8e-3 / 2)  # bucket 16: its causal and the ladder's 11
    assert curve.seconds_at(1000) == pytest.approx(30e-3) and about["rows_per_bucket"][1024] == 1
    assert pricing.unmeasured(curve, 700) and not pricing.unmeasured(curve, 1000)


def test_s_is_the_sweeps_on_one_replica_and_priced_on_more(inputs):
    S = pricing.SweepS(inputs[1], ancestors=3.0)
    top = ladder(8)[-1]
    assert S(ladder(1)[4], 1) == pytest.approx(LADDER_S[ladder(1)[4].name][1]) and S.measured(ladder(1)[4], 1)
    assert S.at(300) == pytest.approx(1 + 0.3 * math.log2(300))  # linear in log2 between rows (the prior's form)
    # 8 shares of 128 tokens hold the pending tokens (S) and 3 ancestors each, the window and the tree
    want = 8 * (rank_tokens(top, 8) - S.at(1024) - 3.0) + 1
    assert rank_tokens(top, 8) == 128 and S.tree_tokens(top, 8) == pytest.approx(want)
    assert S(top, 8) == pytest.approx(S.at(want)) and S(top, 8) < S(top, 1) and not S.measured(top, 8)
    assert S.tree_tokens(ladder(8)[2], 8) == ladder(8)[2].step_tokens  # a cap that cuts nothing


def test_every_replica_count_is_priced_at_its_shares_bucket(inputs, tmp_path):
    out = tmp_path / "out"
    assert project.main([f"costs={inputs[0]}", f"sweep={inputs[1]}", "gpus=8", "allgather_ms=0.05", f"out={out}"]) == 0
    r = json.loads((out / "project.json").read_text())
    curve, _ = pricing.bucket_costs(inputs[0])
    assert r["projection"] == project.LABEL and r["ar_tok_s"] == pytest.approx(1 / 6.5e-3)
    assert sorted({x["P"] for x in r["rows"]}) == list(range(1, 9)) and len(r["best"]) == 8
    for x in r["rows"]:
        gather = 0.05 if x["P"] > 1 else 0.0
        assert x["step_ms"] == pytest.approx(1e3 * curve.seconds_at(x["share_tokens"]) + gather)
        assert x["tok_s"] == pytest.approx(x["S"] / x["step_ms"] * 1e3)
        assert x["vs_ar"] == pytest.approx(x["tok_s"] / r["ar_tok_s"])
    best = {x["P"]: x for x in r["rows"] if x["config"] == r["best"][x["P"] - 1]}
    assert best[8]["share_tokens"] <= 128 and all(x["vs_one_gpu"] == pytest.approx(1.0) for x in [best[1]])
    md = (out / "project.md").read_text()
    assert md.splitlines()[0] == f"**{project.LABEL}.**" and "Some GPU" in md and (out / "project.png").exists()


def test_the_committed_inputs_fill_128_token_buckets_on_8_gpus():
    """On the H100 costs and the 48-prompt sweep, 8 replicas split the 1,024-token step into
    shares of 128 tokens (a measured bucket), and the projection says so."""
    r = project.run(project.Settings())
    eight = next(x for x in r["rows"] if x["P"] == 8 and x["config"] == r["best"][7])
    assert eight["step_tokens"] == 1024 and eight["share_tokens"] == 128 and eight["bucket_measured"]


@pytest.mark.parametrize(
    "arg,says",
    [
        ("gpus=0", "gpus must be >= 1"),
        ("allgather_ms=-1", "must be >= 0"),
        ("costs=/nonexistent.json", "costs: cannot read"),
        ("nokey=1", "expected key=value"),
    ],
)
def test_errors_are_one_line(arg, says, capsys):
    with pytest.raises(SystemExit) as e:
        project.main([arg])
    text = capsys.readouterr().err.strip().splitlines()[-1] if e.value.code == 2 else str(e.value.code)
    assert says in text and "\n" not in text


def test_costs_without_fixed_shapes_are_refused(tmp_path):
    path = tmp_path / "eager.json"
    path.write_text(json.dumps(steps_result(graphs=False)))
    with pytest.raises(LPError, match="fixed-shape steps"):
        pricing.bucket_costs(path)


def test_help_lists_every_key(capsys):
    with pytest.raises(SystemExit):
        project.main(["--help"])
    text = capsys.readouterr().out
    assert "PROJECTED" in text and all(f"  {key} " in text for key in project.HELP)

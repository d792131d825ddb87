"""`python -m tools.project`: a recorded decode's steps split over P ranks exactly as the
decoder splits them, the projection's arithmetic (slowest rank + all-gather) with an injected
cost, the PROJECTION label in every output, and one-line errors."""

from __future__ import annotations

import json
import math

import pytest

from lp import LP
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from tools import project
from tools.project import AR_LAYOUT, Recording, Shape, parse_configs, rank_layouts, record

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [20, 30, 40, 20, 30, 40, 20]]
SHAPES = [Shape(1, 3, 3, 4), Shape(2, 3, 3, 4), Shape(3, 4, 4, 3)]


class _Layouts(project._Recorder):
    """Records like the tool, and keeps the layout the decoder planned (world size 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.layouts, self.trees = [], []

    def planned(self, step, position) -> None:
        super().planned(step, position)
        self.layouts.append(step.layout)
        self.trees.append(step.tree)


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return LP(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="module")
def recordings(lm) -> list[Recording]:
    return [record(lm, PROMPTS, shape, 16) for shape in SHAPES]


def test_recording_is_the_decode(lm, recordings):
    for rec in recordings:
        results = [lm.generate(ids, W=rec.shape.W, N=rec.shape.N, G=rec.shape.G, max_new_tokens=16) for ids in PROMPTS]
        assert rec.new_tokens == sum(r.new_tokens for r in results) and rec.prompts == 2
        assert len(rec.steps) == sum(r.steps for r in results)
        assert math.isclose(rec.S, rec.new_tokens / len(rec.steps))
        first = rec.steps[0]
        assert first.m == 1 and first.length == len(PROMPTS[0]) - 1  # the prompt less x0 is committed
        # each step's m: the last step's commit, which P > 1 ranks re-feed (one replica keeps its KV)
        assert [s.m for s in rec.steps] == [m for r in results for m in [1, *r.accepted_per_step[:-1]]]
    assert any(s.parents for rec in recordings for s in rec.steps), "no step verified a draft: a weak test"


def test_one_rank_replays_the_planned_layout(lm):
    watch = _Layouts()
    W, N, G = 3, 3, 4
    for ids in PROMPTS:
        lm.generate(ids, observer=watch, W=W, N=N, G=G, max_new_tokens=16)
    for step, planned in zip(watch.steps, watch.layouts, strict=True):
        (mine,) = rank_layouts(step, Shape(1, W, N, G))
        assert mine.tokens == planned.tokens and mine.size == planned.size and mine.m == planned.m


@pytest.mark.parametrize("P", [2, 3])
def test_every_rank_replays_what_the_decoder_would_plan(lm, P):
    """At P ranks, each rank's replayed layout is the one lp.decode.plan.plan_step gives that rank
    for the same step (the real tree, a window of the right shape: ids do not matter)."""
    from lp.decode.plan import Split, plan_step
    from lp.lookahead.window import JacobiWindow

    watch = _Layouts()
    W, N, G = 4, 4, 3
    for ids in PROMPTS:
        lm.generate(ids, observer=watch, W=W, N=N, G=G, max_new_tokens=16)
    window = JacobiWindow(W, N, PROMPTS[0], 0)
    for step, tree in zip(watch.steps, watch.trees, strict=True):
        replayed = rank_layouts(step, Shape(P, W, N, G))
        planned = [plan_step([0] * step.m, window.rows, tree, Split(W, N, P, r)).layout for r in range(P)]
        assert [(a.tokens, a.tree) for a in replayed] == [(b.tokens, b.tree) for b in planned]


def test_ranks_cover_the_step_exactly_once(recordings):
    for rec in recordings:
        W, N, P = rec.shape.W, rec.shape.N, rec.shape.P
        for s in rec.steps:
            layouts = rank_layouts(s, rec.shape)
            assert len(layouts) == P and all(lay.m == s.pending(P)[0] for lay in layouts)
            columns = [j for lay in layouts for j in lay.columns]
            assert columns == list(range(W))  # every column on one rank, in order
            top = [tok for lay in layouts for tok in lay.tokens if tok[0] == "w" and tok[1] == N - 2]
            assert len(top) == W and len(set(top)) == W  # each column's last level fed once
            parents, offset = [], 0  # the ranks' subtrees, put back together, are the step's tree
            for lay in layouts:
                parents += [p + offset if p >= 0 else -1 for p in lay.tree]
                offset += len(lay.tree)
            assert tuple(parents) == s.parents
            assert sum(tok[0] == "g" for lay in layouts for tok in lay.tokens) == len(s.parents)


def test_projection_arithmetic(recordings):
    """With cost = layout size, a step costs its largest rank's size plus the all-gather."""
    cost = lambda layout, length: float(layout.size)  # noqa: E731
    for rec in recordings:
        gather = 0.0 if rec.shape.P == 1 else 0.5
        row = project.project(rec, cost, gather)
        step_s = [max(lay.size for lay in rank_layouts(s, rec.shape)) + gather for s in rec.steps]
        if rec.shape.P == 1:
            assert step_s == [rank_layouts(s, rec.shape)[0].size for s in rec.steps]
        assert math.isclose(row["tok_s"], rec.new_tokens / sum(step_s))
        assert math.isclose(row["step_ms_mean"], 1e3 * sum(step_s) / len(step_s))
        assert math.isclose(row["slowest_rank_share"], (sum(step_s) - gather * len(step_s)) / sum(step_s))
        assert row["ar_tok_s"] == 1.0 and AR_LAYOUT.size == 1  # mode=ar: one 1-token step per token
        assert math.isclose(row["speedup_vs_ar"], row["tok_s"]) and row["S"] == rec.S
        assert row["allgather_ms"] == 1e3 * gather and (row["P"], row["W"]) == (rec.shape.P, rec.shape.W)


def test_worker_timer_replays_on_tiny(recordings):
    import torch

    from tools import steps

    model = steps.build("tiny", torch.device("cpu"), torch.float32)
    worker = steps.Settings(arch="tiny", device="cpu").validate().worker(model)
    worker.reset(64, 64)
    timer = project.worker_timer(worker, reps=2)
    rec = recordings[1]
    row = project.project(Recording(rec.shape, rec.steps[:4], 4, 1), timer, 0.0)
    assert row["steps"] == 4 and row["tok_s"] > 0 and row["ar_tok_s"] > 0
    assert worker.kv.length == rec.steps[3].length  # the cache was set to the recorded length


def test_cli_writes_the_projection(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": str(i), "prompt": " ".join(f"w{t}" for t in ids)}) for i, ids in enumerate(PROMPTS))
        + "\n"
    )
    out = tmp_path / "out"
    assert (
        project.main(
            [
                f"model={tiny_model_dir}",
                "dataset=jsonl",
                f"prompts={prompts}",
                "arch=tiny",
                "device=cpu",
                "configs=1:W3N3G4,2:W6N3G8",
                "max_new_tokens=8",
                "allgather_reps=0",
                f"out={out}",
            ]
        )
        == 0
    )
    md = (out / "project.md").read_text()
    assert md.splitlines()[0].startswith("**PROJECTION") and md in capsys.readouterr().out
    r = json.loads((out / "project.json").read_text())
    assert r["projection"] == project.PROJECTION and [w["P"] for w in r["rows"]] == [1, 2]
    assert not r["allgather"]["2"]["measured"] and r["rows"][1]["allgather_ms"] == 0
    assert (out / "project.png").stat().st_size > 0


MEASURED = {1: 6.5, 16: 6.6, 32: 7.0, 64: 7.4}  # ms a step of that many tokens, as tools.steps writes them


def steps_result(graphs: bool) -> dict:
    return {
        "tool": "tools.steps",
        "arch": "llama-7b",
        "device": "cuda",
        "device_name": "Some GPU",
        "dtype": "bfloat16",
        "graphs": graphs,
        "attention": "flex",
        "torch": "2.x",
        "started": "then",
        "steps": [{"kind": "causal", "tokens": t, "median_ms": ms} for t, ms in MEASURED.items()]
        + [{"kind": "ladder", "tokens": 30, "median_ms": 99.0}],
    }


def test_measured_costs_take_the_bucket_or_interpolate():
    fixed, eager = project.measured_timer(steps_result(True)), project.measured_timer(steps_result(False))
    sized = {T: step_layout(T, 0, 2, range(0), ()) for T in (1, 5, 16, 17, 40, 64, 65)}  # T pending tokens
    assert fixed(sized[1], 10) == 6.5e-3 and fixed(sized[5], 99) == fixed(sized[16], 0) == 6.6e-3
    assert fixed(sized[17], 0) == 7.0e-3 and fixed(sized[40], 0) == 7.4e-3
    assert eager(sized[5], 0) == pytest.approx((6.5 + (6.6 - 6.5) * 4 / 15) * 1e-3)
    assert eager(sized[40], 0) == pytest.approx(7.1e-3)
    for timer in (fixed, eager):
        with pytest.raises(LPError, match="needs a measured step of"):
            timer(sized[65], 0)  # bucket 128, or past the largest size measured
    gap = steps_result(True)
    gap["steps"] = [row for row in gap["steps"] if row["tokens"] != 32]
    with pytest.raises(LPError, match="needs a measured step of 32 tokens"):
        project.measured_timer(gap)(sized[17], 0)  # a bucket inside the measured range, never measured


def test_cli_projects_onto_measured_costs(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": str(i), "prompt": " ".join(f"w{t}" for t in ids)}) for i, ids in enumerate(PROMPTS))
        + "\n"
    )
    costs = tmp_path / "steps.json"
    costs.write_text(json.dumps(steps_result(True)))
    out = tmp_path / "out"
    assert (
        project.main(
            [
                f"model={tiny_model_dir}",
                "dataset=jsonl",
                f"prompts={prompts}",
                "device=cpu",
                "configs=1:W3N3G4,2:W6N3G8",
                "max_new_tokens=8",
                "allgather_reps=0",
                f"costs={costs}",
                f"out={out}",
            ]
        )
        == 0
    )
    r = json.loads((out / "project.json").read_text())
    assert r["projection"] == project.MEASURED_PROJECTION and r["device_name"] == "Some GPU"
    assert r["arch"] == "llama-7b" and r["forwards"].startswith("measured by tools.steps on then")
    for row in r["rows"]:
        assert row["ar_tok_s"] == pytest.approx(1e3 / MEASURED[1])
        # no all-gather: a step costs its slowest rank's bucket as measured (16 tokens or more)
        assert MEASURED[16] <= row["step_ms_mean"] <= MEASURED[64] and row["allgather_ms"] == 0
    assert "Some GPU" in (out / "project.md").read_text().splitlines()[2]
    bad = tmp_path / "bad.json"
    for doc, says in (({}, "is not a result of tools.steps"), ({"tool": "tools.steps"}, "lacks arch, device")):
        bad.write_text(json.dumps(doc))
        with pytest.raises(SystemExit) as e:
            project.main([f"costs={bad}", "configs=1:W3N3G4"])
        assert str(e.value.code).startswith(f"lp: error: costs: {bad} {says}")


@pytest.mark.parametrize("configs", ["1:W5N3", "1:W5N3G5,1:W10N3G10", "0:W5N3G5", "2:W5N1G5", ",", "x"])
def test_bad_configs_are_one_line(configs):
    with pytest.raises(LPError) as e:
        parse_configs(configs)
    assert "\n" not in str(e.value) and str(e.value).startswith("configs:")


@pytest.mark.parametrize(
    "arg,says",
    [
        ("arch=gpt9", "arch must be one of"),
        ("configs=2:W5", "configs:"),
        ("reps=0", "reps must be >= 1"),
        ("nokey=1", "expected key=value"),
    ],
)
def test_cli_errors_are_one_line(arg, says, capsys):
    with pytest.raises(SystemExit) as e:
        project.main([arg])
    if e.value.code == 2:  # argparse: usage, then its one error line
        text = capsys.readouterr().err.strip().splitlines()[-1]
    else:
        text = str(e.value.code)
        assert text.startswith("lp: error: ")
    assert says in text and "\n" not in text


def test_help_lists_every_key(capsys):
    with pytest.raises(SystemExit):
        project.main(["--help"])
    text = capsys.readouterr().out
    assert "PROJECTED" in text
    for key in project.HELP:
        assert f"  {key} " in text

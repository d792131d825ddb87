"""The budget sweep (`lp.bench.sweep`) and its Token Recycling baseline (lp/bench/recycling.py):
TR's output equals greedy, its template is the paper's, the default config ladder respects every
step size, a sweep on a tiny model writes the sweep file's keys, one without decoders computes the
references alone, and launch/sweep.sh joins its parallel parts into one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import build_tiny, make_prompt, peaked_llama, reference_greedy

from lp.bench import sweep
from lp.bench.recycling import Template, TokenRecycling
from lp.errors import LPError

ROOT = Path(__file__).resolve().parents[1]


def test_template_is_the_papers_80_nodes_parents_first():
    t = Template.from_paths()
    assert t.size == 80 and t.max_depth == 6
    assert [int((t.depth == d).sum()) for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]
    assert (t.parents < np.arange(t.size)).all()  # every node's parent precedes it
    assert (t.ranks < 8).all()
    # ancestors: a node, its parent's ancestors, nothing else
    for i in range(t.size):
        want = {i} | (set(np.flatnonzero(t.ancestors[t.parents[i]])) if t.parents[i] >= 0 else set())
        assert set(np.flatnonzero(t.ancestors[i])) == want


def test_template_fill_walks_the_successor_matrix():
    t = Template.from_paths(("0 1", "00 10"))
    successors = np.array([[1, 2], [3, 0], [0, 1], [2, 3]])
    assert t.fill(successors, root=0).tolist() == [1, 2, 3, 0]  # 0->1, 0->2, 1->3, 2->0


def test_template_accepts_the_longest_greedy_path():
    t = Template.from_paths(("0 1", "00 10"))
    tokens = np.array([5, 6, 7, 8])
    # the model follows root -> 6 -> 8 -> 9: node 1 then node 3
    assert t.accept(tokens, choice=np.array([0, 8, 0, 9]), root_choice=6).tolist() == [1, 3]
    assert t.accept(tokens, choice=np.array([0, 8, 0, 9]), root_choice=4).tolist() == []


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_token_recycling_equals_greedy(arch):
    model = build_tiny(arch, seed=2)
    d = TokenRecycling(model, [])
    for seed in range(3):  # one decoder: the matrix is kept across prompts (hot start)
        prompt = make_prompt(seed, length=6, repeats=2)
        out = d.generate(prompt, 30)
        assert out.output_ids == reference_greedy(model, prompt, 30)
        assert sum(out.accepted_per_step) == 30 and len(out.fed_per_step) == out.steps
        assert max(out.fed_per_step) <= d.max_step_tokens == 87
        assert out.steps < 30  # recycled drafts get accepted on a tiny random model


def test_token_recycling_stops_at_eos():
    model, prompt = peaked_llama()
    ref = reference_greedy(model, prompt, 20)
    eos = ref[7]
    out = TokenRecycling(model, [eos]).generate(prompt, 20)
    assert out.output_ids == reference_greedy(model, prompt, 20, eos=[eos])


def test_default_ladder_respects_each_size():
    s = sweep.SweepSettings()
    for size, config in s.ladder():
        assert sweep.step_tokens_of(config) <= size
    assert [n for n, _ in s.ladder()] == [11, 16, 32, 64, 128, 256, 512, 1024]


def test_ladder_rejects_a_config_larger_than_its_size():
    with pytest.raises(LPError, match="more than its size 64"):
        sweep.SweepSettings(sizes=[64], configs=["W4N5G15-B80"]).ladder()
    with pytest.raises(LPError, match="entries for"):
        sweep.SweepSettings(sizes=[32, 64], configs=["W2N4G15-B16"]).ladder()


def _prompts(tmp_path) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "a1", "category": "alpha", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
        {"id": "b1", "category": "beta", "prompt": "w10 w11 w12 w13 w14"},
    ]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return prompts


def test_sweep_writes_the_schema(tiny_model_dir, tmp_path):
    prompts = _prompts(tmp_path)
    settings = dict(
        model=str(tiny_model_dir),
        dataset="jsonl",
        prompts=str(prompts),
        per_category=None,
        max_new_tokens=10,
        sizes=[32, 64],
        out=str(tmp_path / "out"),
        progress=False,
    )
    res = sweep.run(settings)
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    for k in ("label", "command", "device", "date", "model", "dataset", "prompts", "max_new_tokens"):
        assert k in doc
    assert doc["prompts"] == 2 and doc["max_new_tokens"] == 10
    keys = {"decoder", "config", "step_tokens", "step_tokens_mean", "S", "S_by_category", "identical", "prompts"}
    assert [(r["decoder"], r["step_tokens"]) for r in doc["rows"]] == [
        ("lp", 32),
        ("lp", 64),
        ("prompt-lookup", 11),
        ("token-recycling", 87),
    ]
    for r in doc["rows"]:
        assert set(r) == keys
        assert r["identical"] == r["prompts"] == 2
        assert set(r["S_by_category"]) == {"alpha", "beta"}
        assert r["S"] >= 1 and r["step_tokens_mean"] <= r["step_tokens"]
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 0
    assert f"| lp | {sweep.LADDER[32]} | 32 |" in (tmp_path / "out" / "sweep.md").read_text()
    assert len(res["rows"]) == 2 * 4
    # resume: nothing left to do, the rows stay as they were
    again = sweep.run({**settings, "resume": True})
    assert again["rows"] == json.loads(json.dumps(res["rows"]))


def test_sweep_without_decoders_computes_the_references_alone(tiny_model_dir, tmp_path):
    settings = dict(model=str(tiny_model_dir), dataset="jsonl", prompts=str(_prompts(tmp_path)), per_category=None,
                    max_new_tokens=6, sizes=[], baselines=[], out=str(tmp_path / "out"), progress=False)  # fmt: skip
    assert sweep.run(settings)["rows"] == []
    refs = json.loads((tmp_path / "out" / "references.json").read_text())
    assert sorted(r["id"] for r in refs.values()) == ["a1", "b1"]
    assert all(len(r["output_ids"]) == 6 for r in refs.values())


def test_launch_sweep_joins_its_parallel_parts(tiny_model_dir, tmp_path):
    """launch/sweep.sh: one process per group and baseline, from the references given; one table."""
    out = tmp_path / "out"
    common = [f"model={tiny_model_dir}", "dataset=jsonl", f"prompts={_prompts(tmp_path)}", "per_category=null",
              "max_new_tokens=6", "threads=1"]  # fmt: skip
    sweep.run(dict(model=str(tiny_model_dir), dataset="jsonl", prompts=str(_prompts(tmp_path)), per_category=None,
                   max_new_tokens=6, sizes=[], baselines=[], out=str(out), progress=False))  # fmt: skip
    env = dict(os.environ, PYTHON=sys.executable, SIZE_GROUPS="32 64:W3N3G15-B48", BASELINES="token-recycling")
    run = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), str(out), *common], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert sorted(p.name for p in (out / "parts").iterdir()) == ["lp-32", "lp-64-W3N3G15-B48", "token-recycling"]
    doc = json.loads((out / "sweep.json").read_text())
    rows = [(r["decoder"], r["config"], r["step_tokens"], r["identical"], r["prompts"]) for r in doc["rows"]]
    assert rows == [
        ("lp", sweep.LADDER[32], 32, 2, 2),
        ("lp", "W3N3G15-B48", 64, 2, 2),
        ("token-recycling", "k8n80", 87, 2, 2),
    ]
    assert "decode=false" in doc["command"]


def test_token_recycling_builds_without_a_model_off_rank_0():
    """Under torchrun only rank 0 holds the baselines' model: the decoder is built empty elsewhere."""
    d = TokenRecycling(None, [2])
    assert d.successors.shape == (0, d.k) and d.max_step_tokens == 87


def test_references_are_written_whole(tmp_path):
    """`put` replaces the file whole (a part stopped mid-write keeps the last file) and leaves no temporary."""
    from lp.bench.references import References

    References(tmp_path / "refs.json").put([1, 2], 3, [4, 5, 6], id="a")
    assert References(tmp_path / "refs.json").get([1, 2], 3) == [4, 5, 6]
    assert [p.name for p in tmp_path.iterdir()] == ["refs.json"]

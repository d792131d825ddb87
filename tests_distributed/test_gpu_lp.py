"""Lookahead Parallelism on CUDA (skipped without a GPU): 2 and 4 ranks on the GPUs there are
(one GPU: ranks share it, the all-gather goes over gloo, host-staged) decode the real model in
fp32 exactly as one rank and as transformers' greedy decoding."""

from __future__ import annotations

import pytest
from _cases import completed
from _launch import run_api_worker
from helpers import REAL_MODEL, load, reference_greedy, spec_bench_questions

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("world_size", [2, 4])
def test_lp_on_cuda_equals_one_rank_and_greedy(world_size, tmp_path):
    if not (REAL_MODEL / "config.json").exists():
        pytest.skip(f"needs {REAL_MODEL} (python -m lp.models fetch smollm2-135m)")
    tasks = [
        {
            "id": f"q{i}",
            "model": "smollm2",
            "prompt": q,
            "chat": True,
            "settings": {"N": 5, "W": 15, "G": 15, "max_new_tokens": 48},
        }
        for i, q in enumerate(spec_bench_questions(2))
    ]
    runs = {}
    for P in (1, world_size):
        spec = {"models": {"smollm2": str(REAL_MODEL)}, "device": "cuda", "timeout_s": 120, "tasks": tasks}
        runs[P] = completed(*run_api_worker(spec, P, timeout=600, tmp=tmp_path / f"p{P}"), P)
    model = load(REAL_MODEL).to("cuda")
    for t in tasks:
        one = runs[1][0]["results"][t["id"]]
        want = reference_greedy(model, one["prompt_ids"], 48)
        got = [doc["results"][t["id"]]["output_ids"] for doc in runs[world_size]]
        assert one["output_ids"] == want, t["id"]
        assert got == [one["output_ids"]] * world_size, t["id"]

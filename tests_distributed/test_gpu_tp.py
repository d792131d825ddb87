"""Tensor parallelism on CUDA (skipped without a GPU).

One GPU: 3 ranks share it as one tensor-parallel replica of SmolLM2-135M (tp=3: 9 heads, 3 KV
heads, intermediate 1536), its all-reduces over gloo (so eager steps, no CUDA graphs), and decode
exactly as transformers' greedy decoding on the GPU. Two GPUs or more: NCCL, the compiled and
captured fixed-shape steps with the all-reduces inside their graphs, tiny models at tp=2."""

from __future__ import annotations

import pytest
from _cases import MAX_NEW, PROMPTS, completed
from _launch import run_api_worker
from helpers import REAL_MODEL, spec_bench_questions

pytestmark = pytest.mark.cuda


def test_tp3_ranks_sharing_one_gpu_equal_greedy(tmp_path):
    if not (REAL_MODEL / "config.json").exists():
        pytest.skip(f"needs {REAL_MODEL} (python -m lp.models fetch smollm2-135m)")
    import torch
    from transformers import AutoModelForCausalLM

    settings = {"N": 5, "W": 15, "G": 15, "max_new_tokens": 48}
    tasks = [
        {"id": f"q{i}", "model": "smollm2", "prompt": q, "chat": True, "settings": settings}
        for i, q in enumerate(spec_bench_questions(2))
    ]
    spec = {"models": {"smollm2": str(REAL_MODEL)}, "device": "cuda", "timeout_s": 120, "tp": 3, "tasks": tasks}
    docs = completed(*run_api_worker(spec, 3, timeout=600, tmp=tmp_path), 3)
    model = AutoModelForCausalLM.from_pretrained(REAL_MODEL, dtype=torch.float32).to("cuda").eval()
    for t in tasks:
        first = docs[0]["results"][t["id"]]
        ids = torch.tensor([first["prompt_ids"]], device="cuda")
        want = model.generate(ids, do_sample=False, max_new_tokens=48)[0, ids.shape[1] :].tolist()
        assert [d["results"][t["id"]]["output_ids"] for d in docs] == [want] * 3, t["id"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp2_over_nccl_equals_greedy(world_size, tiny_models, references, tmp_path):
    import torch

    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs for NCCL (one per rank), {torch.cuda.device_count()} visible")
    tasks = [
        {"id": f"{arch}/{mode}", "model": arch, "prompt": PROMPTS[0], "settings": s}
        for arch in ("llama", "qwen2")
        for mode, s in (("la", {"N": 3, "W": 5, "G": 5}), ("ar", {"mode": "ar"}))
    ]
    for t in tasks:
        t["settings"]["max_new_tokens"] = MAX_NEW
    spec = {
        "models": {a: str(tiny_models[a]) for a in ("llama", "qwen2")},
        "device": "cuda",
        "timeout_s": 120,
        "tp": 2,
        "tasks": tasks,
    }
    docs = completed(*run_api_worker(spec, world_size, timeout=600, tmp=tmp_path), world_size)
    for t in tasks:
        for d in docs:
            assert d["results"][t["id"]]["output_ids"] == references[t["model"], 0], (t["id"], d["rank"])

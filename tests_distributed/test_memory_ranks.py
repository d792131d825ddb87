"""The draft memory (lp/lookahead/memory.py) under Lookahead Parallelism on gloo ranks: every rank
feeds it the same texts in the same order, so the ranks' memories stay identical; decodes that
draw on it stay greedy and take fewer steps; it is saved by rank 0 at close and loaded at start;
ranks that load different memories, or cannot read their file, refuse to start."""

from __future__ import annotations

import pytest
from _cases import COLLECTIVE_TIMEOUT_S, MAX_NEW, PROMPTS
from _launch import run_api_worker

ITEMS = [(0, {"W": 5, "N": 3, "G": 5}), (1, {"W": 3, "N": 3, "G": 15, "step_tokens": 64}), (2, {"mode": "ar"})]


def _spec(tiny_models, **more) -> dict:
    items = [{"prompt": PROMPTS[p], "max_new_tokens": MAX_NEW, **s} for p, s in ITEMS]
    tasks = [{"id": f"round{i}", "model": "llama", "prompts": items, "batch": 2} for i in (1, 2)]
    return {"models": {"llama": str(tiny_models["llama"])}, "timeout_s": COLLECTIVE_TIMEOUT_S, "tasks": tasks, **more}


@pytest.fixture(scope="module")
def saved(tiny_models, tmp_path_factory):
    """Two rounds of the prompts on 2 ranks, the memory saved to a file at close."""
    tmp = tmp_path_factory.mktemp("memory_p2")
    path = tmp / "memory.lp"
    launch, docs = run_api_worker(
        _spec(tiny_models, lp={"draft_memory_file": str(path)}), 2, timeout=240, tmp=tmp / "run"
    )
    return launch, docs, path


def test_ranks_hold_the_same_memory_and_decode_greedy_with_it(saved, references):
    launch, docs, path = saved
    assert launch.returncode == 0, launch.describe()
    expected = [references["llama", p] for p, _ in ITEMS]
    first, second = ([doc["results"][f"round{i}"] for doc in docs] for i in (1, 2))
    for res in (*first, *second):
        assert [b["output_ids"] for b in res["batch"]] == expected
    assert first[0]["memory"] == first[1]["memory"] and second[0]["memory"] == second[1]["memory"]
    assert second[0]["memory"][1] > first[0]["memory"][1] > 0
    # the second round drafts from the first's texts: the same outputs, in fewer steps
    assert sum(b["steps"] for b in second[0]["batch"]) < sum(b["steps"] for b in first[0]["batch"])
    assert path.exists()


def test_loaded_memory_is_the_saved_one_on_every_rank(saved, tiny_models, tmp_path):
    _, docs, path = saved
    launch, loaded = run_api_worker(
        _spec(tiny_models, lp={"draft_memory_file": str(path)}), 2, timeout=240, tmp=tmp_path
    )
    assert launch.returncode == 0, launch.describe()
    fresh = sum(b["steps"] for b in docs[0]["results"]["round1"]["batch"])
    # loaded, the memory holds the saved rounds' texts: the first round drafts from them at once
    assert sum(b["steps"] for b in loaded[0]["results"]["round1"]["batch"]) < fresh
    assert loaded[0]["results"]["round1"]["memory"] == loaded[1]["results"]["round1"]["memory"]


def test_ranks_with_different_memories_refuse_to_start(saved, tiny_models, tmp_path):
    _, _, path = saved
    spec = _spec(tiny_models, lp_per_rank={"0": {"draft_memory_file": str(path)}})
    launch, docs = run_api_worker(spec, 2, timeout=240, tmp=tmp_path)
    assert launch.returncode != 0
    for doc in docs:
        assert "different draft memories" in doc.get("crash", ""), doc.get("crash")


def test_a_rank_that_cannot_read_its_file_fails_every_rank_at_once(tiny_models, tmp_path):
    """Rank 1's file is garbage: it says why, rank 0 says which rank, neither waits for a timeout."""
    garbage = tmp_path / "garbage.lp"
    garbage.write_bytes(b"not a memory")
    spec = _spec(tiny_models, lp_per_rank={"1": {"draft_memory_file": str(garbage)}})
    launch, docs = run_api_worker(spec, 2, timeout=240, tmp=tmp_path / "run")
    assert launch.returncode != 0
    crashes = [doc.get("crash", "") for doc in docs]
    assert "rank(s) [1] could not load draft_memory_file" in crashes[0], crashes
    assert "not a draft memory" in crashes[1], crashes

"""Many sequences decoded together under Lookahead Parallelism (lp/decode/batch.py) on 1-3 gloo
ranks: prompts of mixed lengths and shapes (a one-token prompt, plain decoding, lookahead with and
without verification, W=auto's budget-cut trees), three at a time, each joining as another ends.
Every output equals transformers' greedy decoding and the same on every rank; the step's one
all-gather carries every sequence's message. Under a budget of no node, W=auto's sequences feed
their pending tokens alone (no window) on every rank: still greedy, one token a step."""

from __future__ import annotations

import pytest
from _cases import COLLECTIVE_TIMEOUT_S, MAX_NEW, PROMPTS
from _launch import run_api_worker

ITEMS = [
    (0, {"W": 5, "N": 3, "G": 5}),
    (1, {"mode": "ar"}),
    (2, {"W": 7, "N": 5, "G": 7}),
    (0, {"W": 3, "N": 3, "G": 0}),
    (1, {"W": "auto", "N": "auto", "G": "auto"}),
    (0, {"W": 5, "N": 3, "G": 5, "tree": False}),
    (1, {"W": 3, "N": 3, "G": 15, "step_tokens": 64}),
]


def _spec(tiny_models, **more) -> dict:
    items = [{"prompt": PROMPTS[p], "max_new_tokens": MAX_NEW, **s} for p, s in ITEMS]
    return {
        "models": {"llama": str(tiny_models["llama"])},
        "timeout_s": COLLECTIVE_TIMEOUT_S,
        "tasks": [{"id": "batch", "model": "llama", "prompts": items, "batch": 3}],
        **more,
    }


@pytest.fixture(scope="module")
def batch_runs(tiny_models, tmp_path_factory):
    runs = {}
    for P in (1, 2, 3):
        runs[P] = run_api_worker(_spec(tiny_models), P, timeout=240, tmp=tmp_path_factory.mktemp(f"batch_p{P}"))
    return runs


@pytest.mark.parametrize("P", [1, 2, 3])
def test_a_batch_on_several_ranks_is_greedy_on_every_rank(P, batch_runs, references):
    launch, docs = batch_runs[P]
    assert launch.returncode == 0, launch.describe()
    results = [doc["results"]["batch"] for doc in docs]
    for r, res in enumerate(results):
        assert "error" not in res, (r, res.get("error"))
        outputs = [b["output_ids"] for b in res["batch"]]
        assert outputs == [references["llama", p] for p, _ in ITEMS], r
    assert all(res["batch"] == results[0]["batch"] for res in results)  # the same steps on every rank
    calls = results[0]["calls"]
    gathers = sum(c["name"].startswith("all_gather") for c in calls)
    steps = [b["steps"] for b in results[0]["batch"]]
    if P > 1:  # one handshake a sequence, then one all-gather a step for all the sequences in it
        assert max(steps) + len(ITEMS) <= gathers < sum(steps) + len(ITEMS) + 16, (gathers, steps)


def test_no_node_no_window_on_two_ranks(tiny_models, references, tmp_path):
    launch, docs = run_api_worker(_spec(tiny_models, budget="none"), 2, timeout=240, tmp=tmp_path)
    assert launch.returncode == 0, launch.describe()
    for doc in docs:
        res = doc["results"]["batch"]
        assert "error" not in res, res.get("error")
        assert [b["output_ids"] for b in res["batch"]] == [references["llama", p] for p, _ in ITEMS]
        auto = res["batch"][4]  # W=auto: its tree the budget's, which gives none
        assert auto["steps"] == len(auto["output_ids"]) and set(auto["accepted_per_step"]) == {1}
    assert docs[0]["results"]["batch"]["batch"] == docs[1]["results"]["batch"]["batch"]


def test_w_auto_learns_alike_on_every_rank(tiny_models, references, tmp_path):
    """W=auto's tuner learns each decode's S against its whole steps' sizes, alike on every rank
    (a rank's own share would teach each rank its own slope, and their budgets, plans and
    messages would part): a decode teaches it, then a batch of W=auto sequences decodes on what
    it learned, greedy and alike on both ranks."""
    auto = {"W": "auto", "N": "auto", "G": "auto"}
    teach = {"id": "teach", "model": "llama", "prompt": PROMPTS[0], "slope": True}
    teach["settings"] = {"W": "auto", "N": 3, "G": "auto", "max_new_tokens": MAX_NEW}  # a shape, never plain
    prompts = [{"prompt": PROMPTS[p], "max_new_tokens": MAX_NEW, **auto} for p in (0, 1, 2, 1)]
    batch = {"id": "batch", "model": "llama", "prompts": prompts, "batch": 3, "slope": True}
    spec = {**_spec(tiny_models), "tasks": [teach, batch]}
    launch, docs = run_api_worker(spec, 2, timeout=240, tmp=tmp_path)
    assert launch.returncode == 0, launch.describe()
    first, second = (doc["results"] for doc in docs)
    assert first["teach"]["learned"] == 1 and first["teach"]["slope"] == second["teach"]["slope"]
    assert first["batch"]["slope"] == second["batch"]["slope"]
    assert first["teach"]["output_ids"] == references["llama", 0]
    assert [b["output_ids"] for b in first["batch"]["batch"]] == [references["llama", p] for p in (0, 1, 2, 1)]
    assert first["batch"]["batch"] == second["batch"]["batch"]

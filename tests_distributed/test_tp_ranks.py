"""Tensor parallelism on real gloo ranks (tp=2): one replica of 2 ranks and 2 replicas of 2.

Greedy outputs equal transformers' `generate(do_sample=False)` and lp's own `mode=ar` at the same
tp, on every rank; the sharded forward's logits equal the whole model's within fp32 rounding;
the LP all-gather runs between replicas only (one per step, none with one replica); a rank that
dies mid-decode fails the others within the collective timeout."""

from __future__ import annotations

import json

import pytest
from _cases import EOS_MODEL, MAX_NEW, PROMPTS, completed
from _launch import run_api_worker, spawn_ranks
from test_errors import FAULT_TIMEOUT_S, HARD_LIMIT_S, SLACK_S, _fault_args, _fault_env

TP = 2
CONFIGS = ((2, 5, 5), (3, 3, 3), (5, 7, 0))
ARCHS = ("llama", "qwen2", "mistral")
MISMATCH = {"model": "llama", "prompt": PROMPTS[0], "settings": {"N": 3, "W": 3, "G": 3, "max_new_tokens": 8}}


def _cases() -> list[tuple[str, str, int, dict]]:
    out = []
    for i, arch in enumerate(ARCHS):
        p = i % 2
        for N, W, G in CONFIGS:
            out.append((f"{arch}/p{p}/N{N}W{W}G{G}", arch, p, {"N": N, "W": W, "G": G, "max_new_tokens": MAX_NEW}))
        out.append((f"{arch}/p{p}/ar", arch, p, {"mode": "ar", "max_new_tokens": MAX_NEW}))
    out.append((f"{EOS_MODEL}/p0/N2W5G5", EOS_MODEL, 0, {"N": 2, "W": 5, "G": 5, "max_new_tokens": MAX_NEW}))
    return out


@pytest.fixture(scope="module")
def tp_run(tiny_models, tmp_path_factory):
    """`tp_run(world_size)`: every case at tp=2 on that many ranks (launched once per size)."""
    cache: dict[int, tuple] = {}

    def get(world_size: int):
        if world_size not in cache:
            spec = {
                "models": {k: str(v) for k, v in tiny_models.items()},
                "timeout_s": 60,
                "tp": TP,
                "tasks": [{"id": c, "model": a, "prompt": PROMPTS[p], "settings": s} for c, a, p, s in _cases()]
                + [
                    dict(MISMATCH, id="mismatch", per_rank={"1": {"prompt": PROMPTS[1]}}),
                    dict(MISMATCH, id="recovered"),
                ],
            }
            tmp = tmp_path_factory.mktemp(f"tp{TP}_ws{world_size}")
            cache[world_size] = run_api_worker(spec, world_size, timeout=240, tmp=tmp)
        return cache[world_size]

    return get


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_output_equals_transformers_and_ar(world_size, tp_run, references):
    docs = completed(*tp_run(world_size), world_size)
    for cid, arch, p, _ in _cases():
        ar = f"{arch}/p{p}/ar"
        for doc in docs:
            res = doc["results"][cid]
            assert "error" not in res, f"{cid} rank {doc['rank']}: {res['error']}"
            assert res["tp"] == TP and res["world_size"] == world_size
            assert res["output_ids"] == references[arch, p], f"{cid} rank {doc['rank']} differs from transformers"
            if ar in doc["results"]:
                assert res["output_ids"] == doc["results"][ar]["output_ids"], f"{cid} differs from mode=ar"
            assert res["steps"] == docs[0]["results"][cid]["steps"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_gather_runs_between_replicas_only(world_size, tp_run):
    """One all-gather per step plus the handshake with 2 replicas, none with one, and one check
    of every rank's sequence per sequence; no other collective through torch.distributed's API
    (the layers' all-reduces are functional collectives, checked by the sharded-logits test)."""
    docs = completed(*tp_run(world_size), world_size)
    replicas = world_size // TP
    for doc in docs:
        for cid, *_ in _cases():
            res = doc["results"][cid]
            gathers = [c for c in res["calls"] if "all_gather" in c["name"]]
            expected = 1 + (res["steps"] + 1 if replicas > 1 else 0)
            assert len(gathers) == expected, (cid, len(gathers), res["steps"])
            assert not [c for c in res["calls"] if "all_gather" not in c["name"]], res["calls"][:3]


def test_sharded_logits_equal_whole_model(tiny_models, tmp_path):
    run = spawn_ranks(
        ["tests_distributed/_tp_logits_rank.py", str(tiny_models["qwen2"]), str(tmp_path)], TP, timeout=120
    )
    assert run.returncode == 0, run.describe()
    for r in range(TP):
        doc = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert doc["rows"] > 5 and doc["kv_heads"] == 1
        assert doc["max_abs_diff"] <= 1e-5 * max(1.0, doc["scale"]), doc
        assert {name for _, name in doc["kernels"]} == {"linear"}, doc  # the group's summed timings


def test_dead_rank_of_a_group_fails_every_other_rank(tiny_text_model, tmp_path):
    """4 ranks, tp=2: rank 1 (replica 0) exits at its third step. Its partner fails in the
    all-reduce, the other replica's ranks in the next all-gather, each within the timeout, with
    one clear error line on rank 0."""
    mark = tmp_path / "died_at"
    args = _fault_args(tiny_text_model, TP)
    launch = spawn_ranks(args, 4, timeout=HARD_LIMIT_S, env=_fault_env("die", mark))
    assert mark.exists(), f"rank 1 never reached step 3:\n{launch.describe()}"
    died = float(mark.read_text())
    assert launch.ranks[1].returncode == 3, launch.describe()
    for r in (launch.ranks[0], launch.ranks[2], launch.ranks[3]):
        assert r.returncode not in (None, 0), launch.describe()
        assert r.exit_time - died < FAULT_TIMEOUT_S + SLACK_S, f"rank {r.rank} took {r.exit_time - died:.1f}s"
    errors = [line for line in launch.ranks[0].stderr.splitlines() if line.startswith("lp: error:")]
    assert len(errors) == 1 and "died or hung" in errors[0], launch.ranks[0].stderr[-2000:]
    assert "Traceback" not in launch.ranks[0].stderr


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_mismatch_inside_a_replica_raises(world_size, tp_run):
    """Rank 1 given another prompt than its partner rank 0: every rank refuses with one LPError
    (also the other replica's, which agree among themselves), and all decode again after it."""
    docs = completed(*tp_run(world_size), world_size)
    for doc in docs:
        res = doc["results"]["mismatch"]
        assert "error" in res and "rank mismatch" in res["error"]["message"], (doc["rank"], res)
    recovered = [doc["results"]["recovered"] for doc in docs]
    assert all("error" not in r and r["output_ids"] == recovered[0]["output_ids"] for r in recovered), recovered

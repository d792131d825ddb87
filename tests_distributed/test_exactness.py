"""Greedy LP output equals transformers `generate(do_sample=False)` at world sizes 1-4, on tiny
random Llama, Qwen2 and Mistral models, for (N, W, G) in {(2,5,5), (3,3,3), (5,7,7)} and the
same windows with G=0; every rank returns the same output and step count."""

from __future__ import annotations

import pytest
from _cases import CONFIGS, EOS_MODEL, MAX_NEW, WORLD_SIZES, cases, completed

from lp.config import DecodeConfig


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_output_equals_transformers_greedy(world_size, api_run, references):
    docs = completed(*api_run(world_size), world_size)
    wrong = []
    for cid, arch, p, _ in cases(world_size):
        want = references[arch, p]
        for doc in docs:
            res = doc["results"][cid]
            assert "error" not in res, f"{cid} rank {doc['rank']}: {res['error']}"
            if res["output_ids"] != want:
                first = next(
                    (i for i, (a, b) in enumerate(zip(res["output_ids"], want)) if a != b),
                    min(len(want), len(res["output_ids"])),
                )
                wrong.append(
                    f"{cid} rank {doc['rank']}: first difference at token {first}: "
                    f"lp {res['output_ids'][first : first + 5]} vs transformers {want[first : first + 5]}"
                )
    assert not wrong, f"{len(wrong)} outputs differ from transformers greedy:\n" + "\n".join(wrong)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_ranks_return_the_same_result(world_size, api_run):
    docs = completed(*api_run(world_size), world_size)
    for cid, *_ in cases(world_size):
        seen = [doc["results"][cid] for doc in docs]
        for key in ("output_ids", "steps", "accepted_per_step", "prompt_ids"):
            values = [res[key] for res in seen]
            assert all(v == values[0] for v in values), f"{cid}: ranks disagree on {key}: {values}"
        for res in seen:
            assert res["world_size"] == world_size
            assert sum(res["accepted_per_step"]) == res["new_tokens"] == len(res["output_ids"])
            assert len(res["accepted_per_step"]) == res["steps"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_drafts_are_accepted(world_size, api_run):
    """The cases really exercise verification: with G > 0 some step commits more than one token
    (so the multi-token merge path is what the exactness test checks), and the committed count
    per step never exceeds the longest draft plus one (N with pool drafts alone; text and
    recycled drafts run longer). Without verification (G=0, or mode=ar) a step commits exactly one."""
    docs = completed(*api_run(world_size), world_size)
    res = docs[0]["results"]
    for N, W, G in CONFIGS:
        ids = [cid for cid, *_ in cases(world_size) if cid.endswith(f"/N{N}W{W}G{G}")]
        per_step = [a for cid in ids for a in res[cid]["accepted_per_step"]]
        width = DecodeConfig(W=W, N=N, G=G).max_commit
        assert per_step and all(1 <= a <= width for a in per_step), (N, W, G, per_step)
        if G:
            assert max(per_step) > 1, f"(N,W,G)=({N},{W},{G}) at P={world_size}: no draft ever accepted"
        else:
            assert max(per_step) == 1, f"(N,W,G)=({N},{W},{G}): a step without verification committed >1 token"
    ar = [cid for cid, *_ in cases(world_size) if cid.endswith("/ar")]
    assert ar and all(set(res[cid]["accepted_per_step"]) == {1} for cid in ar)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_eos_stops_every_rank_at_the_same_token(world_size, api_run, references):
    """The EOS cases really stop early (so the exactness test covers dropping the tokens a step
    accepted after an EOS), and every rank stops there."""
    docs = completed(*api_run(world_size), world_size)
    eos_cases = [(cid, arch, p) for cid, arch, p, _ in cases(world_size) if arch == EOS_MODEL]
    assert eos_cases
    for cid, arch, p in eos_cases:
        want = references[arch, p]
        assert len(want) < MAX_NEW, "the EOS model did not stop early: fixture broken"
        for doc in docs:
            res = doc["results"][cid]
            assert res["output_ids"] == want and res["output_ids"][-1] == want[-1], (cid, doc["rank"])

"""Exactly one collective per step: during `generate` the only communication is one all-gather
per step plus one per-sequence handshake, each of a fixed-size integer tensor.

The worker wraps every torch.distributed collective and point-to-point entry point, and every
communication method of the ProcessGroup class, with counters before lp is imported."""

from __future__ import annotations

import pytest
from _cases import WORLD_SIZES, cases, completed

ALL_GATHERS = {"all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather"}
MUST_BE_WRAPPED = {
    "all_gather_single",
    "all_gather_into_tensor",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "all_reduce",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_one_all_gather_per_step(world_size, api_run):
    docs = completed(*api_run(world_size), world_size)
    for doc in docs:
        missing = MUST_BE_WRAPPED - set(doc["patched"]["api"])
        assert not missing, f"counting wrappers not installed for {sorted(missing)}"
        backend_counted = bool(doc["patched"]["process_group"])
        for cid, _, _, settings in cases(world_size):
            res = doc["results"][cid]
            where = f"{cid} on rank {doc['rank']} of {world_size}"
            steps, calls = res["steps"], res["calls"]
            if world_size == 1:
                assert calls == [] and res["pg_calls"] == [], f"{where}: world size 1 communicated: {calls}"
                continue
            names = [c["name"] for c in calls]
            assert set(names) <= ALL_GATHERS, (
                f"{where}: non-all-gather communication {sorted(set(names) - ALL_GATHERS)}"
            )
            assert len(calls) == steps + 1, (
                f"{where}: {len(calls)} collectives for {steps} steps (expected steps + 1 handshake)"
            )
            if backend_counted:
                assert len(res["pg_calls"]) == steps + 1, (
                    f"{where}: the process group ran {res['pg_calls'][:5]}... "
                    f"({len(res['pg_calls'])} ops) for {steps} steps"
                )
            for c in calls:
                assert "in_numel" in c, f"{where}: all-gather without a tensor input: {c}"
                assert not c["in_is_floating"] and "int" in c["in_dtype"], f"{where}: gathered a {c['in_dtype']} tensor"
                assert len(c["in_shape"]) == 1, f"{where}: gathered a tensor of shape {c['in_shape']}"
                assert c["out_numel"] == world_size * c["in_numel"], f"{where}: {c}"
            step_sizes = {(c["in_numel"], c["in_dtype"]) for c in calls[1:]}
            assert len(step_sizes) == 1, (
                f"{where}: per-step message size or dtype varies within the sequence: {step_sizes}"
            )
            if settings.get("mode") != "ar" and settings.get("G"):
                # the message may not depend on how many candidates a step verifies (G = 0 verifies
                # none, so its message has no room for drafts)
                same_window = [
                    c
                    for c, _, _, s in cases(world_size)
                    if s.get("W") == settings["W"] and s.get("N") == settings["N"] and s.get("G")
                ]
                sizes = {doc["results"][c]["calls"][1]["in_numel"] for c in same_window}
                assert len(sizes) == 1, f"{where}: message size depends on G: {sizes}"

"""`tp=auto` at run time: measure what these ranks can, price every mesh (T, P) of the world with
the cost model of lp/decode/mesh_cost.py, and load the fastest, the same on every rank.

A group size T divides the ranks, the ranks of a node (a group never spans nodes) and the model's
heads, KV heads and MLP width. Measured (a few calls, the slowest rank's): the step costs of the
largest such group, loaded as its shard (the least memory per rank, so it fits wherever any
mesh does) and calibrated as `W=auto` calibrates (lp/decode/auto.py); one all-reduce of a
hidden-state row inside that group; one all-gather over the world of the largest ladder shape's
message (the most a step sends). Modelled: one rank's
step at other T through the fitted unsplit share; the same all-reduce latency for every T;
lookahead's S from the prior of lp/decode/auto.py. Rank 0's choice is every rank's (one
all-gather), so no rank can build different process groups than the others and hang.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import torch

from lp import models
from lp.collective import Collective
from lp.decode.auto import PRIOR_SLOPE, CostCurve
from lp.decode.ladder import LADDER
from lp.decode.mesh_cost import PUBLISHED_SOURCE, choose, fit, group_sizes
from lp.engine.llama import FAMILY
from lp.engine.tp import TensorGroup
from lp.errors import LPError
from lp.message import step_message_size


class Replicas(Protocol):
    """What the choice reads of the loaded ranks (lp.frontend.runtime.LP): the world, this rank's
    tensor-parallel group and its model, and the step costs of the LP replicas' slowest rank."""

    comm: Collective
    tp: TensorGroup
    model: torch.nn.Module

    def calibrate(self) -> CostCurve: ...


def _config(name: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(models.resolve(name)).get_text_config()
    except OSError as e:
        raise LPError(f"cannot read the config of model '{name}': {str(e).splitlines()[0]}") from None


def _latency_ms(call: Callable[[], object], device: torch.device, reps: int = 10) -> float:
    """Median milliseconds of `call` (after two untimed calls), the device synced."""
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def choose_mesh(lm: Replicas, load: Callable[[int], None], model: str) -> tuple[str, CostCurve | None]:
    """Choose T for `lm`'s world and leave `lm` loaded at it (`load(T)`, which frees the model it
    replaces): the choice and why, and the step costs measured where they are those of the
    chosen mesh (W=auto reuses them)."""
    comm, cfg = lm.comm, _config(model)
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    world = comm.world_size
    node = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun's ranks per node: a group stays in one
    sizes = group_sizes(math.gcd(world, node), heads, kv, cfg.intermediate_size) if cfg.model_type in FAMILY else [1]
    if sizes == [1]:
        load(1)
        why = (
            f"no tp > 1 divides the {world} ranks ({node} a node) and the model's attention heads ({heads}), "
            f"KV heads ({kv}) and intermediate size ({cfg.intermediate_size})"
            if cfg.model_type in FAMILY
            else f"tensor parallelism needs a Llama-family model ({', '.join(FAMILY)}), not {cfg.model_type}"
        )
        return f"tp=1 x {world} replicas: {why}", None
    largest = sizes[-1]
    load(largest)
    curve = lm.calibrate()
    row = torch.zeros(cfg.hidden_size, dtype=lm.model.dtype, device=comm.device)
    message = torch.zeros(step_message_size(LADDER[-1].config), dtype=torch.long, device=comm.device)
    mine = [
        _latency_ms(lambda: lm.tp.all_reduce(row), comm.device),
        _latency_ms(lambda: comm.all_gather(message), comm.device),
    ]
    micros = torch.tensor([round(1e3 * x) for x in mine], dtype=torch.long, device=comm.device)
    allreduce_ms, allgather_ms = (x / 1e3 for x in comm.all_gather(micros).max(dim=0).values.tolist())
    group = replace(fit(layers=cfg.num_hidden_layers), lat_ms=allreduce_ms, hidden=cfg.hidden_size)

    def one_rank_s(n: float) -> float:
        return group.one_gpu_ms(1e3 * curve.seconds_at(n), largest, n) / 1e3

    best, priced = choose(world, sizes, one_rank_s, group, allgather_ms, curve.drafting)
    chosen = int(comm.all_gather(torch.tensor([best.T], device=comm.device))[0, 0])  # rank 0's, everywhere
    best = next(x for x in priced if x.T == chosen)
    if chosen != largest:
        load(chosen)
    others = "; ".join(x.describe() for x in priced if x is not best)
    why = (
        f"{best.describe()}, expected ahead of {others}. Measured at tp={largest}: a step "
        f"{1e3 * curve.seconds[0]:.2f} ms ({curve.tokens[0]} token) to {1e3 * curve.seconds[-1]:.2f} ms "
        f"({curve.tokens[-1]} tokens), drafts {1e3 * curve.drafting:.2f} ms more, "
        f"one all-reduce {allreduce_ms:.3f} ms, one all-gather {allgather_ms:.3f} ms; "
        f"modelled: unsplit share a = {group.a:.2f} (fitted to {PUBLISHED_SOURCE}), "
        f"S - 1 = {PRIOR_SLOPE} x log2(step tokens)"
    )
    return why, curve if chosen == largest else None


__all__ = ["Replicas", "choose_mesh"]

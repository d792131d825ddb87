"""Tensor parallelism for the benchmark's `tp` baseline, applied to a loaded model from outside
(as torchtitan's `parallelize` functions are): a Megatron-style plan for a Llama-like decoder
body, the check of which plan a model and world size allow, and the two ways to shard (torch
DTensor `parallelize_module`, or transformers' own `tp_plan="auto"` at load time)."""

from __future__ import annotations

import torch


def tp_plan(num_layers: int, shard_attention: bool) -> dict[str, str]:
    """Megatron-style plan for a Llama-like decoder body (keys relative to `model.model`):
    colwise q/k/v/gate/up, rowwise o/down (one all-reduce after attention and one after the
    MLP per layer). Without `shard_attention` only the MLP is sharded."""
    plan = {}
    for i in range(num_layers):
        if shard_attention:
            for p in ("q_proj", "k_proj", "v_proj"):
                plan[f"layers.{i}.self_attn.{p}"] = "colwise"
            plan[f"layers.{i}.self_attn.o_proj"] = "rowwise"
        for p in ("gate_proj", "up_proj"):
            plan[f"layers.{i}.mlp.{p}"] = "colwise"
        plan[f"layers.{i}.mlp.down_proj"] = "rowwise"
    return plan


def tp_support(config, world_size: int) -> tuple[str | None, str | None]:
    """(how, why-not) for tensor parallelism of this model over `world_size` ranks:
    how = "full" (attention heads and MLP sharded), "mlp-only" (heads do not divide), or None."""
    cfg = config.get_text_config()
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    inter = cfg.intermediate_size
    P = world_size
    if P == 1:
        return "full", None
    if heads % P == 0 and kv % P == 0 and inter % P == 0:
        return "full", None
    if inter % P == 0:
        return "mlp-only", (
            f"{heads} attention heads / {kv} kv heads are not divisible by {P} ranks: "
            f"attention replicated, only the MLP is sharded"
        )
    return None, f"neither heads ({heads}/{kv} kv) nor intermediate size ({inter}) divisible by {P} ranks"


def parallelize_tp(model: torch.nn.Module, world_size: int, shard_attention: bool) -> torch.nn.Module:
    """Shard `model`'s decoder body in place over `world_size` ranks with `tp_plan` (torch
    DTensor, on the device type of the model's weights); returns the model. Every rank must have
    loaded the same weights: each keeps its own shard, nothing is scattered from rank 0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(next(model.parameters()).device.type, (world_size,))
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    body = model.get_decoder()
    plan = {k: styles[v]() for k, v in tp_plan(len(body.layers), shard_attention).items()}
    parallelize_module(body, mesh, plan, src_data_rank=None)
    return model


def load_hf_tp(path: str, dtype: torch.dtype) -> torch.nn.Module:
    """The model at `path`, sharded by transformers' own plan (`DistributedConfig(tp_plan="auto")`,
    which needs the head counts divisible by the world size)."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", distributed_config=DistributedConfig(tp_plan="auto")
    )
    return model.eval()


__all__ = ["load_hf_tp", "parallelize_tp", "tp_plan", "tp_support"]

"""Tensor parallelism inside one LP replica: a group of T ranks shares one model, Megatron-style.

Each rank keeps 1/T of every decoder layer's attention heads and KV heads (column-parallel
q/k/v, row-parallel o) and 1/T of its MLP's intermediate features (column-parallel gate/up,
row-parallel down); the forward sums the row-parallel outputs with one all-reduce after the
attention and one after the MLP (lp/engine/llama.py). The embedding, the final norm, the
layer norms and lm_head stay whole on every rank: every rank then computes the same full
logits rows from the same all-reduced hidden states, and takes the same decisions without
another collective. The price is memory: those replicated tensors (for Llama-2-7B, 2 x 131M
parameters of 6.7B) are held T times.

A rank reads only its shard from the safetensors files (`safe_open(...).get_slice`), into a
model built on the meta device, so no rank ever holds the whole model.

The all-reduce is a functional collective, which torch.compile traces into its graph (as in
gpt-fast's tp.py), so the same forward runs compiled and captured under NCCL and eagerly under
gloo, where a failed all-reduce (a rank of the group died, or hung past the timeout) becomes
one LPError.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from lp.errors import LPError

# Parameter names (after `model.layers.I.`) split over the group, and the dimension split:
# 0 for column-parallel (output features), 1 for row-parallel (input features).
SPLIT = {
    "self_attn.q_proj.weight": 0,
    "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.weight": 0,
    "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.weight": 0,
    "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_proj.weight": 0,
    "mlp.gate_proj.bias": 0,
    "mlp.up_proj.weight": 0,
    "mlp.up_proj.bias": 0,
    "mlp.down_proj.weight": 1,
}
# Row-parallel biases are added once, after the sum: rank 0 of the group keeps them, the others none.
ROW_BIASES = ("self_attn.o_proj.bias", "mlp.down_proj.bias")


@dataclass(frozen=True)
class TensorGroup:
    """This rank's place in its tensor-parallel group, and the group's all-reduce.

    `group`: the process group of the T ranks (None for T = 1); `capturable`: whether its
    collectives can be captured in a CUDA graph (NCCL)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None
    capturable: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the group."""
        if self.size == 1:
            return x
        y = funcol.all_reduce(x, "sum", self.group)
        if torch.compiler.is_compiling():
            return y  # the compiled graph waits where the sum is used
        try:
            return y.wait()  # eagerly: a dead or hung peer surfaces here, not in a later op
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LPError(
                f"tensor-parallel rank {self.rank}: the all-reduce failed, another rank of its group died or hung "
                f"({first})"
            ) from e


ALONE = TensorGroup(0, 1)


def check_divisible(config, tp: int) -> None:
    """Refuse a model whose attention heads, KV heads or intermediate size `tp` does not divide."""
    cfg = config.get_text_config()
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    inter = cfg.intermediate_size
    if heads % tp or kv % tp or inter % tp:
        raise LPError(
            f"tp={tp} must divide the model's attention heads ({heads}), KV heads ({kv}) "
            f"and intermediate size ({inter})"
        )


def shard_of(name: str, shape: tuple[int, ...], tp: TensorGroup) -> tuple[int, int, int] | None:
    """(dim, start, stop) of rank `tp.rank`'s shard of parameter `name` of full `shape`; None
    when the rank keeps it whole. A row-parallel bias off rank 0 is (0, 0, 0): nothing."""
    suffix = name.split(".layers.", 1)[-1].split(".", 1)[-1] if ".layers." in name else ""
    if tp.size == 1:
        return None
    if suffix in ROW_BIASES:
        return None if tp.rank == 0 else (0, 0, 0)
    dim = SPLIT.get(suffix)
    if dim is None:
        return None
    part = shape[dim] // tp.size
    return dim, tp.rank * part, (tp.rank + 1) * part


def _index(dim: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(start, stop),)


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise LPError(f"tp needs the model's weights as safetensors files, none found in {path}")
    from safetensors import safe_open

    with safe_open(single, "pt") as f:
        return dict.fromkeys(f.keys(), single)


def _set(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    # torch's own way to put a tensor in a module's parameter slot (the model is lp's, built here)
    param = None if value.numel() == 0 and leaf == "bias" else torch.nn.Parameter(value, requires_grad=False)
    module.register_parameter(leaf, param)


def load_sharded(path: str | Path, dtype: torch.dtype, device: torch.device, tp: TensorGroup) -> torch.nn.Module:
    """The causal LM at `path` with only rank `tp.rank`'s shard of each split tensor, read from
    its safetensors files; the replicated tensors whole. Built on the meta device first, so
    nothing but the rank's tensors is ever allocated."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    check_divisible(config, tp.size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    files = _weight_files(path)
    params = dict(model.named_parameters())  # a tied lm_head is not listed: tied again below
    by_file: dict[Path, list[str]] = {}
    for name in params:
        if name in files:
            by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(file, "pt") as f:
            for name in names:
                piece = f.get_slice(name)
                cut = shard_of(name, tuple(params[name].shape), tp)
                value = piece[:] if cut is None else piece[_index(*cut)]
                _set(model, name, value.to(device=device, dtype=dtype))
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        model.lm_head.weight = model.get_input_embeddings().weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise LPError(f"the weights in {path} lack {', '.join(missing[:3])}")
    body = model.get_decoder()
    body.rotary_emb = type(body.rotary_emb)(config=config.get_text_config()).to(device)  # its tables, computed
    return model.eval()


def shard(model: torch.nn.Module, tp: TensorGroup) -> torch.nn.Module:
    """`model` (loaded whole) cut in place to rank `tp.rank`'s shard: what `load_sharded`
    reads from files, for a model built in memory."""
    check_divisible(model.config, tp.size)
    for name, param in list(model.named_parameters()):
        cut = shard_of(name, tuple(param.shape), tp)
        if cut is not None:
            _set(model, name, param.data[_index(*cut)].clone())
    return model


def held_bytes(model: torch.nn.Module, tp: TensorGroup) -> tuple[int, int]:
    """(sharded, replicated) bytes of weights this rank holds."""
    split = replicated = 0
    for name, p in model.named_parameters(remove_duplicate=True):
        size = p.numel() * p.element_size()
        if shard_of(name, tuple(p.shape), tp) is None:
            replicated += size
        else:
            split += size
    return split, replicated


def report(model: torch.nn.Module, tp: TensorGroup, rank: int) -> None:
    """One line on stderr (global rank 0) with what each rank holds."""
    if rank != 0:
        return
    split, whole = held_bytes(model, tp)
    mib = 2**20
    print(
        f"lp: tp={tp.size}: each rank holds {split / mib:.1f} MiB of sharded attention and MLP weights "
        f"(1/{tp.size} each) and {whole / mib:.1f} MiB replicated (embedding, lm_head, norms)",
        file=sys.stderr,
    )


__all__ = ["ALONE", "TensorGroup", "check_divisible", "held_bytes", "load_sharded", "report", "shard", "shard_of"]

"""Pipeline parallelism for the benchmark's `pp` baseline, applied to a loaded model from
outside (as torchtitan's pipeline splitting is): which models it supports, a balanced split of
the layers over the ranks, and a latency-oriented batch-1 pipeline (no micro-batching) that
decodes greedily through one rank's stage.

Per step, rank 0 embeds the input, each rank runs its layers and sends the hidden states to the
next with send/recv; the last rank picks the greedy token and broadcasts it to every rank.
Works with gloo (CPU) and NCCL. Supported: Llama, Mistral, Qwen2 (embed -> layers -> norm,
rotary embeddings on the base model; sequences shorter than any sliding window)."""

from __future__ import annotations

import time

import torch

PP_MODEL_TYPES = ("llama", "mistral", "qwen2")  # embed -> layers -> norm, rotary at model.model


def pp_support(config, world_size: int) -> str | None:
    """Why this model cannot be pipelined over `world_size` ranks (None: it can)."""
    cfg = config.get_text_config()
    if cfg.model_type not in PP_MODEL_TYPES:
        return f"pp: model type '{cfg.model_type}' not supported (only {', '.join(PP_MODEL_TYPES)})"
    if cfg.num_hidden_layers < world_size:
        return f"pp: {cfg.num_hidden_layers} layers cannot be split over {world_size} ranks"
    return None


def head_cost(config) -> float:
    """The final norm + LM head's cost in layer units: its matmul against one layer's
    (attention + MLP) weights."""
    cfg = config.get_text_config()
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    layer = (
        2 * cfg.hidden_size * cfg.num_attention_heads * hd
        + 2 * cfg.hidden_size * kv * hd
        + 3 * cfg.hidden_size * cfg.intermediate_size
    )
    return cfg.vocab_size * cfg.hidden_size / layer


def split_layers(num_layers: int, world_size: int, head_cost: float = 0.0) -> list[tuple[int, int]]:
    """Contiguous layer ranges [a_r, b_r) for P pipeline ranks, balancing per-rank cost where
    each layer costs 1 and the last rank also pays `head_cost` (final norm + LM head, in layer
    units). Every rank gets at least one layer."""
    P = world_size
    if P < 1 or num_layers < P:
        raise ValueError(f"cannot split {num_layers} layers over {P} ranks (each needs >= 1 layer)")
    total = num_layers + max(head_cost, 0.0)
    bounds = [0]
    for r in range(1, P):
        target = round(total * r / P)
        lo, hi = bounds[-1] + 1, num_layers - (P - r)  # leave >= 1 layer for each later rank
        bounds.append(min(max(target, lo), hi))
    bounds.append(num_layers)
    return [(bounds[r], bounds[r + 1]) for r in range(P)]


class PipelineStage:
    """This rank's stage of a model: layers [a, b) of `ranges[comm.rank]`, plus the embedding
    on the first rank and the final norm and LM head on the last. The stage takes those modules
    from `model` (a copy of the baseline's own, never lp's: its modules move to the rank's device,
    nothing is replaced); the rest of the model is the caller's to drop."""

    def __init__(self, model: torch.nn.Module, comm, ranges: list[tuple[int, int]]) -> None:
        """`comm`: the rank's lp.collective.Collective (rank, world size, device; its process
        group carries the send/recv)."""
        self.comm, self.dev = comm, comm.device
        self.config = model.config.get_text_config()
        P, rank = comm.world_size, comm.rank
        a, b = ranges[rank]
        body = model.get_decoder()
        self.first, self.last = rank == 0, rank == P - 1
        self.embed = body.embed_tokens.to(self.dev) if self.first else None
        self.layers = torch.nn.ModuleList(list(body.layers)[a:b]).to(self.dev)
        self.rotary = body.rotary_emb.to(self.dev)
        self.norm = body.norm.to(self.dev) if self.last else None
        self.head = model.get_output_embeddings().to(self.dev) if self.last else None  # a tied head keeps its weight
        self.dtype = next(model.parameters()).dtype
        self.hidden = self.config.hidden_size

    @torch.inference_mode()
    def decode(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], list[float]]:
        """Greedy tokens through the pipeline (all ranks call it alike), and the
        `time.perf_counter` at which each arrived on this rank (after the broadcast)."""
        import torch.distributed as dist
        from transformers import DynamicCache

        P, rank, dev = self.comm.world_size, self.comm.rank, self.dev
        cache = DynamicCache(config=self.config)
        L = len(prompt_ids)
        x = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dev)
        pos = torch.arange(L, device=dev)[None]
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        out: list[int] = []
        times: list[float] = []
        for i in range(max_new_tokens):
            T = pos.shape[1]
            if self.first:
                h = self.embed(x)
            else:
                h = torch.empty((1, T, self.hidden), dtype=self.dtype, device=dev)
                dist.recv(h, src=rank - 1)
            pe = self.rotary(h, position_ids=pos)
            for layer in self.layers:
                h = layer(
                    h,
                    attention_mask=None,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                    position_embeddings=pe,
                )
            if not self.last:
                dist.send(h.contiguous(), dst=rank + 1)
            else:
                tok = self.head(self.norm(h[:, -1])).argmax(dim=-1)
            if P > 1:
                dist.broadcast(tok, src=P - 1)
            t = int(tok.item())  # waits for the step on the device
            times.append(time.perf_counter())
            out.append(t)
            if t in eos_ids:
                break
            x = tok.view(1, 1)
            pos = torch.tensor([[L + i]], device=dev)
        return out, times


__all__ = ["PP_MODEL_TYPES", "PipelineStage", "head_cost", "pp_support", "split_layers"]

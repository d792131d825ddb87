"""The benchmark's baselines: transformers' greedy `generate` (eager or static cache), prompt
lookup decoding, and tensor and pipeline parallelism applied to the model from outside
(lp/bench/tp.py, lp/bench/pp.py). Each runs on its own copy of the model, never on lp's."""

from __future__ import annotations

import logging
import time

import torch

from lp.bench import pp, tp
from lp.bench.interface import BenchDecoder, Context, DecodeOutput, sync

log = logging.getLogger(__name__)


class _StepStream:
    """A transformers streamer that timestamps every step's tokens (the first `put` is the
    prompt and is not a step)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


class HFGenerate(BenchDecoder):
    """transformers `generate` (greedy, or prompt lookup when `prompt_lookup_num_tokens`)."""

    def __init__(
        self,
        model,
        eos_ids: list[int],
        pad_id: int | None,
        *,
        label: str,
        world_size: int = 1,
        local: bool = True,
        **generate_kwargs,
    ) -> None:
        super().__init__(label, world_size, dict(generate_kwargs))
        self.model = model
        self.local = local
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id if pad_id is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.kwargs = generate_kwargs

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        dev = self.device
        x = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dev)
        stream = _StepStream()
        fed: list[int] = []  # tokens per forward (prompt lookup: 1 + its draft)

        def count(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            fed.append(int(ids.shape[-1]) if ids is not None else 1)

        hook = self.model.register_forward_pre_hook(count, with_kwargs=True)
        sync(dev)
        t0 = time.perf_counter()
        try:
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_ids or None,
                pad_token_id=self.pad_id,
                streamer=stream,
                **self.kwargs,
            )
        finally:
            hook.remove()
        sync(dev)
        t_end = time.perf_counter()
        ids = out[0, x.shape[1] :].tolist()
        times, counts = stream.times, stream.counts
        if not times:  # nothing generated
            return DecodeOutput(ids, 0, t_end - t0, 0.0, accepted_per_step=[], fed_per_step=[], whole_per_step=[])
        if sum(counts) != len(ids):
            log.warning("%s: streamed %d tokens but generate returned %d", self.label, sum(counts), len(ids))
        # the first forward reads the whole prompt; count it as lp does: the prompt's last token
        # (lp's prefill, the prompt but its last token, is not a step)
        fed = [1] + fed[1 : len(times)]
        return DecodeOutput(
            ids,
            len(times),
            times[0] - t0,
            t_end - times[0],
            accepted_per_step=counts,
            fed_per_step=fed,
            whole_per_step=fed,
            step_latencies=[b - a for a, b in zip(times[:-1], times[1:])],
        )


def hf_greedy(model, eos_ids, pad_id, static: bool = False) -> HFGenerate:
    """Greedy `generate`; `static`: transformers' static KV cache, which it compiles on CUDA."""
    name = "hf-static" if static else "hf-greedy"
    d = HFGenerate(model, eos_ids, pad_id, label=name, **({"cache_implementation": "static"} if static else {}))
    d.name = name
    return d


def hf_prompt_lookup(model, eos_ids, pad_id, num_tokens: int = 10, max_ngram: int = 2) -> HFGenerate:
    d = HFGenerate(
        model,
        eos_ids,
        pad_id,
        label=f"hf-prompt-lookup[k{num_tokens}m{max_ngram}]",
        prompt_lookup_num_tokens=num_tokens,
        max_matching_ngram_size=max_ngram,
    )
    d.name = "hf-prompt-lookup"
    return d


# ----------------------------------------------------------------------------------- tensor parallel
class TensorParallel(HFGenerate):
    """Greedy `generate` on a tensor-parallel replica over all P ranks (lp/bench/tp.py).

    impl="dtensor" (default): torch `parallelize_module` with `tp_plan()`; when the head counts
    do not divide by P (SmolLM2-135M: 9 heads, 3 kv heads -> only P in {1, 3}) it falls back to
    sharding the MLP only, and says so in the output. impl="hf": transformers' own plan
    (`DistributedConfig(tp_plan="auto")`), which needs the head counts divisible by P, else the
    decoder is reported unsupported. With one rank the plain model runs (nothing to shard)."""

    def __init__(self, ctx: Context, impl: str = "dtensor") -> None:
        from transformers import AutoConfig

        P = ctx.comm.world_size
        how, why = tp.tp_support(AutoConfig.from_pretrained(ctx.path), P)
        label = f"tp[{impl}]" if P > 1 else "tp"
        super().__init__(None, ctx.eos_ids, ctx.pad_id, label=label, world_size=P, local=False)
        self.name = "tp"
        if impl not in ("dtensor", "hf"):
            raise ValueError(f"tp_impl must be dtensor or hf, got {impl!r}")
        if P == 1:
            self.model = ctx.load_model()
            self.note = "1 rank: the unsharded model"
            return
        if how is None or (impl == "hf" and how != "full"):
            self.unsupported = f"tp[{impl}] on {P} ranks: {why}"
            return
        if how == "mlp-only":
            self.note = why
            self.label = f"tp[{impl},mlp-only]"
        if impl == "hf":
            self.model = tp.load_hf_tp(ctx.path, ctx.dtype)
        else:
            self.model = tp.parallelize_tp(ctx.load_model(), P, shard_attention=how == "full")


# ----------------------------------------------------------------------------------- pipeline parallel
class PipelineParallel(BenchDecoder):
    """Greedy decoding through a batch-1 pipeline over all P ranks, rank r holding layers
    [a_r, b_r) (lp/bench/pp.py); `balance`: give the last rank fewer layers for its LM head."""

    name = "pp"

    def __init__(self, ctx: Context, balance: bool = True) -> None:
        from transformers import AutoConfig

        comm = ctx.comm
        P = comm.world_size
        super().__init__("pp", P, {"balance": balance})
        self.eos_ids = set(ctx.eos_ids)
        config = AutoConfig.from_pretrained(ctx.path)
        self.unsupported = pp.pp_support(config, P)
        if self.unsupported:
            return
        ranges = pp.split_layers(
            config.get_text_config().num_hidden_layers, P, pp.head_cost(config) if balance else 0.0
        )
        self.label = f"pp[{'-'.join(str(e - s) for s, e in ranges)}]" if P > 1 else "pp"
        # loaded on the host: only this rank's stage goes to the device
        self.stage = pp.PipelineStage(ctx.load_model("cpu"), comm, ranges)

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        dev = self.stage.dev
        sync(dev)
        t0 = time.perf_counter()
        out, times = self.stage.decode(prompt_ids, max_new_tokens, self.eos_ids)
        sync(dev)
        t_end = time.perf_counter()
        return DecodeOutput(
            out,
            len(times),
            times[0] - t0,
            t_end - times[0],
            accepted_per_step=[1] * len(times),
            fed_per_step=[1] * len(times),
            whole_per_step=[1] * len(times),
            step_latencies=[b - a for a, b in zip(times[:-1], times[1:])],
        )

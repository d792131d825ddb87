"""The decoders the benchmark compares, behind one interface (`BenchDecoder`; not to be confused
with `lp.decoder.Decoder`, lp's own decode loop, which `LPDecoder` drives).

| name               | what                                                             | ranks       |
| ------------------ | ---------------------------------------------------------------- | ----------- |
| `lp`               | lp lookahead decoding at (W, N, G), Lookahead Parallelism        | all (P)     |
| `lp-ar`            | lp `mode=ar`: the same runtime, one token per step               | all (P)     |
| `hf-greedy`        | transformers `generate(do_sample=False)`                         | rank 0 only |
| `hf-static`        | the same with `cache_implementation="static"` (compiled on CUDA) | rank 0 only |
| `hf-prompt-lookup` | transformers prompt lookup decoding (`prompt_lookup_num_tokens`) | rank 0 only |
| `tp`               | tensor parallelism over P ranks, greedy `generate`               | all (P)     |
| `pp`               | pipeline parallelism: layers split over P ranks, batch-1 latency | all (P)     |

Under torchrun, rank-0-only decoders run while the other ranks wait at the next collective (so
the single-process baselines get the whole machine: see `local_threads`).

Every decoder returns a `DecodeOutput`: new token ids, steps, prefill seconds, decode seconds,
per-step latencies and tokens committed per step. Timing uses `time.perf_counter` with CUDA
synchronisation at the boundaries (every per-step boundary already waits for the device: lp
reads the all-gather on the host, transformers' streamer copies each step's tokens to the host).

Step accounting:
- lp: `steps` and `accepted_per_step` come from lp itself; prefill (prompt minus its last
  token) is separate. Step latencies are timed by wrapping `Worker.step` of this replica: step i
  lasts from its forward's start to the next one's (the all-gather, merge and pool update
  included); the last one ends when lp's decode clock stops. The time inside `Worker.step` (CUDA-
  synchronised) is the forward's; the rest of the decode time is host work and the all-gather.
- transformers decoders (and tp): a step is one model forward; the first forward (prompt ->
  first token) is timed as prefill and is also counted as a step (it yields a token). Tokens
  committed per forward are observed with a streamer; step latencies are the intervals between
  consecutive forwards' token arrivals (decode steps only).
- pp: as transformers decoders, with lp's own pipelined loop.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from lp.bench.metrics import intervals

log = logging.getLogger(__name__)

KINDS = ("lp", "lp-ar", "hf-greedy", "hf-static", "hf-prompt-lookup", "tp", "pp")
PP_MODEL_TYPES = ("llama", "mistral", "qwen2")  # embed -> layers -> norm, rotary at model.model


@dataclass
class DecodeOutput:
    output_ids: list[int]
    steps: int
    prefill_seconds: float
    decode_seconds: float
    step_latencies: list[float] = field(default_factory=list)
    accepted_per_step: list[int] = field(default_factory=list)
    forward_seconds: float | None = None  # lp: time inside the model forward (the rest is host + collective)
    chosen: dict = field(default_factory=dict)  # lp with W/N/G auto: the shape used and why
    step_tokens: list[int] = field(default_factory=list)  # tokens fed to each step's forward


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BenchDecoder:
    """One decoder of the benchmark. `local`: it runs on rank 0 only. `unsupported`: why it
    cannot run in this setting (then the harness writes a row saying so and never calls it)."""

    name: str = ""
    local: bool = False

    def __init__(self, label: str, world_size: int, settings: dict | None = None) -> None:
        self.label = label
        self.world_size = world_size
        self.settings = settings or {}
        self.unsupported: str | None = None
        self.note: str | None = None  # shown in the output when the decoder runs but differs from its name

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------- lp
def _option_name(key: str, value) -> str:
    """An lp option as it is spelled in a lookahead config name (parse_lookahead)."""
    letter = next((k for k, name in NUMBER_OPTIONS.items() if name == key), None)
    if letter is not None:
        return f"{letter}{value}"
    return next(name for name, kv in LOOKAHEAD_OPTIONS.items() if kv == (key, value))


class LPDecoder(BenchDecoder):
    """lp's runtime (`lp.LP`), lookahead or `mode=ar`, on every rank."""

    def __init__(self, lm, *, mode: str = "lookahead", W: int | str = 5, N: int | str = 3, G: int | str = 5,
                 seed: int = 0, pool_from_prompt: bool = True, **options) -> None:
        """`options`: further DecodeConfig settings (drafts, tree, budget, draft_len, text_drafts,
        pool_size), named in
        the label as in `parse_lookahead`."""
        self.name = "lp" if mode == "lookahead" else "lp-ar"
        auto = (W, N, G) == ("auto",) * 3
        suffix = "".join(f"-{_option_name(k, v)}" for k, v in options.items())
        label = "lp-ar" if mode != "lookahead" else f"lp[auto{suffix}]" if auto else f"lp[W{W}N{N}G{G}{suffix}]"
        settings = dict(mode=mode, seed=seed, pool_from_prompt=pool_from_prompt)
        if mode == "lookahead":
            settings.update(W=W, N=N, G=G, **options)
        super().__init__(label, lm.comm.world_size, settings)
        self.lm = lm

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        worker = self.lm.decoder.worker
        starts: list[float] = []
        forward: list[float] = []
        prefill_end: list[float] = []
        saved = {k: worker.__dict__[k] for k in ("step", "prefill") if k in worker.__dict__}
        step, prefill = worker.step, worker.prefill

        def timed_step(*args, **kwargs):
            t0 = time.perf_counter()
            out = step(*args, **kwargs)
            _sync(worker.device)
            if prefill_end:  # not W=auto's calibration, which runs before the prefill
                starts.append(t0)
                forward.append(time.perf_counter() - t0)
            return out

        def timed_prefill(*args, **kwargs):
            out = prefill(*args, **kwargs)
            _sync(worker.device)
            prefill_end.append(time.perf_counter())
            return out

        worker.step, worker.prefill = timed_step, timed_prefill
        try:
            r = self.lm.generate(list(prompt_ids), chat=False, max_new_tokens=max_new_tokens, **self.settings)
        finally:
            for k in ("step", "prefill"):
                if k in saved:
                    setattr(worker, k, saved[k])
                else:
                    delattr(worker, k)
        # lp's decode clock starts right after the prefill and runs r.seconds (same perf_counter clock).
        end = prefill_end[0] + r.seconds if prefill_end else time.perf_counter()
        lat = intervals(starts, max(end, starts[-1])) if starts else []
        chosen = {"mode": r.mode, "W": r.W, "N": r.N, "G": r.G, "auto": r.auto, "predicted": r.predicted} \
            if r.auto else {}
        return DecodeOutput(list(r.output_ids), r.steps, r.prefill_seconds, r.seconds, lat,
                            list(r.accepted_per_step), sum(forward), chosen, list(r.step_tokens))


# ----------------------------------------------------------------------------------- transformers
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

    def __init__(self, model, eos_ids: list[int], pad_id: int | None, *, label: str,
                 world_size: int = 1, local: bool = True, **generate_kwargs) -> None:
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
        _sync(dev)
        t0 = time.perf_counter()
        try:
            out = self.model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_ids or None, pad_token_id=self.pad_id, streamer=stream, **self.kwargs)
        finally:
            hook.remove()
        _sync(dev)
        t_end = time.perf_counter()
        ids = out[0, x.shape[1]:].tolist()
        times, counts = stream.times, stream.counts
        if not times:  # nothing generated
            return DecodeOutput(ids, 0, t_end - t0, 0.0, [], [])
        if sum(counts) != len(ids):
            log.warning("%s: streamed %d tokens but generate returned %d", self.label, sum(counts), len(ids))
        # the first forward reads the whole prompt; count it as lp does: the prompt's last token
        # (lp's prefill, the prompt but its last token, is not a step)
        fed = [1] + fed[1:len(times)]
        return DecodeOutput(ids, len(times), times[0] - t0, t_end - times[0],
                            [b - a for a, b in zip(times[:-1], times[1:])], counts, step_tokens=fed)


def hf_greedy(model, eos_ids, pad_id, static: bool = False) -> HFGenerate:
    """Greedy `generate`; `static`: transformers' static KV cache, which it compiles on CUDA."""
    name = "hf-static" if static else "hf-greedy"
    d = HFGenerate(model, eos_ids, pad_id, label=name, **({"cache_implementation": "static"} if static else {}))
    d.name = name
    return d


def hf_prompt_lookup(model, eos_ids, pad_id, num_tokens: int = 10, max_ngram: int = 2) -> HFGenerate:
    d = HFGenerate(model, eos_ids, pad_id, label=f"hf-prompt-lookup[k{num_tokens}m{max_ngram}]",
                   prompt_lookup_num_tokens=num_tokens, max_matching_ngram_size=max_ngram)
    d.name = "hf-prompt-lookup"
    return d


# ----------------------------------------------------------------------------------- tensor parallel
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
        return "mlp-only", (f"{heads} attention heads / {kv} kv heads are not divisible by {P} ranks: "
                            f"attention replicated, only the MLP is sharded")
    return None, f"neither heads ({heads}/{kv} kv) nor intermediate size ({inter}) divisible by {P} ranks"


class TensorParallel(HFGenerate):
    """Greedy `generate` on a tensor-parallel replica over all P ranks.

    impl="dtensor" (default): torch `parallelize_module` with `tp_plan()`; when the head counts
    do not divide by P (SmolLM2-135M: 9 heads, 3 kv heads -> only P in {1, 3}) it falls back to
    sharding the MLP only, and says so in the output. impl="hf": transformers' own plan
    (`DistributedConfig(tp_plan="auto")`), which needs the head counts divisible by P, else the
    decoder is reported unsupported. With one rank the plain model runs (nothing to shard)."""

    def __init__(self, ctx, impl: str = "dtensor") -> None:
        from transformers import AutoConfig

        comm = ctx.comm
        P = comm.world_size
        config = AutoConfig.from_pretrained(ctx.path)
        how, why = tp_support(config, P)
        label = f"tp[{impl}]" if P > 1 else "tp"
        super().__init__(None, ctx.eos_ids, ctx.pad_id, label=label, world_size=P, local=False)
        self.name = "tp"
        if impl not in ("dtensor", "hf"):
            raise ValueError(f"tp_impl must be dtensor or hf, got {impl!r}")
        if P == 1:
            self.model = ctx.lm.model
            self.note = "1 rank: the unsharded model"
            return
        if how is None or (impl == "hf" and how != "full"):
            self.unsupported = f"tp[{impl}] on {P} ranks: {why}"
            return
        if how == "mlp-only":
            self.note = why
            self.label = f"tp[{impl},mlp-only]"
        if impl == "hf":
            self.model = self._load_hf(ctx)
        else:
            self.model = self._load_dtensor(ctx, how == "full")

    @staticmethod
    def _load_hf(ctx):
        from transformers import AutoModelForCausalLM
        from transformers.distributed import DistributedConfig

        model = AutoModelForCausalLM.from_pretrained(
            ctx.path, dtype=ctx.dtype, attn_implementation="sdpa",
            distributed_config=DistributedConfig(tp_plan="auto"))
        return model.eval()

    @staticmethod
    def _load_dtensor(ctx, shard_attention: bool):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(ctx.path, dtype=ctx.dtype, attn_implementation="sdpa")
        model = model.to(ctx.comm.device).eval()
        mesh = init_device_mesh(ctx.comm.device.type, (ctx.comm.world_size,))
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        body = model.get_decoder()
        plan = {k: styles[v]() for k, v in tp_plan(len(body.layers), shard_attention).items()}
        # Every rank loaded the same weights: shard locally, no scatter from rank 0.
        parallelize_module(body, mesh, plan, src_data_rank=None)
        return model


# ----------------------------------------------------------------------------------- pipeline parallel
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


class PipelineParallel(BenchDecoder):
    """Latency-oriented pipeline for batch 1 (no micro-batching): rank r holds layers
    [a_r, b_r) (rank 0 also the embedding, the last rank the final norm and LM head). Per step,
    rank 0 embeds the input, each rank runs its layers and sends the hidden states to the next
    with send/recv; the last rank picks the greedy token and broadcasts it to every rank. Works
    with gloo (CPU) and NCCL. Supported: Llama, Mistral, Qwen2 (embed -> layers -> norm,
    rotary embeddings on the base model; sequences shorter than any sliding window)."""

    name = "pp"

    def __init__(self, ctx, balance: bool = True) -> None:
        from transformers import AutoConfig

        comm = ctx.comm
        P, rank = comm.world_size, comm.rank
        super().__init__("pp", P, {"balance": balance})
        self.comm, self.dev = comm, comm.device
        self.eos_ids = set(ctx.eos_ids)
        config = AutoConfig.from_pretrained(ctx.path).get_text_config()
        self.config = config
        n = config.num_hidden_layers
        if config.model_type not in PP_MODEL_TYPES:
            self.unsupported = f"pp: model type '{config.model_type}' not supported (only {', '.join(PP_MODEL_TYPES)})"
            return
        if n < P:
            self.unsupported = f"pp: {n} layers cannot be split over {P} ranks"
            return
        # LM head cost in layer units: its matmul against one layer's (attention + MLP) weights.
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        layer = (2 * config.hidden_size * config.num_attention_heads * hd + 2 * config.hidden_size * kv * hd
                 + 3 * config.hidden_size * config.intermediate_size)
        head = config.vocab_size * config.hidden_size / layer if balance else 0.0
        self.ranges = split_layers(n, P, head)
        a, b = self.ranges[rank]
        self.label = f"pp[{'-'.join(str(e - s) for s, e in self.ranges)}]" if P > 1 else "pp"
        if P == 1:
            model = ctx.lm.model
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(ctx.path, dtype=ctx.dtype, attn_implementation="sdpa")
            body = model.get_decoder()
            body.layers = torch.nn.ModuleList(list(body.layers)[a:b])  # drop the other ranks' layers
            if rank != 0:
                body.embed_tokens = torch.nn.Identity()  # a tied LM head keeps its weight
            if rank != P - 1:
                body.norm, model.lm_head = torch.nn.Identity(), torch.nn.Identity()
            model = model.to(self.dev).eval()
        body = model.get_decoder()
        self.first, self.last = rank == 0, rank == P - 1
        self.embed = body.embed_tokens if self.first else None
        self.layers = list(body.layers) if P > 1 else list(body.layers)[a:b]
        self.rotary = body.rotary_emb
        self.norm = body.norm if self.last else None
        self.head = model.get_output_embeddings() if self.last else None
        self.dtype = next(model.parameters()).dtype
        self.hidden = config.hidden_size
        self._model = model  # keep the (pruned) replica alive

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
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
        _sync(dev)
        t0 = time.perf_counter()
        for i in range(max_new_tokens):
            T = pos.shape[1]
            if self.first:
                h = self.embed(x)
            else:
                h = torch.empty((1, T, self.hidden), dtype=self.dtype, device=dev)
                dist.recv(h, src=rank - 1)
            pe = self.rotary(h, position_ids=pos)
            for layer in self.layers:
                h = layer(h, attention_mask=None, position_ids=pos, past_key_values=cache, use_cache=True,
                          position_embeddings=pe)
            if not self.last:
                dist.send(h.contiguous(), dst=rank + 1)
            else:
                tok = self.head(self.norm(h[:, -1])).argmax(dim=-1)
            if P > 1:
                dist.broadcast(tok, src=P - 1)
            t = int(tok.item())  # waits for the step on the device
            times.append(time.perf_counter())
            out.append(t)
            if t in self.eos_ids:
                break
            x = tok.view(1, 1)
            pos = torch.tensor([[L + i]], device=dev)
        _sync(dev)
        t_end = time.perf_counter()
        return DecodeOutput(out, len(times), times[0] - t0, t_end - times[0],
                            [b - a for a, b in zip(times[:-1], times[1:])], [1] * len(times))


# ----------------------------------------------------------------------------------- building
@dataclass
class Context:
    """What decoders share on this rank: lp's replica (`lm`, with the collective), the model's
    local path, dtype, and end-of-sequence / padding ids."""

    lm: object
    path: str
    dtype: torch.dtype

    @property
    def comm(self):
        return self.lm.comm

    @property
    def eos_ids(self) -> list[int]:
        return sorted(self.lm.decoder.eos_ids)

    @property
    def pad_id(self) -> int | None:
        pad = self.lm.tokenizer.pad_token_id
        if pad is None:
            pad = self.lm.model.generation_config.pad_token_id
        return pad


LOOKAHEAD_OPTIONS = {"pool": ("drafts", "pool"), "text": ("drafts", "pool+text"), "chains": ("tree", False),
                     "tree": ("tree", True),
                     "recent": ("rank", "recent"), "frequent": ("rank", "frequent"),
                     "context": ("rank", "context")}
NUMBER_OPTIONS = {"B": "budget", "D": "draft_len", "T": "text_drafts", "P": "pool_size"}  # -B80 etc.


def parse_lookahead(spec: str) -> dict:
    """lp's settings from a config name: "W15N5G15" -> W=15 N=5 G=15; "auto": W/N/G chosen from a
    measured step-cost curve (lp/auto.py). Options follow with dashes: `-pool` (pool drafts
    only), `-text` (pool and text drafts), `-chains` (no shared prefixes), `-tree`, `-recent`, `-frequent`, `-context` (pool candidate order), `-B80`
    (budget: 80 verification tokens), `-D6` (text drafts of at most 6 tokens), `-T8` (8 text
    drafts per step), `-P60` (the pool keeps 60 n-grams per first token); e.g.
    "W15N5G15-pool-chains-recent" is the classic verification branch."""
    import re

    head, *options = str(spec).strip().split("-")
    if head.lower() == "auto":
        out: dict = dict(W="auto", N="auto", G="auto")
    else:
        m = re.fullmatch(r"W(\d+)N(\d+)G(\d+)", head, flags=re.IGNORECASE)
        if not m:
            raise ValueError(f"lookahead config must look like W15N5G15 or auto (options: -pool, -text, "
                             f"-chains, -tree, -recent, -frequent, -context, -B<budget>, -D<draft length>, -T<text drafts>, -P<pool size>), got {spec!r}")
        out = dict(W=int(m[1]), N=int(m[2]), G=int(m[3]))
    for opt in options:
        number = re.fullmatch(r"([BDTP])(\d+)", opt, flags=re.IGNORECASE)
        if number:
            out[NUMBER_OPTIONS[number[1].upper()]] = int(number[2])
        elif opt.lower() in LOOKAHEAD_OPTIONS:
            key, value = LOOKAHEAD_OPTIONS[opt.lower()]
            out[key] = value
        else:
            raise ValueError(f"unknown lookahead option {opt!r} in {spec!r} (known: pool, text, chains, tree, recent, frequent, context, B<n>, D<n>, T<n>, P<n>)")
    return out


def build(kinds: list[str], ctx: Context, *, lookahead: list[dict], seed: int = 0,
          pool_from_prompt: bool = True, pld_tokens: int = 10, pld_ngram: int = 2,
          tp_impl: str = "dtensor", pp_balance: bool = True) -> list[BenchDecoder]:
    """The decoders named in `kinds`, in that order (`lp` expands to one per lookahead config)."""
    out: list[BenchDecoder] = []
    lm = ctx.lm
    for kind in kinds:
        if kind == "lp":
            out += [LPDecoder(lm, seed=seed, pool_from_prompt=pool_from_prompt, **config) for config in lookahead]
        elif kind == "lp-ar":
            out.append(LPDecoder(lm, mode="ar", seed=seed))
        elif kind in ("hf-greedy", "hf-static"):
            out.append(hf_greedy(lm.model, ctx.eos_ids, ctx.pad_id, static=kind == "hf-static"))
        elif kind == "hf-prompt-lookup":
            out.append(hf_prompt_lookup(lm.model, ctx.eos_ids, ctx.pad_id, pld_tokens, pld_ngram))
        elif kind == "tp":
            out.append(TensorParallel(ctx, tp_impl))
        elif kind == "pp":
            out.append(PipelineParallel(ctx, pp_balance))
        else:
            raise ValueError(f"unknown decoder '{kind}'; known: {', '.join(KINDS)}")
    labels = [d.label for d in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise ValueError(f"decoders given twice: {sorted(dup)}")
    return out


__all__ = ["BenchDecoder", "Context", "DecodeOutput", "HFGenerate", "LPDecoder", "PipelineParallel",
           "TensorParallel", "build", "parse_lookahead", "split_layers", "tp_plan", "tp_support"]

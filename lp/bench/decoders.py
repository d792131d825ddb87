"""The decoders the benchmark compares, behind one interface (`BenchDecoder`; not to be confused
with `lp.decode.loop.Decoder`, lp's own decode loop, which `LPDecoder` drives).

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
the single-process baselines get the whole machine: see `local_threads`). Every baseline runs
on its own model object (`Context.load_model`), never on lp's, at every world size; `tp` and
`pp` apply their parallelism to it from outside (lp/bench/tp.py, lp/bench/pp.py), except `tp`
with `tp_impl=lp`, lp's own sharded runtime (lp/engine/tp.py) on a model it reads itself.

Every decoder returns a `DecodeOutput`: new token ids, steps, prefill seconds, decode seconds,
per-step latencies and tokens committed per step. Timing uses `time.perf_counter` with CUDA
synchronisation at the boundaries (each step waits for the device anyway: lp reads the
all-gather on the host, a step late in greedy `mode=ar` on a GPU, and transformers' streamer
copies each step's tokens to the host).

Step accounting:
- lp: `steps` and `accepted_per_step` come from lp itself; prefill (prompt minus its last
  token) is separate. Step latencies are timed through lp's `StepObserver` hook: step i lasts
  from its forward's start to the next one's (the all-gather, merge and pool update included);
  the last one ends when lp's decode clock stops. The time between a step's `forward_start` and
  `forward_done` (on a GPU: between two CUDA events there) is the forward's; the rest of the
  decode time is host work and the all-gather. (W=auto's calibration runs outside the decode,
  so it is never counted.)
- transformers decoders (and tp): a step is one model forward; the first forward (prompt ->
  first token) is timed as prefill and is also counted as a step (it yields a token). Tokens
  committed per forward are observed with a streamer; step latencies are the intervals between
  consecutive forwards' token arrivals (decode steps only).
- pp: as transformers decoders, with its own pipelined loop (lp/bench/pp.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from lp import models
from lp.bench import pp, tp
from lp.bench.metrics import intervals
from lp.decode.loop import Generation, StepObserver

log = logging.getLogger(__name__)

KINDS = ("lp", "lp-ar", "hf-greedy", "hf-static", "hf-prompt-lookup", "tp", "pp")


@dataclass(frozen=True)
class DecodeOutput(Generation):
    """A benchmark decoder's result: lp's record (`seconds`: decode time after the prefill)
    plus what the benchmark times."""

    step_latencies: list[float] = field(default_factory=list)
    forward_seconds: float | None = None  # lp: time inside the model forward (the rest is host + collective)
    chosen: dict = field(default_factory=dict)  # lp with W/N/G auto: the shape used and why


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


class _ForwardTimer(StepObserver):
    """Times lp's decode from its observer hook: each step's start (step latencies), the time
    inside the forwards and the prefill's end (where lp's decode clock starts). On a GPU the
    forwards are timed by CUDA events, not by waiting for the device after each: a wait would
    stop lp from queueing the next ops (or, in `mode=ar`, the next step) during the forward, and
    the benchmark would time a slower decode than lp runs. Step starts are then the host's
    queueing times, which the step's one message read keeps a step apart."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.starts: list[float] = []
        self._seconds = 0.0  # the CPU's forwards
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # a GPU's forwards
        self.prefill_end = 0.0  # set by the prefill, which every decode runs first

    def prefill_done(self) -> None:
        _sync(self.device)
        self.prefill_end = time.perf_counter()

    def forward_start(self) -> None:
        self.starts.append(time.perf_counter())
        if self.device.type == "cuda":
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()

    def forward_done(self) -> None:
        if self._events:
            self._events[-1][1].record()
        else:
            self._seconds += time.perf_counter() - self.starts[-1]

    @property
    def forward_seconds(self) -> float:
        """Time inside the forwards (read after the decode, which ends waiting for the device)."""
        return self._seconds + sum(a.elapsed_time(b) for a, b in self._events) / 1e3


class LPDecoder(BenchDecoder):
    """lp's runtime (`lp.LP`), lookahead or `mode=ar`, on every rank."""

    def __init__(
        self,
        lm,
        *,
        mode: str = "lookahead",
        W: int | str = 5,
        N: int | str = 3,
        G: int | str = 5,
        seed: int = 0,
        pool_from_prompt: bool = True,
        **options,
    ) -> None:
        """`options`: further DecodeConfig settings (drafts, tree, budget, draft_len, text_drafts,
        pool_size, recycle), named in the label as in `parse_lookahead`."""
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
        timer = _ForwardTimer(self.lm.comm.device)
        r = self.lm.generate(
            list(prompt_ids), chat=False, max_new_tokens=max_new_tokens, observer=timer, **self.settings
        )
        # lp's decode clock starts right after the prefill and runs r.seconds (same perf_counter clock).
        end = timer.prefill_end + r.seconds
        lat = intervals(timer.starts, max(end, timer.starts[-1])) if timer.starts else []
        chosen = (
            {"mode": r.mode, "W": r.W, "N": r.N, "G": r.G, "auto": r.auto, "predicted": r.predicted} if r.auto else {}
        )
        return DecodeOutput(
            list(r.output_ids),
            r.steps,
            r.prefill_seconds,
            r.seconds,
            list(r.accepted_per_step),
            list(r.step_tokens),
            lat,
            timer.forward_seconds,
            chosen,
        )


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
        _sync(dev)
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
        _sync(dev)
        t_end = time.perf_counter()
        ids = out[0, x.shape[1] :].tolist()
        times, counts = stream.times, stream.counts
        if not times:  # nothing generated
            return DecodeOutput(ids, 0, t_end - t0, 0.0, [], [])
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
            counts,
            fed,
            [b - a for a, b in zip(times[:-1], times[1:])],
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


def lp_tensor_parallel(ctx: Context) -> BenchDecoder:
    """The `tp` baseline as lp's own plain decoding (`mode=ar`) on one replica sharded over all P
    ranks (`tp=P`, lp/engine/tp.py): lp's lean forward, one all-reduce after attention and one
    after the MLP, no lookahead. Unsupported where P does not divide the head counts."""
    from transformers import AutoConfig

    from lp.engine.tp import check_divisible
    from lp.errors import LPError
    from lp.frontend.runtime import LP

    P = ctx.comm.world_size
    try:
        check_divisible(AutoConfig.from_pretrained(ctx.path), P)
    except LPError as e:
        d = BenchDecoder("tp[lp]", P)
        d.name, d.unsupported = "tp", str(e)
        return d
    d = LPDecoder(ctx.lm if P == 1 else LP(ctx.path, tp=P, **ctx.options), mode="ar")
    d.name, d.label = "tp", "tp[lp]"
    return d


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
        _sync(dev)
        t0 = time.perf_counter()
        out, times = self.stage.decode(prompt_ids, max_new_tokens, self.eos_ids)
        _sync(dev)
        t_end = time.perf_counter()
        return DecodeOutput(
            out,
            len(times),
            times[0] - t0,
            t_end - times[0],
            [1] * len(times),
            [1] * len(times),
            [b - a for a, b in zip(times[:-1], times[1:])],
        )


# ----------------------------------------------------------------------------------- building
@dataclass
class Context:
    """What decoders share on this rank: lp's replica (`lm`, with the collective), the model's
    local path, dtype, and end-of-sequence / padding ids; and each baseline's own copy of the
    model (`load_model`); `options`: the engine options lp's replica was built with (LP's keyword
    arguments), for another lp runtime (`tp_impl=lp`)."""

    lm: object
    path: str
    dtype: torch.dtype
    options: dict = field(default_factory=dict)

    @property
    def comm(self):
        return self.lm.comm

    def load_model(self, device: str | torch.device | None = None) -> torch.nn.Module:
        """A fresh copy of the model for a baseline to own (the same weights and dtype, sdpa
        attention, as lp's), on `device` (default: this rank's): lp's worker may compile or
        hold state on its own model, so no baseline ever shares it."""
        return models.load(self.path, self.dtype, device or self.comm.device)[0]

    @property
    def eos_ids(self) -> list[int]:
        return sorted(self.lm.decoder.eos_ids)

    @property
    def pad_id(self) -> int | None:
        pad = self.lm.tokenizer.pad_token_id
        if pad is None:
            pad = self.lm.model.generation_config.pad_token_id
        return pad


LOOKAHEAD_OPTIONS = {
    "pool": ("drafts", "pool"),
    "text": ("drafts", "pool+text"),
    "chains": ("tree", False),
    "tree": ("tree", True),
    "recent": ("rank", "recent"),
    "frequent": ("rank", "frequent"),
    "context": ("rank", "context"),
}
NUMBER_OPTIONS = {"B": "budget", "D": "draft_len", "T": "text_drafts", "P": "pool_size", "R": "recycle"}  # -B80 etc.


def parse_lookahead(spec: str) -> dict:
    """lp's settings from a config name: "W15N5G15" -> W=15 N=5 G=15; "auto": W/N/G chosen from a
    measured step-cost curve (lp/decode/auto.py). Options follow with dashes: `-pool` (no text
    drafts), `-text` (pool and text drafts), `-chains` (no shared prefixes), `-tree`, `-recent`,
    `-frequent`, `-context` (pool candidate order), `-B80`
    (budget: 80 verification tokens), `-D6` (text drafts of at most 6 tokens), `-T8` (8 text
    drafts per step), `-P60` (the pool keeps 60 n-grams per first token), `-R8` (the successor
    table keeps each token's top 8 next tokens; `-R0`: no recycled drafts); e.g.
    "W15N5G15-pool-chains-recent-R0" is the classic verification branch."""
    import re

    head, *options = str(spec).strip().split("-")
    if head.lower() == "auto":
        out: dict = dict(W="auto", N="auto", G="auto")
    else:
        m = re.fullmatch(r"W(\d+)N(\d+)G(\d+)", head, flags=re.IGNORECASE)
        if not m:
            raise ValueError(
                f"lookahead config must look like W15N5G15 or auto (options: -pool, -text, "
                f"-chains, -tree, -recent, -frequent, -context, -B<budget>, -D<draft length>, "
                f"-T<text drafts>, -P<pool size>, -R<successors>), got {spec!r}"
            )
        out = dict(W=int(m[1]), N=int(m[2]), G=int(m[3]))
    for opt in options:
        number = re.fullmatch(r"([BDTPR])(\d+)", opt, flags=re.IGNORECASE)
        if number:
            out[NUMBER_OPTIONS[number[1].upper()]] = int(number[2])
        elif opt.lower() in LOOKAHEAD_OPTIONS:
            key, value = LOOKAHEAD_OPTIONS[opt.lower()]
            out[key] = value
        else:
            raise ValueError(
                f"unknown lookahead option {opt!r} in {spec!r} (known: pool, text, chains, tree, recent, "
                f"frequent, context, B<n>, D<n>, T<n>, P<n>, R<n>)"
            )
    return out


def build(
    kinds: list[str],
    ctx: Context,
    *,
    lookahead: list[dict],
    seed: int = 0,
    pool_from_prompt: bool = True,
    pld_tokens: int = 10,
    pld_ngram: int = 2,
    tp_impl: str = "dtensor",
    pp_balance: bool = True,
) -> list[BenchDecoder]:
    """The decoders named in `kinds`, in that order (`lp` expands to one per lookahead config)."""
    out: list[BenchDecoder] = []
    lm = ctx.lm

    hf_model: list[torch.nn.Module] = []

    def local_model() -> torch.nn.Module | None:
        """The model of the rank-0-only transformers baselines (the other ranks never run them):
        one copy, never lp's, shared by them, since `generate` leaves a model as it found it
        (one 7B copy per baseline would not fit beside lp's on one GPU)."""
        if not ctx.comm.is_main:
            return None
        if not hf_model:
            hf_model.append(ctx.load_model())
        return hf_model[0]

    for kind in kinds:
        if kind == "lp":
            out += [LPDecoder(lm, seed=seed, pool_from_prompt=pool_from_prompt, **config) for config in lookahead]
        elif kind == "lp-ar":
            out.append(LPDecoder(lm, mode="ar", seed=seed))
        elif kind in ("hf-greedy", "hf-static"):
            out.append(hf_greedy(local_model(), ctx.eos_ids, ctx.pad_id, static=kind == "hf-static"))
        elif kind == "hf-prompt-lookup":
            out.append(hf_prompt_lookup(local_model(), ctx.eos_ids, ctx.pad_id, pld_tokens, pld_ngram))
        elif kind == "tp":
            out.append(lp_tensor_parallel(ctx) if tp_impl == "lp" else TensorParallel(ctx, tp_impl))
        elif kind == "pp":
            out.append(PipelineParallel(ctx, pp_balance))
        else:
            raise ValueError(f"unknown decoder '{kind}'; known: {', '.join(KINDS)}")
    labels = [d.label for d in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise ValueError(f"decoders given twice: {sorted(dup)}")
    return out


__all__ = [
    "BenchDecoder",
    "Context",
    "DecodeOutput",
    "HFGenerate",
    "LPDecoder",
    "PipelineParallel",
    "TensorParallel",
    "build",
    "lp_tensor_parallel",
    "parse_lookahead",
]

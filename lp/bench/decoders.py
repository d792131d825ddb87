"""The decoders the benchmark compares, behind one interface (`BenchDecoder`; not to be confused
with `lp.decode.loop.Decoder`, lp's own decode loop, which `LPDecoder` drives).

| name               | what                                                             | ranks       |
| ------------------ | ---------------------------------------------------------------- | ----------- |
| `lp`               | lp lookahead decoding at (W, N, G), Lookahead Parallelism        | all (P)     |
| `lp-ar`            | lp `mode=ar`: the same runtime, one token per step               | all (P)     |
| `hf-greedy`        | transformers `generate(do_sample=False)`                         | rank 0 only |
| `hf-static`        | the same with `cache_implementation="static"` (compiled on CUDA) | rank 0 only |
| `hf-prompt-lookup` | transformers prompt lookup decoding (`prompt_lookup_num_tokens`) | rank 0 only |
| `token-recycling`  | Token Recycling (Luo et al. 2024): an 80-node static tree of     | rank 0 only |
|                    | recycled top-8 successors (lp/bench/recycling.py)                |             |
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
- token-recycling: as lp (its prefill, the prompt but its last token, is not a step; a step's
  tokens include those the last step committed, re-fed).
- pp: as transformers decoders, with its own pipelined loop (lp/bench/pp.py).
"""

from __future__ import annotations

import time

import torch

from lp.bench.baselines import PipelineParallel, TensorParallel, hf_greedy, hf_prompt_lookup
from lp.bench.interface import BenchDecoder, Context, DecodeOutput, sync
from lp.bench.metrics import intervals
from lp.bench.recycling import TokenRecycling
from lp.bench.shapes import option_name
from lp.decode.loop import StepObserver

KINDS = ("lp", "lp-ar", "hf-greedy", "hf-static", "hf-prompt-lookup", "token-recycling", "tp", "pp")


class _ForwardTimer(StepObserver):
    """Times lp's decode from its observer hook: each step's start (step latencies), the time
    inside the forwards and the prefill's end (where lp's decode clock starts). On a GPU the
    forwards are timed by CUDA events, not by waiting for the device after each: a wait would
    stop lp from queueing the next ops (or, in `mode=ar`, the next step) during the forward, and
    the benchmark would time a slower decode than lp runs. Step starts are then the host's
    queueing times, which the step's one message read keeps a step apart. From each message read
    to the next forward's start (`after_read`) is what the device waits for the host after the
    read; on a GPU, timed by an event recorded at the read, which the idle device passes at once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.starts: list[float] = []
        self._seconds = 0.0  # the CPU's forwards
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # a GPU's forwards
        self._reads: list[float | torch.cuda.Event] = []  # each step's message read
        self.prefill_end = 0.0  # set by the prefill, which every decode runs first

    def prefill_done(self) -> None:
        sync(self.device)
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

    def message_read(self) -> None:
        if self.device.type == "cuda":
            self._reads.append(torch.cuda.Event(enable_timing=True))
            self._reads[-1].record()
        else:
            self._reads.append(time.perf_counter())

    def after_read(self) -> list[float]:
        """Seconds from each message read to the next forward's start (read after the decode, in a
        decode whose reads come before the next step is queued: lookahead's, not `mode=ar` ahead)."""
        if self._events:
            return [r.elapsed_time(start) / 1e3 for r, (start, _) in zip(self._reads, self._events[1:])]
        return [start - r for r, start in zip(self._reads, self.starts[1:])]

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
        """`options`: further DecodeConfig settings (drafts, tree, step_tokens, draft_len, text_drafts,
        pool_size, successors, ...), named in the label as in `parse_lookahead`."""
        self.name = "lp" if mode == "lookahead" else "lp-ar"
        auto = (W, N, G) == ("auto",) * 3
        suffix = "".join(f"-{option_name(k, v)}" for k, v in options.items())
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
            accepted_per_step=list(r.accepted_per_step),
            fed_per_step=list(r.fed_per_step),
            whole_per_step=list(r.whole_per_step),
            step_latencies=lat,
            forward_seconds=timer.forward_seconds,
            after_read=timer.after_read() if r.mode == "lookahead" else [],
            chosen=chosen,
        )


# ----------------------------------------------------------------------------------- transformers


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
            out.append(hf_prompt_lookup(local_model(), ctx.eos_ids, ctx.pad_id, pld_tokens, max_ngram=pld_ngram))
        elif kind == "token-recycling":
            out.append(TokenRecycling(local_model(), ctx.eos_ids))
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


__all__ = ["KINDS", "LPDecoder", "build", "lp_tensor_parallel"]

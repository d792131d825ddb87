"""Strong scaling of Lookahead Parallelism, PROJECTED from a real decode and replayed on one device.

    python -m tools.project arch=llama-7b [key=value ...]      (--help lists every key)

1. Record: the real model (`model`, default SmolLM2-135M) decodes the prompts at world size 1
   for every configuration (P, W, N, G). LP is exact and its partition does not change what a
   step accepts, so S and every step's shape (pending tokens, draft tree, committed length) are
   what P ranks would see (P > 1 ranks re-feed the last step's commit, one replica x0 alone).
2. Replay: a model of shape `arch` with random weights runs, on this one device, every rank's
   share of every recorded step (lp's own partition and layouts), one rank after another at
   the recorded cache length. A step costs its slowest rank plus the median all-gather for P,
   measured between P gloo processes on this host. `mode=ar` (one token a step, S = 1) is
   replayed at the same lengths: the baseline of the same engine.

Measured: S (real model, real prompts), forward times (this device, `arch`), the all-gather
(gloo on this host). Not measured: cross-GPU interference (P replicas never run at once here),
NCCL/NVLink all-gather latency when fewer GPUs than P are present, the host work between
forwards (`python -m tools.host`). Writes OUT/project.json, .md and .png; prints the markdown.

With `costs=STEPS.json` (a result of `python -m tools.steps`, measured on a GPU earlier) no
model is built: a rank's forward costs what that run measured for a step of its size (its
bucket, where that run used fixed-shape steps), so a machine without the GPU projects onto it.
That run timed causal blocks of each size, after one prompt: a share's own cache length, mask
and logits rows are not.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lp.decode.loop import StepObserver
from lp.decode.plan import Split, StepPlan, rank_share
from lp.decode.throughput import tokens_per_step
from lp.engine.step_tensors import bucket
from lp.errors import LPError
from lp.lookahead.mask import StepLayout, step_layout
from lp.lookahead.tree import DraftTree
from tools import steps

PROJECTION = (
    "PROJECTION, not a multi-GPU run: measured: S (real decode), forward times (this device), "
    "all-gather (gloo processes on this host); not measured: cross-GPU interference, NCCL/NVLink "
    "latency when fewer GPUs than P are present, host work between forwards"
)
MEASURED_PROJECTION = (
    "PROJECTION, not a multi-GPU run: measured: S (real decode here), forward times (a step-cost "
    "run on the device named, per step size); not measured: the all-gather on that device (gloo "
    "on this host at most), cross-GPU interference, host work between forwards, each rank's own "
    "share (its cache length, mask and logits rows: the step-cost run timed causal blocks)"
)
DEFAULT_CONFIGS = "1:W15N5G15,2:W30N5G30,4:W45N5G45,8:W60N5G60"
COSTS_KEYS = ("arch", "device", "device_name", "dtype", "graphs", "attention", "torch", "steps")  # of a costs= file
AR_LAYOUT = step_layout(1, 0, 2, range(0), ())  # mode=ar: x0 alone
Timer = Callable[[StepLayout, int], float]  # (layout, committed cache length) -> seconds


@dataclass(frozen=True)
class Shape:
    P: int
    W: int
    N: int
    G: int


@dataclass(frozen=True)
class Step:
    """A recorded step: the tokens the last step committed (`m`: P > 1 ranks re-feed them; one
    replica keeps their KV and feeds x0 alone, lp/worker.py `keep`), the committed cache length
    before them, the draft tree."""

    m: int
    length: int
    tree: DraftTree

    def pending(self, P: int) -> tuple[int, int]:
        """The step's pending tokens on P ranks and the committed cache length before them."""
        return (1, self.length + self.m - 1) if P == 1 else (self.m, self.length)

    @property
    def parents(self) -> tuple[int, ...]:
        return self.tree.parents


@dataclass
class Recording:
    shape: Shape
    steps: list[Step]
    new_tokens: int
    prompts: int

    @property
    def S(self) -> float:
        return tokens_per_step(self.new_tokens, len(self.steps))


class _Recorder(StepObserver):
    """Records each step at world size 1, where x0 alone is pending: the last step's commit is
    how far x0 moved."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._x0: int | None = None  # the last step's x0 position in this sequence

    def prefill_done(self) -> None:
        self._x0 = None

    def planned(self, step: StepPlan, position: int) -> None:
        m = 1 if self._x0 is None else position - self._x0
        self._x0 = position
        self.steps.append(Step(m, position + 1 - m, step.tree))


def parse_configs(text: str) -> list[Shape]:
    """`1:W15N5G15,2:W30N5G30` -> shapes; one-line LPError on anything else."""
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        hit = re.fullmatch(r"(\d+):W(\d+)N(\d+)G(\d+)", item)
        if hit is None:
            raise LPError(f"configs: expected P:WxNyGz items like 2:W30N5G30, comma separated, got {item!r}")
        shape = Shape(*map(int, hit.groups()))
        if shape.P < 1 or shape.W < 1 or shape.N < 2:
            raise LPError(f"configs: {item!r} needs P >= 1, W >= 1, N >= 2")
        shapes.append(shape)
    if not shapes:
        raise LPError("configs: no configuration given")
    if len({s.P for s in shapes}) < len(shapes):
        raise LPError(f"configs: each P once, got P = {[s.P for s in shapes]}")
    return shapes


def record(lm, prompts: list[list[int]], shape: Shape, max_new_tokens: int) -> Recording:
    """Decode `prompts` (token ids) with `lm` (an lp.LP) at world size 1, recording each step."""
    rec, new = _Recorder(), 0
    for ids in prompts:
        new += lm.generate(ids, observer=rec, W=shape.W, N=shape.N, G=shape.G, max_new_tokens=max_new_tokens).new_tokens
    return Recording(shape, rec.steps, new, len(prompts))


def rank_layouts(step: Step, shape: Shape) -> list[StepLayout]:
    """Every rank's layout of `step` at `shape`, as lp.decode.plan.plan_step lays them out."""
    m, _ = step.pending(shape.P)
    return [rank_share(m, step.tree, Split(shape.W, shape.N, shape.P, r))[1] for r in range(shape.P)]


def project(rec: Recording, time_step: Timer, allgather_s: float) -> dict:
    """One row of the table: per step, the slowest rank's forward plus the all-gather."""
    slowest, step_s, ar_s, biggest = [], [], [], []
    for s in rec.steps:
        _, length = s.pending(rec.shape.P)
        ranks = [(time_step(layout, length), layout.size) for layout in rank_layouts(s, rec.shape)]
        slowest.append(max(t for t, _ in ranks))
        biggest.append(max(n for _, n in ranks))
        step_s.append(slowest[-1] + allgather_s)
        ar_s.append(time_step(AR_LAYOUT, s.length))
    tok_s = rec.new_tokens / sum(step_s)
    ar_tok_s = len(ar_s) / sum(ar_s)
    return {
        **dataclasses.asdict(rec.shape),
        "prompts": rec.prompts,
        "new_tokens": rec.new_tokens,
        "steps": len(rec.steps),
        "S": rec.S,
        "step_ms_median": 1e3 * statistics.median(step_s),
        "step_ms_mean": 1e3 * statistics.mean(step_s),
        "slowest_rank_ms_mean": 1e3 * statistics.mean(slowest),
        "slowest_rank_share": sum(slowest) / sum(step_s),
        "slowest_rank_tokens_mean": statistics.mean(biggest),
        "allgather_ms": 1e3 * allgather_s,
        "tok_s": tok_s,
        "ar_tok_s": ar_tok_s,
        "speedup_vs_ar": tok_s / ar_tok_s,
    }


def worker_timer(worker, reps: int, seed: int = 0) -> Timer:
    """Times `worker.step` at a layout and cache length (median of `reps`, device synced);
    a layout's first use (layout upload, CUDA graph capture) runs once untimed."""
    gen = torch.Generator().manual_seed(seed)
    ids: dict[int, torch.Tensor] = {}
    seen: set[StepLayout] = set()

    def time_step(layout: StepLayout, length: int) -> float:
        if layout.size not in ids:
            ids[layout.size] = torch.randint(0, worker.vocab_size, (layout.size,), generator=gen).to(worker.device)
        worker.kv.reset()
        worker.kv.commit(length)  # KV contents do not matter for timing, only the length
        warm = 0 if layout in seen else 1
        seen.add(layout)
        return statistics.median(
            steps.timed(lambda: worker.step(ids[layout.size], layout, length + layout.m - 1), worker.device, reps, warm)
        )

    return time_step


def causal_steps(doc: dict, source: str = "costs") -> tuple[dict[int, float], bool]:
    """A `tools.steps` result `doc`'s median causal step seconds by token count, and whether
    that run used fixed-shape steps (`graphs`)."""
    try:
        measured = {
            int(row["tokens"]): float(row["median_ms"]) / 1e3 for row in doc["steps"] if row["kind"] == "causal"
        }
        fixed = bool(doc["graphs"])
    except (KeyError, TypeError, ValueError) as e:
        raise LPError(f"{source}: not a result of tools.steps ({type(e).__name__}: {e})") from None
    if not measured:
        raise LPError(f"{source}: no causal step times in it")
    return measured, fixed


def measured_timer(doc: dict, source: str = "costs") -> Timer:
    """A forward's time read from a `tools.steps` result `doc`: the median of its causal step
    of the same size, the size padded to its bucket where that run used fixed-shape steps
    (`graphs`), else interpolated between the sizes it measured. The cache length is ignored."""
    measured, fixed = causal_steps(doc, source)
    sizes = sorted(measured)

    def time_step(layout: StepLayout, length: int) -> float:
        T = bucket(layout.size) if fixed else layout.size
        if fixed and T in measured:
            return measured[T]
        if not fixed and sizes[0] <= T <= sizes[-1]:
            return float(np.interp(T, sizes, [measured[t] for t in sizes]))
        raise LPError(
            f"{source}: a rank's step of {layout.size} tokens needs a measured step of {T} tokens; "
            f"it has {', '.join(map(str, sizes))}"
        )

    return time_step


def read_costs(path: str) -> dict:
    """A `tools.steps` result file (one-line LPError if it cannot be read)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LPError(f"costs: cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("tool") != "tools.steps":
        raise LPError(f"costs: {path} is not a result of tools.steps")
    missing = [k for k in COSTS_KEYS if k not in doc]
    if missing:
        raise LPError(f"costs: {path} lacks {', '.join(missing)}")
    return doc


@dataclass
class Settings(steps.Engine):
    """The tool's keys; the engine's (arch, device, dtype, graphs, attention, seed) are the
    replay's, as tools.steps takes them."""

    model: str = "smollm2-135m"
    dataset: str = "spec_bench"
    prompts: str = ""
    per_category: int = 1
    limit: int = 0
    max_new_tokens: int = 128
    configs: str = DEFAULT_CONFIGS
    reps: int = 1
    allgather_reps: int = 200
    costs: str = ""
    out: str = ""

    def validate(self) -> Settings:
        for key, low in (("per_category", 1), ("limit", 0), ("max_new_tokens", 1), ("reps", 1), ("allgather_reps", 0)):
            if getattr(self, key) < low:
                raise LPError(f"{key} must be >= {low}, got {getattr(self, key)}")
        parse_configs(self.configs)
        self.validate_engine()
        return self

    @property
    def shapes(self) -> list[Shape]:
        return parse_configs(self.configs)


HELP = {
    "model": "the real model whose decode is recorded (default smollm2-135m; a name or a directory)",
    "dataset": "spec_bench | mt_bench | humaneval | gsm8k | jsonl (default spec_bench)",
    "prompts": "prompts file overriding the dataset's",
    "per_category": "prompts per category (1)",
    "limit": "at most this many prompts in all (0: no limit)",
    "max_new_tokens": "tokens each prompt decodes (128)",
    "configs": f"P:WxNyGz,... one configuration per P (default {DEFAULT_CONFIGS})",
    "arch": f"shape replayed, random weights: {', '.join(steps.ARCHS)} (default llama-7b)",
    "device": "auto | cpu | cuda (auto: cuda when available); recording and replay",
    "dtype": "auto | float32 | bfloat16 | float16 of the replay (auto: bfloat16 on cuda, float32 on cpu)",
    "graphs": "auto | true | false: lp's fixed-shape steps, CUDA graphs on a GPU (auto: on cuda)",
    "attention": "auto | sdpa | flex | split: lp's attention backend of the replay",
    "reps": "timed repetitions of each rank's forward (median; 1)",
    "allgather_reps": "all-gathers timed per P > 1 between P gloo processes (200; 0: not measured, counted 0)",
    "seed": "seed of the random weights and ids (0)",
    "costs": "a result of tools.steps (steps.json): its measured step times instead of a replay; "
    "arch, dtype, graphs and attention are then its own",
    "out": "results directory (default $LP_CACHE/bench/project/ARCH-DEVICE-DTYPE-TIME)",
}


def _progress(message: str) -> None:
    print(f"tools.project: {message}", file=sys.stderr, flush=True)


def run(cfg: Settings) -> dict:
    """Record, measure the all-gathers, replay; return the result document."""
    from lp import LP
    from lp.bench.datasets import load
    from lp.config import DecodeConfig
    from lp.message import step_message_size
    from tools.host import allgather_seconds

    costs = read_costs(cfg.costs) if cfg.costs else None
    if costs is not None and costs.get("arch") in steps.ARCHS:
        cfg.arch = costs["arch"]  # names the default results folder
    device = cfg.torch_device
    bench = load(cfg.dataset, cfg.prompts or None, per_category=cfg.per_category, limit=cfg.limit or None)
    lm = LP(cfg.model, device=str(device), graphs=False, compile=False)
    prompts = [lm.encode(p.text, chat=p.chat and lm.tokenizer.chat_template is not None) for p in bench]
    recordings = []
    for shape in cfg.shapes:
        t0 = time.perf_counter()
        recordings.append(record(lm, prompts, shape, cfg.max_new_tokens))
        _progress(
            f"recorded P={shape.P} W{shape.W}N{shape.N}G{shape.G}: {len(prompts)} prompts, "
            f"S={recordings[-1].S:.2f}, {time.perf_counter() - t0:.1f} s"
        )
    del lm
    gather = {}
    for shape in cfg.shapes:
        size = step_message_size(DecodeConfig(W=shape.W, N=shape.N, G=shape.G))
        med = (
            statistics.median(allgather_seconds(shape.P, size, cfg.allgather_reps))
            if shape.P > 1 and cfg.allgather_reps
            else 0.0
        )
        gather[shape.P] = {"int64": size, "median_ms": 1e3 * med, "measured": shape.P > 1 and cfg.allgather_reps > 0}
        _progress(f"all-gather P={shape.P}, {size} int64: {1e3 * med:.3f} ms")
    if costs is not None:
        timer = measured_timer(costs, cfg.costs)
        engine = {k: costs[k] for k in COSTS_KEYS if k != "steps"}
        engine.update(gpus=0, forwards=f"measured by tools.steps on {costs.get('started', '?')} ({cfg.costs})")
    else:
        t0 = time.perf_counter()
        model = steps.build(cfg.arch, device, cfg.torch_dtype, cfg.seed)
        _progress(f"built {cfg.arch} with random weights in {time.perf_counter() - t0:.1f} s; replaying")
        worker = cfg.worker(model)
        layouts = [(s, rank_layouts(s, r.shape)) for r in recordings for s in r.steps]
        try:
            worker.reset(max(s.length + s.m for s, _ in layouts), max(lay.size for _, ls in layouts for lay in ls))
        except LPError as e:
            raise LPError(f"{cfg.arch} cannot replay this decode: {e}") from None
        timer = worker_timer(worker, cfg.reps, cfg.seed)
        engine = {
            "arch": cfg.arch,
            "device": str(device),
            "device_name": steps.device_name(device),
            "dtype": str(cfg.torch_dtype).removeprefix("torch."),
            "graphs": cfg.use_graphs,
            "attention": worker.attention,
            "torch": torch.__version__,
            "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
            "forwards": "replayed here",
        }
    rows = []
    for rec in recordings:
        t0 = time.perf_counter()
        rows.append(project(rec, timer, gather[rec.shape.P]["median_ms"] / 1e3))
        _progress(
            f"projected P={rec.shape.P} on {engine['arch']}: {rows[-1]['tok_s']:.1f} tok/s, "
            f"{rows[-1]['speedup_vs_ar']:.2f}x mode=ar, {time.perf_counter() - t0:.1f} s"
        )
    return {
        "tool": "tools.project",
        "projection": PROJECTION if costs is None else MEASURED_PROJECTION,
        "model": cfg.model,
        "dataset": cfg.dataset,
        **engine,
        "weights": "random weights (timing only)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "settings": dataclasses.asdict(cfg),
        "allgather": gather,
        "nvlink_measured": False,
        "rows": rows,
    }


def markdown(r: dict) -> str:
    """The result as markdown, its first line the PROJECTION label."""
    gathered = (
        "median over P gloo processes on this host (CPU)"
        if any(g["measured"] for g in r["allgather"].values())
        else "not measured, counted as 0"
    )
    lines = [
        f"**{r['projection']}.**",
        "",
        f"# lp strong scaling, projected: {r['arch']} ({r['dtype']}) on {r['device_name']}",
        "",
        f"- S from {r['model']} decoding {r['dataset']} ({r['rows'][0]['prompts']} prompts, "
        f"{r['settings']['max_new_tokens']} new tokens at most) at world size 1",
        f"- forwards: {r['arch']}, {r['weights']}, on {r['device']} ({r['device_name']}), {r['forwards']}; "
        f"every rank's share of every recorded step; a step = slowest rank + all-gather",
        f"- all-gather: {gathered}; NCCL/NVLink latency not measured ({r['gpus']} GPU(s) here)",
        "- `mode=ar` (S = 1) replayed at the same cache lengths: the same engine's baseline"
        if r["forwards"] == "replayed here"
        else "- `mode=ar` (S = 1) priced by the same step-cost run (its 1-token step): the same engine's baseline",
        "",
        "| P | W,N,G | prompts | S | step ms median | step ms mean | slowest rank ms (share) | "
        "slowest rank tokens | all-gather ms | tok/s | mode=ar tok/s | speedup vs ar |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in r["rows"]:
        lines.append(
            f"| {w['P']} | {w['W']},{w['N']},{w['G']} | {w['prompts']} | {w['S']:.2f} | "
            f"{w['step_ms_median']:.3f} | {w['step_ms_mean']:.3f} | {w['slowest_rank_ms_mean']:.3f} "
            f"({w['slowest_rank_share']:.0%}) | {w['slowest_rank_tokens_mean']:.1f} | "
            f"{w['allgather_ms']:.3f} | {w['tok_s']:.1f} | {w['ar_tok_s']:.1f} | {w['speedup_vs_ar']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> Path:
    """Projected tokens/s (and mode=ar's) and speedup against P."""
    from lp.bench.plots import _plt, _save

    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.5))
    Ps = [w["P"] for w in r["rows"]]
    a.plot(Ps, [w["tok_s"] for w in r["rows"]], marker="o", label="lp (projected)")
    a.plot(Ps, [w["ar_tok_s"] for w in r["rows"]], marker="s", ls="--", label="lp mode=ar (same timing)")
    b.plot(Ps, [w["speedup_vs_ar"] for w in r["rows"]], marker="o", color="C2")
    for ax, label in ((a, "tokens/s"), (b, "speedup vs mode=ar")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ps, [str(p) for p in Ps])
        ax.set_xlabel("P (ranks)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle(
        f"PROJECTION: {r['arch']} {r['dtype']} on {r['device_name']}, S from {r['model']} on "
        f"{r['dataset']}\nmeasured: S, forwards ({r['forwards'].split(' (')[0]}), gloo all-gather; "
        f"not: cross-GPU interference, NVLink",
        fontsize=9,
    )
    return _save(plt, fig, path, rect=(0, 0, 1, 0.9))


def main(argv: list[str] | None = None) -> int:
    def parse(args: list[str]) -> Settings:
        return steps.parse_keys(args, Settings, HELP, "python -m tools.project", __doc__.splitlines()[0])

    return steps.tool_main("project", sys.argv[1:] if argv is None else argv, parse, run, markdown, plot)


if __name__ == "__main__":
    sys.exit(main())

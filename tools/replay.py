"""Replayed decodes: lp's decode loop timed end to end on a model of any shape, with random weights,
each step accepting what a recorded exact decode of a real model accepted.

    python -m tools.replay record [key=value ...]    a real model's decodes, each step's committed tokens
    python -m tools.replay run [key=value ...]       those decodes replayed on `arch`, timed
    (under `torchrun --nproc_per_node P` both run on P ranks; `--help` after the verb lists its keys)

`record` decodes the prompts with the real model (default SmolLM2-135M, greedy, exact) at every
config of `configs` (`ladder`: W=auto's shapes for this world size) and keeps each step's committed
tokens (one JSON file). `run` replays them with lp's own decode loop, as lp runs on the device: its
plans, trees and partition over the ranks, fixed-shape steps and CUDA graphs, the kept drafts' KV
on one replica, the host's drafting on the recorded text, the all-gather; only the acceptance is
the recording's (lp/verify/replay.py), whatever the random model's logits. So each decoder takes
the recorded decode's steps (same tokens committed per step, the same pending tokens and step
sizes) and its tokens/s is measured, not priced. `ar` (plain decoding) runs lp's `mode=ar` for
the recorded output's length; `auto` lets `W=auto` choose (its calibration timed here) and replays
the recording of the shape it chose. What is not the real decode's: the trees (the window's
guesses, the pool's n-grams from them and the successor table come from the random model's
logits), so a step's tree is another of the same size and the path its accepted drafts' KV is kept
from is another of the same depth where the tree has one (the result counts how often it had the
recorded path itself). The recording's tokens are mapped one to one onto `arch`'s vocabulary.

A recording of P ranks replays on P ranks (one replica keeps its drafts' KV, P > 1 re-feed them
and cut their shares to buckets: lp/decode/shares.py). Writes OUT/replay.json and .md (rank 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lp.bench.shapes import parse_lookahead
from lp.config import DecodeConfig
from lp.decode.loop import StepObserver
from lp.errors import LPError
from tools import pricing, steps

TOOL = "tools.replay"


@dataclass
class Recorder:
    """`record`'s keys."""

    model: str = "smollm2-135m"
    dataset: str = "spec_bench"
    prompts: str = ""
    per_category: int = 1
    limit: int = 0
    max_new_tokens: int = 128
    configs: str = "ladder"
    device: str = "cpu"
    out: str = ""

    def validate(self) -> Recorder:
        for key, low in (("per_category", 1), ("limit", 0), ("max_new_tokens", 1)):
            if getattr(self, key) < low:
                raise LPError(f"{key} must be >= {low}, got {getattr(self, key)}")
        if not self.out:
            raise LPError("record needs out=FILE.json")
        return self


@dataclass
class Replayer(steps.Engine):
    """`run`'s keys; the engine's (arch, device, dtype, graphs, attention, seed) as tools.steps takes them."""

    recording: str = ""
    decoders: str = "ar,auto"
    limit: int = 0
    warmup_tokens: int = 16
    out: str = ""

    def validate(self) -> Replayer:
        self.validate_engine()
        if not self.recording:
            raise LPError("run needs recording=FILE.json (made by `python -m tools.replay record`)")
        if self.limit < 0 or self.warmup_tokens < 0:
            raise LPError("limit and warmup_tokens must be >= 0")
        return self


HELP = {
    "model": "the real model that decodes (a name or a directory; default smollm2-135m)",
    "dataset": "spec_bench | mt_bench | humaneval | gsm8k | jsonl (default spec_bench)",
    "prompts": "prompts file overriding the dataset's",
    "per_category": "prompts per category (1)",
    "limit": "at most this many prompts in all (0: no limit)",
    "max_new_tokens": "tokens each prompt decodes at most (128)",
    "configs": "config names, comma separated (W3N3G15-L128-D14,...), or ladder: W=auto's shapes here",
    "device": "auto | cpu | cuda",
    "out": "record: the recording's file; run: the results directory (default $LP_CACHE/bench/replay/...)",
    "arch": f"shape replayed, random weights: {', '.join(steps.ARCHS)} (default llama-7b)",
    "dtype": "auto | float32 | bfloat16 | float16 (auto: bfloat16 on cuda, float32 on cpu)",
    "graphs": "auto | true | false: fixed-shape steps, CUDA graphs on a GPU (auto: on cuda)",
    "attention": "auto | sdpa | flex (auto: sdpa)",
    "seed": "seed of the random weights (0)",
    "recording": "a recording of `python -m tools.replay record` (of this world size)",
    "decoders": "what is replayed, comma separated: ar, auto, or config names of the recording (ar,auto)",
    "warmup_tokens": "each decoder's untimed first decode, on the first prompt, of this many tokens (16)",
}


def _progress(message: str) -> None:
    print(f"{TOOL}: {message}", file=sys.stderr, flush=True)


def _names(configs: str) -> list[str]:
    return [c.strip() for c in configs.split(",") if c.strip()]


# ----------------------------------------------------------------------------------- record
def split_steps(output: list[int], accepted: list[int]) -> list[list[int]]:
    """A decode's output cut into its steps' committed tokens."""
    out, at = [], 0
    for n in accepted:
        out.append(output[at : at + n])
        at += n
    return out


def record(cfg: Recorder) -> dict:
    """Decode every prompt with every config; the recording (on every rank; rank 0 writes it)."""
    from lp import LP
    from lp.bench.datasets import load
    from lp.decode.ladder import ladder

    lm = LP(cfg.model, device=cfg.device, tp=1, draft_memory=0)
    P = lm.lp.world_size
    names = [s.name for s in ladder(P)] if cfg.configs == "ladder" else _names(cfg.configs)
    for name in names:
        DecodeConfig(**parse_lookahead(name)).validate()  # a bad name fails before any decode
    bench = load(cfg.dataset, cfg.prompts or None, per_category=cfg.per_category, limit=cfg.limit or None)
    prompts = []
    for p in bench:
        ids = lm.encode(p.text, chat=p.chat and lm.tokenizer.chat_template is not None)
        decodes = {}
        for name in names:
            t0 = time.perf_counter()
            r = lm.generate(ids, max_new_tokens=cfg.max_new_tokens, **parse_lookahead(name))
            decodes[name] = {"steps": split_steps(r.output_ids, r.accepted_per_step), "S": r.S}
            _progress(f"{p.id} {name}: S {r.S:.2f}, {time.perf_counter() - t0:.1f} s")
        outputs = {tuple(t for s in d["steps"] for t in s) for d in decodes.values()}
        if len(outputs) > 1:
            raise LPError(f"prompt {p.id}: the configs' outputs differ, so one is not greedy decoding's")
        prompts.append({"id": p.id, "category": p.category, "prompt_ids": ids, "decodes": decodes})
    lm.close()  # before exit: a process group torn down at exit beside a gone peer aborts the process
    return {
        "tool": TOOL,
        "kind": "recording",
        "model": cfg.model,
        "dataset": cfg.dataset,
        "device": steps.device_name(lm.comm.device),
        "world_size": P,
        "max_new_tokens": cfg.max_new_tokens,
        "configs": names,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": "python -m tools.replay record " + " ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()),
        "prompts": prompts,
    }


# ----------------------------------------------------------------------------------- run
def read_recording(path: str) -> dict:
    """A recording file (one-line LPError if it is not one)."""
    doc = pricing.read_json(Path(path), "recording")
    if doc.get("kind") != "recording" or not doc.get("prompts"):
        raise LPError(f"recording: {path} is not a recording of python -m tools.replay record")
    return doc


def token_map(doc: dict, vocab: int) -> dict[int, int]:
    """The recording's tokens, one to one, onto ids below `vocab` (in order of first appearance)."""
    seen: dict[int, int] = {}
    for p in doc["prompts"]:
        for t in [*p["prompt_ids"], *(t for d in p["decodes"].values() for s in d["steps"] for t in s)]:
            seen.setdefault(t, len(seen))
    if len(seen) > vocab:
        raise LPError(f"recording: its {len(seen)} distinct tokens do not fit the replayed model's {vocab}")
    return seen


class StepClock(StepObserver):
    """Each step's wall time: from the last message read to its own (the first step's: from its
    forward's start, after the prefill)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last: float | None = None

    def prefill_done(self) -> None:
        self.seconds, self._last = [], None

    def forward_start(self) -> None:
        if self._last is None:
            self._last = time.perf_counter()

    def message_read(self) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self._last)
        self._last = now


@dataclass
class Replay:
    """Replays a recording's decodes on one worker (on every rank alike)."""

    decoder: object  # lp.decode.loop.Decoder
    doc: dict
    ids: dict[int, int]
    tuner: object | None = None  # lp.decode.auto.AutoTuner, for `auto`
    rows: list[dict] = field(default_factory=list)

    def decode(self, prompt: dict, name: str, max_new: int | None = None) -> dict:
        """One decode of `prompt` by decoder `name` (ar, auto or a recorded config), its row."""
        from lp.verify.replay import ReplayVerifier

        chose, shape = name, None
        if name == "auto":
            shape, _ = self.tuner.choose()
            chose = "ar" if shape is None else shape.name
        ids = [self.ids[t] for t in prompt["prompt_ids"]]
        recorded = next(iter(prompt["decodes"].values())) if chose == "ar" else prompt["decodes"].get(chose)
        if recorded is None:  # W=auto chose a shape not recorded: the row says so, nothing is timed
            if name != "auto":
                raise LPError(f"the recording has no {name} (it has {', '.join(prompt['decodes'])})")
            return {"id": prompt["id"], "decoder": name, "config": chose, "skipped": "not recorded"}
        committed = [[self.ids[t] for t in s] for s in recorded["steps"]]
        total = sum(map(len, committed))
        n = min(total, max_new or total)
        clock, worker = StepClock(), self.decoder.worker
        if chose == "ar":
            g = self.decoder.generate(ids, DecodeConfig(mode="ar", max_new_tokens=n), observer=clock)
            kinds = {}
        else:
            cfg = DecodeConfig(**parse_lookahead(chose), max_new_tokens=n)
            verifier = ReplayVerifier(committed, cfg.max_commit, worker.device)
            g = self.decoder.generate(ids, cfg, verifier=verifier, observer=clock)
            kinds = verifier.kinds
        if name == "auto" and max_new is None:
            self.tuner.observe(statistics.mean(g.whole_per_step) if shape is not None else 1, g.S, g.steps)
        want = [len(s) for s in committed] if chose != "ar" else [1] * n
        return {
            "id": prompt["id"],
            "decoder": name,
            "config": chose,
            "new_tokens": g.new_tokens,
            "steps": g.steps,
            "S": g.S,
            "recorded_S": total / len(committed) if chose != "ar" else 1.0,
            "same_steps": g.accepted_per_step == want[: len(g.accepted_per_step)] and sum(g.accepted_per_step) == n,
            "identical": None if chose == "ar" else g.output_ids == [t for s in committed for t in s][:n],
            "seconds": g.seconds,
            "tok_s": g.tokens_per_s,
            "step_ms": [1e3 * s for s in clock.seconds],
            "fed_max": max(g.fed_per_step, default=0),
            "kinds": kinds,
        }


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per decoder: tokens/s pooled (all tokens over all seconds) and the median over prompts,
    the median per-prompt ratio to `ar` where it ran, S, and the slowest step against its
    prompt's median step; rows not timed (W=auto's choice not recorded) left out."""
    rows = [r for r in rows if "skipped" not in r]
    ar = {r["id"]: r["tok_s"] for r in rows if r["decoder"] == "ar"}
    ar_pooled = _pooled([r for r in rows if r["decoder"] == "ar"])
    out = []
    for name in names:
        mine = [r for r in rows if r["decoder"] == name]
        if not mine:
            continue
        ratios = [r["tok_s"] / ar[r["id"]] for r in mine if r["id"] in ar]
        out.append(
            {
                "decoder": name,
                "prompts": len(mine),
                "tok_s": _pooled(mine),
                "tok_s_median": statistics.median(r["tok_s"] for r in mine),
                "vs_ar": statistics.median(ratios) if ratios and name != "ar" else None,
                "vs_ar_pooled": _pooled(mine) / ar_pooled if ratios and name != "ar" else None,
                "S": sum(r["new_tokens"] for r in mine) / sum(r["steps"] for r in mine),
                "same_steps": sum(r["same_steps"] for r in mine),
                "worst_step_vs_median": max(max(r["step_ms"]) / statistics.median(r["step_ms"]) for r in mine),
                "configs": sorted({r["config"] for r in mine}),
                "kinds": {k: sum(r["kinds"].get(k, 0) for r in mine) for k in ("path", "depth", "short", "none")},
            }
        )
    return out


def _pooled(rows: list[dict]) -> float:
    """All the rows' tokens over all their seconds (0 where there are none)."""
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / seconds if seconds else 0.0


def run(cfg: Replayer) -> dict:
    """Build `arch` with random weights on every rank and replay the recording's decodes."""
    from lp.collective import Collective
    from lp.decode.auto import AutoTuner, calibrate_ranks
    from lp.decode.loop import Decoder

    doc = read_recording(cfg.recording)
    comm = Collective.from_env(cfg.device, 300.0)
    P = comm.world_size
    if doc["world_size"] != P:
        raise LPError(f"recording: made on {doc['world_size']} rank(s), replayed on {P}: record it on {P}")
    names = _names(cfg.decoders)
    prompts = doc["prompts"][: cfg.limit or None]
    t0 = time.perf_counter()
    model = steps.build(cfg.arch, comm.device, cfg.torch_dtype, cfg.seed)
    worker = cfg.worker(model)
    decoder = Decoder(worker, comm, set(), steps.ARCHS[cfg.arch].max_context)
    replay = Replay(decoder, doc, token_map(doc, worker.vocab_size))
    _progress(f"built {cfg.arch} in {time.perf_counter() - t0:.1f} s")
    if "auto" in names:
        t0 = time.perf_counter()
        replay.tuner = AutoTuner(calibrate_ranks(worker, comm, P), P)
        _progress(f"W=auto calibrated in {time.perf_counter() - t0:.1f} s")
    for name in names:  # untimed: the decoders' first steps (caches, allocator), W=auto's choice untaught
        if cfg.warmup_tokens:
            # where the compiler's cache is cold (a fresh GPU machine) each bucket compiles here first
            t0 = time.perf_counter()
            replay.decode(prompts[0], name, cfg.warmup_tokens)
            _progress(f"{name} warmed up in {time.perf_counter() - t0:.1f} s")
    for prompt in prompts:  # interleaved, so a slow spell of the machine touches every decoder
        for name in names:
            replay.rows.append(replay.decode(prompt, name))
            r = replay.rows[-1]
            said = r["skipped"] if "skipped" in r else f"{r['tok_s']:.1f} tok/s, S {r['S']:.2f}"
            _progress(f"{r['id']} {name} ({r['config']}): {said}")
    comm.close()  # before exit: a process group torn down at exit beside a gone peer aborts the process
    cuda = comm.device.type == "cuda"
    return {
        "tool": TOOL,
        "weights": steps.RANDOM_WEIGHTS,
        "arch": cfg.arch,
        "device": str(comm.device),
        "device_name": steps.device_name(comm.device),
        "world_size": P,
        "torch": torch.__version__,
        "dtype": str(cfg.torch_dtype).removeprefix("torch."),
        "graphs": cfg.use_graphs,
        "attention": worker.attention,
        "recording": {k: doc[k] for k in ("model", "dataset", "device", "world_size", "started", "command")},
        "settings": dataclasses.asdict(cfg),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "max_memory_allocated_mib": torch.cuda.max_memory_allocated(comm.device) / 2**20 if cuda else None,
        "capture_seconds": dict(worker.fixed.capture_seconds) if worker.fixed is not None else {},
        "auto": None
        if replay.tuner is None
        else {
            "slope": replay.tuner.slope(),
            "costs": replay.tuner.cost.seconds,
            "drafting": replay.tuner.cost.drafting,
        },
        "rows": replay.rows,
        "summary": summarize(replay.rows, names),
        "is_main": comm.is_main,
    }


def markdown(r: dict) -> str:
    rec = r["recording"]
    lines = [
        f"# Replayed decodes: {r['arch']} ({r['dtype']}) on {r['device_name']}, {r['world_size']} rank(s)",
        "",
        f"- weights: **{r['weights']}**; each step accepts what the recorded exact decode of "
        f"{rec['model']} ({rec['dataset']}, recorded on {rec['device']}, {rec['started']}) accepted",
        "- measured end to end: lp's decode loop (plans, trees, partition, fixed-shape steps, kept KV, host "
        "work, all-gather); not the real decode's: the trees (window, pool and successors from random logits)",
        f"- torch {r['torch']}; graphs {str(r['graphs']).lower()}; attention {r['attention']}; {r['started']}",
        "",
        "| decoder | configs | prompts | S | tok/s (pooled) | tok/s median | x `ar` (median of prompts) | "
        "same steps | worst step / its prompt's median | recorded path found (path/depth/short/none) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["summary"]:
        vs = "" if s["vs_ar"] is None else f"**{s['vs_ar']:.2f}x**"
        k = s["kinds"]
        lines.append(
            f"| {s['decoder']} | {', '.join(s['configs'])} | {s['prompts']} | {s['S']:.2f} | {s['tok_s']:.1f} | "
            f"{s['tok_s_median']:.1f} | {vs} | {s['same_steps']}/{s['prompts']} | {s['worst_step_vs_median']:.2f}x | "
            f"{k['path']}/{k['depth']}/{k['short']}/{k['none']} |"
        )
    skipped = sorted({(x["decoder"], x["config"]) for x in r["rows"] if "skipped" in x})
    lines += [
        f"- {name} chose {config} on some prompt, which the recording lacks: not timed" for name, config in skipped
    ]
    if r["max_memory_allocated_mib"] is not None:
        lines += ["", f"- GPU memory at most {r['max_memory_allocated_mib']:.0f} MiB (max_memory_allocated)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verbs = {"record": Recorder, "run": Replayer}
    if not argv or argv[0] not in verbs:
        sys.exit(f"usage: python -m {TOOL} record|run [key=value ...] (--help after the verb lists the keys)")
    verb, cls = argv[0], verbs[argv[0]]
    keys = {f.name: HELP[f.name] for f in dataclasses.fields(cls)}
    try:
        cfg = steps.parse_keys(argv[1:], cls, keys, f"python -m {TOOL} {verb}", __doc__.splitlines()[0])
        doc = record(cfg) if verb == "record" else run(cfg)
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    if verb == "record":
        if int(os.environ.get("RANK", "0")) == 0:
            Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.out).write_text(json.dumps(doc) + "\n")
            _progress(f"recording in {cfg.out}")
        return 0
    if doc.pop("is_main"):
        out = Path(cfg.out) if cfg.out else steps.cache_dir() / "bench" / "replay" / time.strftime("%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay.json").write_text(json.dumps(doc, indent=1) + "\n")
        text = markdown(doc)
        (out / "replay.md").write_text(text)
        print(text)
        _progress(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Recorder", "Replayer", "main", "read_recording", "record", "run", "split_steps", "token_map"]

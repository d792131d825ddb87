"""`python -m tools.memory`: the draft memory (lp/lookahead/memory.py) measured: S with it against
S without it, one run side by side, and what it costs.

    python -m tools.memory [--spec 48] [--mt 24] [--humaneval 32] [--max-new-tokens 128]
        [--shapes W3N3G15-L128-D14,auto] [--workloads spec,mt2,humaneval,repeat] [--budget 65536]
        [--warm 0] [--noise] [--out results/memory]   (written after every workload: a run stopped early keeps them)

Four workloads, each decoded in order by one LP (SmolLM2-135M, greedy), once per shape with a
memory cleared at its start, or with `--warm N`, the memory of a server that has served N earlier
requests of the same kinds of text, none of them measured (`warm_memory`):
  * `spec`: the Spec-Bench prompts (8 a category, chat);
  * `mt2`: MT-Bench conversations: the first turn, then the second after it (the first answer in
    its prompt); S counted on the second turns;
  * `humaneval`: HumanEval completions in sequence (code, no chat template): one programming
    language and its idioms again and again;
  * `repeat`: the Spec-Bench prompts, then each of them again (retried and popular questions): S
    counted on the second pass.
Each prompt is decoded twice in a row at the shape: `memory=false` (neither drawing on the memory
nor teaching it) and `memory=true` (drawing on every earlier prompt's text and starting from their
counts of the sources' rates, then adding its own).
Both outputs must equal transformers' greedy `generate` (cached in OUT/references.json). S is the
committed tokens over the steps, pooled over the workload's prompts; per prompt, the ratio of
the two steps counts (deterministic at a fixed shape: S does not depend on the machine's speed;
at `auto` the shapes are chosen by its step costs) tells whether any
prompt took more steps with the memory. With `--noise`, at a shape of a fixed step size (`-L`), each
prompt is also decoded without the memory at one token fewer and one more a step: changes that
neither help nor hurt (a tree loses or gains its least likely node) but move the course of the
decode (what a step verifies teaches the next trees), so their step ratios are the per-prompt
noise that the memory's ratios are judged against. At a fixed shape (no `auto`), the texts'
ceiling (tools/memory_ceiling.py): S had every step of either decode also been offered the longest
right continuation that the memory's texts held at its position, an estimate of the most any
drafting from these texts could add. The host's work after each message read (the time a
device waits for the host; StepObserver) is timed per step with and without.

The memory's cost: a fresh memory of `--budget` tokens fed 1,000 texts (the run's prompt tails
and outputs, cycled): the bytes its arrays hold (empty and full), the time an add takes, and the time
to save it to a file and load it back (its size).

Writes OUT/memory.json, OUT/memory.md and OUT/memory.png, with the command, the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lp.bench.shapes import parse_lookahead
from lp.config import DecodeConfig
from lp.decode.batch import StepObserver
from lp.engine.kernel_choice import cpu_name
from lp.lookahead.text import MIN_MATCH
from tools import memory_ceiling

WORKLOADS = ("spec", "mt2", "humaneval", "repeat")
SIDES = ("without", "with")
TEXTS = 1000  # texts fed to the memory whose cost is measured
REPS = 3  # saves and loads timed
WARM_BATCH = 32  # the warming requests decoded together, as a server under load does


class HostClock(StepObserver):
    """The seconds from each step's message read to the next forward's start: host work a device waits for."""

    def __init__(self) -> None:
        self.read_at: float | None = None
        self.seconds: list[float] = []

    def message_read(self) -> None:
        self.read_at = time.perf_counter()

    def forward_start(self) -> None:
        if self.read_at is not None:
            self.seconds.append(time.perf_counter() - self.read_at)
        self.read_at = None


def conversations(n: int) -> list[tuple[str, str]]:
    """The first `n` MT-Bench questions' two turns."""
    from lp.bench.datasets import _jsonl_rows, wheel_file

    rows = _jsonl_rows(wheel_file("mt_bench"))[:n]
    return [(r["turns"][0], r["turns"][1]) for r in rows]


class Run:
    """One LP and the greedy references its outputs are checked against."""

    def __init__(self, lm, references, max_new: int, noise: bool = False) -> None:
        self.lm, self.refs, self.max_new, self.noise = lm, references, max_new, noise

    def reference(self, ids: list[int]) -> list[int]:
        import torch

        out = self.refs.get(ids, self.max_new)
        if out is None:
            x = torch.tensor([ids], dtype=torch.long)
            with torch.no_grad():
                y = self.lm.model.generate(
                    x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=self.max_new
                )
            out = y[0, len(ids) :].tolist()
            self.refs.put(ids, self.max_new, out)
        return out

    def decode(self, ids: list[int], settings: dict, memory: bool) -> dict:
        clock = HostClock()
        t = time.perf_counter()
        r = self.lm.generate(ids, memory=memory, observer=clock, max_new_tokens=self.max_new, **settings)
        return {
            "tokens": r.new_tokens,
            "steps": r.steps,
            "seconds": time.perf_counter() - t,
            "host_s": clock.seconds,
            "output_ids": r.output_ids,
            "text": r.text,
            "accepted": r.accepted_per_step,
        }

    def pair(self, ids: list[int], settings: dict) -> dict:
        """One prompt without the memory, then with it (which adds its text), and with `noise` at a
        fixed step size, without it at one token fewer and one more a step: all checked."""
        row = {"without": self.decode(ids, settings, False)}
        fixed = all(settings.get(key) != "auto" for key in ("W", "N", "G"))  # a tree depth known up front
        texts = self.lm.memory.texts() if fixed else None  # what the decode with the memory draws on
        row["with"] = self.decode(ids, settings, True)
        if texts is not None:  # the texts' ceiling on either course (tools/memory_ceiling.py)
            depth = DecodeConfig(**settings).max_draft  # the longest draft a step verifies
            reaches = {side: memory_ceiling.reach(texts, ids, row[side]["output_ids"], depth) for side in SIDES}
            row["ceiling"] = {side: memory_ceiling.steps_with(row[side]["accepted"], reaches[side]) for side in SIDES}
            row["ceiling"]["short"] = memory_ceiling.short_steps(row["with"]["accepted"], reaches["with"])
        if self.noise and "step_tokens" in settings:
            T = settings["step_tokens"]
            row["noise"] = [self.decode(ids, settings | {"step_tokens": T + d}, False) for d in (-1, 1)]
        ref = self.reference(ids)
        same = all(d["output_ids"] == ref for d in (row["without"], row["with"], *row.get("noise", [])))
        return row | {"identical": same, "prompt_ids": ids}


def progress(items, desc: str, total: int | None = None):
    """`items` with a progress bar on stderr (long runs: a line every 10 s at most)."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, file=sys.stderr, mininterval=10, ncols=100)


def warm_prompts(n: int, measured: int, mt: int) -> list[str]:
    """`n` Spec-Bench prompts that no workload measures: each group's past its first `measured` (the
    `spec` workload's), MT-Bench's past its first `mt` too (the `mt2` conversations'), round robin
    over the groups."""
    from lp.bench.datasets import load, round_robin

    groups: dict[str, list[str]] = {}
    for p in load("spec_bench"):
        groups.setdefault(p.category, []).append(p.text)
    skip = {group: max(measured, mt) if group == "mt_bench" else measured for group in groups}
    order = round_robin(texts[skip[group] :] for group, texts in groups.items())
    if len(order) < n:
        raise SystemExit(f"--warm {n}: Spec-Bench has {len(order)} prompts that no workload measures")
    return order[:n]


def warm_memory(lm, prompts: list[str], max_new: int, path: Path) -> dict:
    """The draft memory of a server that has answered `prompts` (chat, greedy, `max_new` tokens,
    WARM_BATCH at a time at `W=auto`), saved to `path`; a memory saved there before by the same
    requests is reused (`path` with `.json`: a digest of what taught it; the same model's, as
    `load_memory` refuses another's). Each workload starts from it."""
    taught = path.with_suffix(".json")
    what = json.dumps({"prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(), "max_new": max_new})
    if not (path.exists() and taught.exists() and taught.read_text() == what):
        lm.clear_memory()
        t = time.perf_counter()
        answers = lm.stream(prompts, chat=True, batch=WARM_BATCH, max_new_tokens=max_new)
        for _ in progress(answers, desc="warming the memory", total=len(prompts)):
            pass
        lm.save_memory(path)
        taught.write_text(what)
        print(f"memory: warmed by {len(prompts)} requests in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    lm.load_memory(path)
    return {"requests": len(prompts), "tokens": lm.memory.tokens, "file": path.name}


def workload(run: Run, name: str, items: list, settings: dict, warm: Path | None = None) -> list[dict]:
    """A workload's prompts in order, each a pair (mt2: its first turn decoded with the memory first;
    repeat: every prompt decoded with it once before), from an empty memory or the `warm` one."""
    lm = run.lm
    if warm is None:
        lm.clear_memory()
    else:
        lm.load_memory(warm)
    if name == "repeat":
        for ids in progress(items, desc="repeat, first pass"):
            run.decode(ids, settings, True)
    out = []
    for item in progress(items, desc=name):
        if name == "mt2":
            first, second = item
            turn1 = run.decode(lm.encode(first, chat=True), settings, True)
            ids = lm.encode(
                [
                    {"role": "user", "content": first},
                    {"role": "assistant", "content": turn1["text"]},
                    {"role": "user", "content": second},
                ]
            )
            row = run.pair(ids, settings)
            row["turn1_identical"] = turn1["output_ids"] == run.reference(lm.encode(first, chat=True))
        else:
            row = run.pair(item, settings)
        out.append(row)
    return out


def _S(decodes: list[dict]) -> float:
    """The decodes' committed tokens over their steps, pooled."""
    return sum(d["tokens"] for d in decodes) / sum(d["steps"] for d in decodes)


def summary(rows: list[dict]) -> dict:
    """A workload's S with and without the memory (pooled), per-prompt step ratios, host times; the
    noise (`--noise`) and the texts' ceiling (fixed shapes) where measured."""

    def S(side: str) -> float:
        return _S([r[side] for r in rows])

    ratios = [r["without"]["steps"] / r["with"]["steps"] for r in rows]
    host = {side: statistics.median([s for r in rows for s in r[side]["host_s"]]) * 1e3 for side in SIDES}
    seconds = {side: sum(r[side]["seconds"] for r in rows) for side in SIDES}
    tokens = sum(r["with"]["tokens"] for r in rows)
    noise = {} if "noise" not in rows[0] else _noise(rows, ratios)
    ceiling = {} if "ceiling" not in rows[0] else _ceiling(rows, S("without"))
    return (
        noise
        | ceiling
        | {
            "prompts": len(rows),
            "S_without": S("without"),
            "S_with": S("with"),
            "ratio": S("with") / S("without"),
            "per_prompt_step_ratio_min": min(ratios),
            "per_prompt_step_ratio_median": statistics.median(ratios),
            "prompts_more_steps_with": sum(r["with"]["steps"] > r["without"]["steps"] for r in rows),
            "host_ms_per_step_median": host,
            "tokens_per_s": {side: tokens / seconds[side] for side in seconds},
            "identical": all(r["identical"] and r.get("turn1_identical", True) for r in rows),
        }
    )


def prompts_detail(rows: list[dict]) -> list[dict]:
    """What the run keeps of each prompt: tokens and steps without and with the memory, the
    neutral changes' steps (`--noise`) and the texts' ceiling (fixed shapes: either course's steps,
    and the steps with the memory short of the texts' reach)."""
    return [
        {side: {k: r[side][k] for k in ("tokens", "steps")} for side in SIDES}
        | ({"noise_steps": [n["steps"] for n in r["noise"]]} if "noise" in r else {})
        | ({"texts_ceiling": r["ceiling"]} if "ceiling" in r else {})
        for r in rows
    ]


def _noise(rows: list[dict], ratios: list[float]) -> dict:
    """The neutral changes' step ratios (`--noise`: without the memory, the step size's neighbours
    against it) and the prompts the memory slowed (a ratio below 1) by more than they move a decode:
    below the 5th percentile of every prompt's neutral ratios, and below both of its own."""
    neutral = [[r["without"]["steps"] / n["steps"] for n in r["noise"]] for r in rows]
    pooled = sorted(x for xs in neutral for x in xs)
    p5 = pooled[round(0.05 * (len(pooled) - 1))]  # numpy's "nearest" percentile
    own = [min(1.0, *xs) for xs in neutral]
    return {
        "S_neighbours": [_S([r["noise"][i] for r in rows]) for i in (0, 1)],
        "noise_ratio_p5": p5,
        "noise_ratio_min": pooled[0],
        "prompts_slower_beyond_p5": sum(x < min(1.0, p5) for x in ratios),
        "prompts_slower_beyond_own": sum(x < o for x, o in zip(ratios, own)),
    }


def _ceiling(rows: list[dict], S_without: float) -> dict:
    """The texts' ceiling (tools/memory_ceiling.py): S had each step of either course also been
    offered the longest right continuation the memory's texts held, against S without the memory
    (`S_without`); and the steps with the memory at whose start the texts reached further than the
    step accepted, of all its steps."""
    S = {side: sum(r[side]["tokens"] for r in rows) / sum(r["ceiling"][side] for r in rows) for side in SIDES}
    return {
        "texts_ceiling_S": S,
        "texts_ceiling_ratio": {side: S[side] / S_without for side in SIDES},
        "texts_short_steps": {
            "steps": sum(r["ceiling"]["short"] for r in rows),
            "of": sum(r["with"]["steps"] for r in rows),
        },
    }


def cost(texts: list[tuple[list[int], list[int]]], budget: int) -> dict:
    """A fresh memory of `budget` tokens fed TEXTS texts (cycled): the bytes it holds, add time,
    save and load times (the fastest of REPS: the first may compile the code that writes or reads
    it), file size."""
    from lp.lookahead.memory import DraftMemory

    memory = DraftMemory(budget)
    empty = memory.nbytes
    t = time.perf_counter()
    for i in range(TEXTS):
        memory.add(*texts[i % len(texts)])
    add_s = (time.perf_counter() - t) / TEXTS
    full = memory.nbytes
    me = {"model": "measured", "tokenizer": "measured"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.lp"
        save_s = load_s = math.inf
        for _ in range(REPS):
            t = time.perf_counter()
            memory.save(path, me)
            save_s = min(save_s, time.perf_counter() - t)
            t = time.perf_counter()
            loaded = DraftMemory.load(path, budget, me)
            load_s = min(load_s, time.perf_counter() - t)
        size = path.stat().st_size
    assert loaded.tokens == memory.tokens
    return {
        "budget_tokens": budget,
        "texts": TEXTS,
        "tokens_held": memory.tokens,
        "mib_empty": empty / 2**20,
        "mib_after": full / 2**20,
        "add_ms": add_s * 1e3,
        "save_s": save_s,
        "load_s": load_s,
        "file_mib": size / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=int, default=48, help="Spec-Bench prompts (a multiple of 6: 6 categories)")
    ap.add_argument("--mt", type=int, default=24, help="MT-Bench conversations")
    ap.add_argument("--humaneval", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--shapes", default="W3N3G15-L128-D14,auto")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--budget", type=int, default=65536, help="the memory's tokens")
    ap.add_argument("--warm", type=int, default=0, help="earlier requests that taught the memory (0: empty)")
    ap.add_argument("--noise", action="store_true", help="the step size's neighbours too (shapes with -L)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("results/memory"))
    args = ap.parse_args(argv)
    if args.noise and not any("step_tokens" in parse_lookahead(s) for s in args.shapes.split(",")):
        ap.error("--noise needs a shape of a fixed step size (-L: W3N3G15-L128-D14)")
    from lp import LP
    from lp.bench.datasets import load
    from lp.bench.references import References

    args.out.mkdir(parents=True, exist_ok=True)
    lm = LP(args.model, draft_memory=args.budget)
    run = Run(lm, References(args.out / "references.json"), args.max_new_tokens, args.noise)
    spec = load("spec_bench", per_category=args.spec // 6)
    items = {
        "spec": [lm.encode(p.text, chat=p.chat) for p in spec],
        "mt2": conversations(args.mt),
        "humaneval": [lm.encode(p.text, chat=False) for p in load("humaneval", limit=args.humaneval)],
    }
    items["repeat"] = items["spec"]
    doc: dict = {
        "command": "python -m tools.memory " + shlex.join(sys.argv[1:] if argv is None else argv),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "model": args.model,
        "max_new_tokens": args.max_new_tokens,
        "budget_tokens": args.budget,
        "results": [],
    }
    warm = None
    if args.warm:
        warm = args.out / "warm_memory.lp"
        prompts = warm_prompts(args.warm, args.spec // 6, args.mt)
        doc["warm"] = warm_memory(lm, prompts, args.max_new_tokens, warm)
    texts: list[tuple[list[int], list[int]]] = []
    for shape in args.shapes.split(","):
        settings = parse_lookahead(shape)  # a lp.bench config name (W3N3G15-L128-D14), or auto
        for name in args.workloads.split(","):
            rows = workload(run, name, items[name], settings, warm)
            texts += [(r["prompt_ids"], r["with"]["output_ids"]) for r in rows]
            entry = {"shape": shape, "workload": name, **summary(rows)}
            entry["prompts_detail"] = prompts_detail(rows)
            doc["results"].append(entry)
            print(
                f"memory: {shape} {name}: S {entry['S_without']:.2f} -> {entry['S_with']:.2f} "
                f"({entry['ratio']:.2f}x), identical {entry['identical']}",
                file=sys.stderr,
                flush=True,
            )
            write(doc, args.out)  # after every workload: a run stopped early keeps what it measured
    doc["cost"] = cost(texts, args.budget)
    lm.close()
    write(doc, args.out)
    print(markdown(doc))
    return 0 if all(r["identical"] for r in doc["results"]) else 1


def write(doc: dict, out: Path) -> None:
    (out / "memory.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "memory.md").write_text(markdown(doc))
    plot(doc, out / "memory.png")


def on_the_machine(doc: dict) -> str:
    """What of the run's S depends on the machine: nothing at a fixed shape; at `auto`, the shapes."""
    if all(r["shape"] != "auto" for r in doc["results"]):
        return "S does not depend on the machine"
    return "S at a fixed shape does not depend on the machine; at `auto` the shapes are chosen by its step costs"


def markdown(doc: dict) -> str:
    c, w = doc.get("cost"), doc.get("warm")  # the cost is measured at the run's end
    start = (
        f"restored at each workload's start to what {w['requests']} earlier requests taught it ({w['tokens']} "
        f"tokens: Spec-Bench prompts that no workload measures, chat, {WARM_BATCH} at a time at `W=auto`, as a "
        "server answers them)"
        if w
        else "cleared at each workload's start"
    )
    lines = [
        "# The draft memory: S with it and without it",
        "",
        f"`{doc['command']}` on {doc['device']}, {doc['date']}; {doc['model']}, greedy, "
        f"{doc['max_new_tokens']} new tokens, a memory of {doc['budget_tokens']} tokens {start}. "
        "Each prompt decoded without the memory, then with it, in order; S pooled over "
        f"the prompts ({on_the_machine(doc)}); every output checked against transformers' "
        "greedy `generate`.",
        "",
        "| shape | workload | prompts | S without | S with | ratio | per-prompt steps ratio (min, median) "
        "| prompts with more steps | host ms/step (without, with) | tokens/s (without, with) | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        h, v = r["host_ms_per_step_median"], r["tokens_per_s"]
        lines.append(
            f"| {r['shape']} | {r['workload']} | {r['prompts']} | {r['S_without']:.2f} | {r['S_with']:.2f} | "
            f"**{r['ratio']:.2f}x** | {r['per_prompt_step_ratio_min']:.2f}, {r['per_prompt_step_ratio_median']:.2f} "
            f"| {r['prompts_more_steps_with']} | {h['without']:.3f}, {h['with']:.3f} | "
            f"{v['without']:.1f}, {v['with']:.1f} | {'yes' if r['identical'] else '**no**'} |"
        )
    lines += [
        "",
        "Workloads: `spec` the Spec-Bench prompts in order (8 a category); `mt2` MT-Bench second turns, "
        "each after its first turn (decoded with the memory, teaching it); `humaneval` HumanEval "
        "completions in sequence; `repeat` the Spec-Bench prompts asked a second time. Host ms/step: "
        "the median time from a step's message read to the next "
        "forward (what a device waits for), on this CPU. tokens/s: this CPU, the whole decodes.",
        "",
    ]
    for r in (r for r in doc["results"] if "noise_ratio_p5" in r):
        lines += [
            f"**Noise** ({r['shape']}, {r['workload']}): without the memory at one token fewer and one more a step, "
            f"S {r['S_neighbours'][0]:.2f} and {r['S_neighbours'][1]:.2f} (against {r['S_without']:.2f}); "
            f"those neutral changes moved a prompt's steps by ratios down to {r['noise_ratio_min']:.2f} "
            f"(5th percentile {r['noise_ratio_p5']:.2f}). Prompts with more steps with the memory: "
            f"{r['prompts_more_steps_with']}; below that 5th percentile: {r['prompts_slower_beyond_p5']}; below "
            f"both of their own neutral ratios: {r['prompts_slower_beyond_own']}.",
            "",
        ]
    for r in (r for r in doc["results"] if "texts_ceiling_S" in r):
        S, x = r["texts_ceiling_S"], r["texts_ceiling_ratio"]
        lines += [
            f"**The texts' ceiling** ({r['shape']}, {r['workload']}): had each step also been offered the longest "
            f"right continuation that follows its text's last {MIN_MATCH} tokens anywhere in the memory's texts (an "
            f"estimate: tools/memory_ceiling.py), S {S['without']:.2f} on the course "
            f"without the memory ({x['without']:.3f}x S without it) and {S['with']:.2f} on the course with it "
            f"({x['with']:.3f}x). Steps with the memory where the texts reached further than the step accepted: "
            f"{r['texts_short_steps']['steps']} of {r['texts_short_steps']['of']}.",
            "",
        ]
    if c is not None:
        lines += [
            f"**Cost**: a fresh memory of {c['budget_tokens']} tokens fed {c['texts']} texts (this run's, cycled) "
            f"holds {c['tokens_held']} tokens in {c['mib_after']:.1f} MiB of arrays ({c['mib_empty']:.1f} MiB "
            f"empty: allocated up front); an add takes {c['add_ms']:.3f} ms; saved in "
            f"{c['save_s'] * 1e3:.0f} ms to {c['file_mib']:.2f} MiB, loaded in {c['load_s'] * 1e3:.0f} ms.",
            "",
        ]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = doc["results"]
    labels = [f"{r['workload']}\n{r['shape']}" for r in rows]
    x = range(len(rows))
    noisy = [r for r in rows if "noise_ratio_p5" in r]
    fig, axes = plt.subplots(1, 2 if noisy else 1, figsize=(1.6 * len(rows) + 2 + 5 * bool(noisy), 4), squeeze=False)
    ax = axes[0, 0]
    ax.bar([i - 0.2 for i in x], [r["S_without"] for r in rows], 0.4, label="without the memory")
    ax.bar([i + 0.2 for i in x], [r["S_with"] for r in rows], 0.4, label="with the memory")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("S (tokens per step)")
    warm = f", starting from what {doc['warm']['requests']} earlier requests taught it" if doc.get("warm") else ""
    ax.set_title(f"Draft memory, {doc['model']}{warm}", fontsize=10)
    fig.text(0.01, 0.01, f"{doc['device']}: {on_the_machine(doc)}", fontsize=6, wrap=True)
    ax.legend()
    if noisy:  # each prompt's steps ratio with the memory beside the neutral changes' (`--noise`)
        ax = axes[0, 1]
        for r in noisy:
            detail = r["prompts_detail"]
            memory = sorted(d["without"]["steps"] / d["with"]["steps"] for d in detail)
            neutral = sorted(d["without"]["steps"] / n for d in detail for n in d["noise_steps"])
            name = f"{r['workload']}, {r['shape']}"
            line = ax.plot(memory, np.linspace(0, 1, len(memory)), label=f"{name}: with the memory")[0]
            ax.plot(neutral, np.linspace(0, 1, len(neutral)), "--", color=line.get_color(), label=f"{name}: neutral")
        ax.axvline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("steps without / steps with (per prompt; < 1: slower)")
        ax.set_ylabel("fraction of prompts")
        ax.set_title("Per prompt, against the noise of neutral changes", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))  # room for the note below the axes
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m tools.attention_groups`: a batch's step with its attention grouped by size and length
(lp/engine/packed.py `by_length`, what lp runs) beside grouped by size alone (one group a size
bucket, each sequence's pages padded to the bucket's longest), on the same steps.

    python -m tools.attention_groups [--sequences 8,16,32] [--reps 7] [--out results/attention_groups]

B sequences hold contexts of real prompts' lengths: Spec-Bench's 48 chat prompts (40 to 1,187
tokens: most short, a third long), B of them in turn, and tools.serve_load's 8 chat prompts (all
short). Each step feeds one token a sequence (plain batched decoding) or two for every other one
(a node each); the two groupings' forwards alternate, the median of `--reps` each, host work
(the grouping, the masks) included. Writes OUT/summary.json and OUT/summary.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lp.engine.kernel_choice import cpu_name
from lp.engine.packed import GROUP_CALL_PAGES, PackedStep, prompt_chunk

NEVER = 1 << 40  # a group costs more than any pages: one group a size bucket
GROUPINGS = {"by size and length": GROUP_CALL_PAGES, "by size alone": NEVER}


def _lengths(lm, mix: str) -> list[int]:
    if mix == "spec_bench":
        from lp.bench.datasets import load

        return [len(lm.encode(p.text, chat=True)) for p in load("spec_bench", limit=48)]
    from tools.serve_load import PROMPTS

    return [len(lm.encode(p, chat=True)) for p in PROMPTS]


def _time(worker, kvs: list, nodes: list[int], call_pages: int, gen: torch.Generator) -> float:
    """Seconds of one step's forward (its host work included) under `call_pages`."""
    step = worker.random_step(kvs, [1 + n for n in nodes], gen)
    t0 = time.perf_counter()
    worker.call_pages = call_pages
    worker.run(step)[0].argmax().item()
    return time.perf_counter() - t0


@torch.inference_mode()
def measure(worker, lengths: list[int], B: int, reps: int, groupings: dict[str, int] = GROUPINGS) -> dict:
    """Median step milliseconds of B sequences of `lengths` (in turn), each of `groupings` (its
    name: a group's price in pages), both steps; and the attention groups of each's plain step."""
    gen = torch.Generator().manual_seed(0)
    contexts = [lengths[i % len(lengths)] for i in range(B)]
    kept = worker.call_pages  # each timed step sets its own price; the worker's back after
    try:
        with worker.random_sequences(contexts, 2, gen) as kvs:
            plain = PackedStep([prompt_chunk(kv.owner, np.zeros(1, np.int64), kv.length, kv.table) for kv in kvs])
            row: dict = {
                "sequences": B,
                "contexts": contexts,
                "groups": {name: len(plain.groups(call_pages)) for name, call_pages in groupings.items()},
            }
            for step, nodes in (("plain", [0] * B), ("a node on every other", [i % 2 for i in range(B)])):
                seconds: dict[str, list[float]] = {name: [] for name in groupings}
                for _ in range(reps):
                    for name, call_pages in groupings.items():
                        seconds[name].append(_time(worker, kvs, nodes, call_pages, gen))
                row[step] = {name: 1e3 * statistics.median(s) for name, s in seconds.items()}
            return row
    finally:
        worker.call_pages = kept


def markdown(doc: dict) -> str:
    lines = [
        "# Attention groups: by size and length, or by size alone",
        "",
        f"- command: `{doc['command']}`",
        f"- device: {doc['device']}; date: {doc['date']}; model: {doc['model']}",
        f"- a group's call priced as {doc['call_pages']} pages gathered (`GROUP_CALL_PAGES`); medians of "
        f"{doc['reps']} forwards each, the groupings alternating",
        "",
        "| prompts | sequences | step | by size and length, ms | by size alone, ms | ratio | groups (plain) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for mix, rows in doc["mixes"].items():
        for r in rows:
            groups = " / ".join(str(r["groups"][name]) for name in GROUPINGS)
            for step in ("plain", "a node on every other"):
                a, b = r[step]["by size and length"], r[step]["by size alone"]
                lines.append(f"| {mix} | {r['sequences']} | {step} | {a:.1f} | {b:.1f} | {b / a:.2f}x | {groups} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.attention_groups", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", default="8,16,32")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("results/attention_groups"))
    args = ap.parse_args(argv)
    from lp import LP

    lm = LP(args.model, draft_memory=0, graphs=False)  # eager steps: fixed shapes attend otherwise
    worker = lm.decoder.worker
    doc: dict = {
        "command": ("python -m tools.attention_groups " + shlex.join(sys.argv[1:] if argv is None else argv)).strip(),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "model": args.model,
        "call_pages": GROUP_CALL_PAGES,
        "reps": args.reps,
        "mixes": {},
    }
    for mix in ("spec_bench", "serve_load"):
        lengths = _lengths(lm, mix)
        doc["mixes"][mix] = []
        for B in (int(x) for x in args.sequences.split(",")):
            doc["mixes"][mix].append(measure(worker, lengths, B, args.reps))
            print(f"attention_groups: {mix} B={B}: {doc['mixes'][mix][-1]}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "summary.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

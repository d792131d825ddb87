"""`python -m tools.budget`: the step's shared budget (lp/decode/budget.py) measured where hardware
does not matter: the tokens a step commits, over the sequences decoding together.

    python -m tools.budget [--sizes 64,128,256] [--sequences 1,4,8,16] [--prompts 16]
        [--max-new-tokens 128] [--warm 0] [--out results/budget]

Spec-Bench prompts (SmolLM2-135M, chat, greedy) decode B at a time, each joining as another ends,
every sequence with the same windowless shape (W1 N2 G15, text drafts of up to 14 tokens, lone
matches, the model's top 8 successors), so that all a step spends beyond its pending tokens is
tree nodes. At a fixed step size T the nodes go
  * `shared`: best first across the sequences, by each node's chance (the budget lp serves with);
  * `even`: an even split of the same nodes among the sequences;
  * `none`: to no one (plain batched decoding).
The figure is the tokens a step commits in all, over the steps where B sequences decode (the tail
where fewer are left is left out), and per sequence; every output is checked against plain
decoding's (each sequence's greedy output does not depend on the budget). With `--warm N`, every
decode starts from the draft memory of a server that has answered N other Spec-Bench prompts
(tools.memory's `warm_memory`, saved to OUT/warm_memory.lp, loaded again before each decode): its
sources' rates start from the rates those decodes counted, not from a blind prior, and its text
drafts from their outputs too; as in a server, each measured sequence that ends teaches it too,
for the ones after it in that decode (without `--warm`, the LP holds no memory). Each policy's
decode follows its own course: what its steps verify teaches its sources, so its later trees
differ.
Beside it, the two splits on the same trees: at each step of each decode, the tokens the shared
and the even split of that step's grown trees would commit, read off the greedy output (a node is
accepted where it and its ancestors are the output's next tokens; the running split's figure is
checked against what its step committed). That isolates the split from the course it sets. And how
well the chances the budget compares predict what the drafts achieve: the chances of the nodes
verified, summed (the drafts the trees expect accepted), over the drafts accepted. `none` is
decoded once per B (it gives no node at any size), and at B = 1 the even split is the shared
budget (all to one).

Then the cost model's choice (`auto`, the server's default), against plain batched decoding, at
each B: measured on this CPU with its own step costs (calibrated here: tokens/s of the decode
steps, plain and `auto` decoded in turn A-B-B-A, each the mean of its two), and priced with one
GPU's measured step costs (a tools.steps run: each decode step at its bucket's cost; a projection,
labelled as one: its steps' sizes are what the cost model chose with that GPU's costs, their S
measured here, their seconds not).

Writes OUT/budget.json, OUT/budget.md and OUT/budget.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
from numba import njit

from lp.decode.budget import Budget
from lp.decode.loop import Request
from lp.decode.phases import DraftState
from lp.engine.kernel_choice import cpu_name
from tools.memory import warm_memory, warm_prompts
from tools.pricing import COSTS, bucket_costs

SHAPE = dict(W=1, N=2, G=15, lone_matches=True, draft_len=14)
POLICIES = ("none", "shared", "even")  # plain decoding first: its outputs are the references


@njit
def _grown(state: DraftState) -> tuple:
    """The tree a sequence grew for its step: tokens, parents, labels, growth places, root sizes."""
    return state.grown


def tokens_committed(grown: tuple, output: list[int], k: int) -> int:
    """The tokens a step that verifies the first `k` grown nodes of `grown` commits, where `output`
    is the sequence's greedy output from the step's first new token on: the accepted path (the nodes
    that, with their ancestors, are the output's next tokens) and one more, within the output."""
    tokens, parents, _, growth, _ = grown
    depth = np.zeros(len(tokens), np.int64)
    right = np.zeros(len(tokens), np.bool_)
    for v in range(len(tokens)):  # a parent comes before its children
        p = parents[v]
        depth[v] = 1 if p < 0 else depth[p] + 1
        right[v] = (p < 0 or right[p]) and depth[v] <= len(output) and tokens[v] == output[depth[v] - 1]
    return min(1 + int(np.sum(right & (growth < k))), len(output))


@dataclass(frozen=True)
class Noting(Budget):
    """A budget that notes, per split, the chances of the nodes it gives summed (the drafts the
    step's trees expect accepted) and, given the greedy `outputs` and the batch (`watched`), what
    each split of the same trees would commit (`same_trees`: shared, even, and per sequence the
    running split's figure)."""

    expected: list[float] = field(default_factory=list)
    outputs: list[list[int]] | None = None
    watched: list = field(default_factory=list)
    same_trees: list[dict] = field(default_factory=list)

    def split(self, claims: list, total: int) -> list[int]:
        counts = super().split(claims, total)
        self.expected.append(sum(float(np.sum(c.chances[:k])) for c, k in zip(claims, counts) if c.shared))
        if self.outputs is not None:
            seqs = [s for s in self.watched[0].running if s.decoding]  # the claims' sequences, in order
            splits = {p: Budget.split(replace(self, policy=p), claims, total) for p in ("shared", "even")}
            ahead = [self.outputs[s.request.tag][len(s.state.output) :] for s in seqs]
            trees = [_grown(s.drafter.state) for s in seqs]
            note = {p: sum(tokens_committed(t, o, k) for t, o, k in zip(trees, ahead, ks)) for p, ks in splits.items()}
            note["running"] = {id(s): tokens_committed(t, o, k) for s, t, o, k in zip(seqs, trees, ahead, counts)}
            self.same_trees.append(note)
        return counts


def decode(
    lm,
    prompts: list[list[int]],
    B: int,
    budget: Budget,
    max_new: int,
    tree: int,
    outputs: list | None = None,
    memory: Path | None = None,
) -> dict:
    """The prompts decoded B at a time under `budget`, each sequence's tree of at most `tree` nodes,
    from the draft memory saved at `memory` (None: the LP's as it is): per step, the sequences that
    decoded in it, the tokens they committed and fed, its seconds and whether it prefilled a prompt
    chunk too, and given the greedy `outputs`, what the shared and the even split of its trees would
    commit (the running split's checked against the step's); every output."""
    from lp.config import DecodeConfig

    if memory is not None:  # what this decode teaches the memory must not reach the next one
        lm.load_memory(memory)

    cfg = DecodeConfig(**SHAPE, tree_tokens=tree, max_new_tokens=max_new)
    budget = Noting(**{f.name: getattr(budget, f.name) for f in fields(Budget)}, outputs=outputs)
    batch = lm.decoder.batch(max_batch=B, budget=budget)
    budget.watched.append(batch)
    for i, ids in enumerate(prompts):
        batch.submit(Request(ids, cfg, shared=True, tag=i))
    steps, done, mismatches = [], {}, 0
    while not batch.idle:
        seqs = list(batch.running)
        before = {id(s): (len(s.state.output), len(s.state.accepted)) for s in seqs}
        prefilled = {id(s): s.prefilled for s in seqs}
        notes = len(budget.same_trees)
        t0 = time.perf_counter()
        ended = batch.step()
        seconds = time.perf_counter() - t0
        every = {id(s): s for s in seqs + ended + batch.running}.values()  # those admitted in the step too
        decoded = [s for s in every if len(s.state.accepted) > before.get(id(s), (0, 0))[1]]
        if decoded:
            step = {
                "sequences": len(decoded),
                "committed": sum(len(s.state.output) - before.get(id(s), (0, 0))[0] for s in decoded),
                "fed": sum(s.state.fed_per_step[-1] for s in decoded),
                "expected": budget.expected[-1],
                "seconds": seconds,
                "chunk": any(s.prefilled != prefilled.get(id(s), 0) for s in every),
            }
            if len(budget.same_trees) > notes:
                note = budget.same_trees[-1]
                step |= {"same_trees": {p: note[p] for p in ("shared", "even")}}
                mismatches += sum(note["running"][id(s)] != len(s.state.output) - before[id(s)][0] for s in decoded)
            steps.append(step)
        for s in ended:
            done[s.request.tag] = s.result.output_ids
    return {"steps": steps, "outputs": [done[i] for i in range(len(prompts))], "mismatches": mismatches}


def full(run: dict, B: int) -> dict:
    """The run's figures over its steps where B sequences decoded."""
    rows = [s for s in run["steps"] if s["sequences"] == B] or run["steps"]
    committed = sum(s["committed"] for s in rows)
    drafts = committed - sum(s["sequences"] for s in rows)  # a sequence's step commits its drafts and one more
    figures = {
        "steps": len(rows),
        "expected_per_accepted": sum(s["expected"] for s in rows) / max(1, drafts),
        "tokens_per_step": committed / len(rows),
        "per_sequence": committed / sum(s["sequences"] for s in rows),
        "fed_per_step": statistics.mean(s["fed"] for s in rows),
    }
    if "mismatches" in run and all("same_trees" in s for s in rows):
        same = {p: sum(s["same_trees"][p] for s in rows) / len(rows) for p in ("shared", "even")}
        figures |= {"same_trees_tokens_per_step": same, "same_trees_mismatches": run["mismatches"]}
    return figures


def rate(run: dict, seconds_of) -> float:
    """Tokens per second of a run's decode steps, each step's seconds `seconds_of(step)`; steps that
    also prefilled a joining prompt's chunk are left out (their seconds are mostly the prompt's)."""
    steps = [s for s in run["steps"] if not s["chunk"]]
    return sum(s["committed"] for s in steps) / sum(seconds_of(s) for s in steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.budget", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--sequences", default="1,4,8,16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--warm", type=int, default=0, help="other prompts that taught the draft memory (0: no memory)")
    ap.add_argument("--costs", type=Path, default=COSTS, help="a tools.steps run on a GPU (the projection's)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("results/budget"))
    args = ap.parse_args(argv)
    from lp import LP
    from lp.bench.datasets import load

    sizes = [int(x) for x in args.sizes.split(",")]
    counts = [int(x) for x in args.sequences.split(",")]
    lm = LP(args.model, **({} if args.warm else {"draft_memory": 0}))
    measured = load("spec_bench", limit=args.prompts)
    prompts = [lm.encode(p.text, chat=True) for p in measured]
    args.out.mkdir(parents=True, exist_ok=True)
    warm = args.out / "warm_memory.lp" if args.warm else None
    gpu, about = bucket_costs(args.costs)
    cpu = lm.calibrate()
    doc: dict = {
        "command": "python -m tools.budget " + shlex.join(sys.argv[1:] if argv is None else argv),
        "device": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "model": args.model,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "shape": SHAPE,
        "gpu_costs": about,
        "cpu_costs": {"tokens": list(cpu.tokens), "seconds": list(cpu.seconds), "drafting": cpu.drafting},
        "fixed": [],
        "auto": [],
    }
    if warm is not None:
        per_group = max(Counter(p.category for p in measured).values())
        doc["warm"] = warm_memory(lm, warm_prompts(args.warm, per_group, 0), args.max_new_tokens, warm)
    reference = None

    def same(run: dict) -> bool:
        nonlocal reference
        reference = reference or run["outputs"]
        return run["outputs"] == reference

    plain: dict[int, dict] = {}  # `none` gives no node at any step size: decoded once per B
    for T in sizes:
        for B in counts:
            row: dict = {"step_tokens": T, "sequences": B}
            for policy in POLICIES:
                if policy == "even" and B == 1:  # one sequence: an even split of the nodes is all of them
                    row[policy] = row["shared"]
                elif policy == "none" and B in plain:
                    row[policy] = plain[B]
                else:
                    budget = Budget(policy, step_tokens=T)
                    outputs = None if policy == "none" else reference  # the splits' figures: none to split
                    run = decode(lm, prompts, B, budget, args.max_new_tokens, T - 1, outputs, warm)
                    row[policy] = full(run, B) | {"identical": same(run)}
                    if policy == "none":
                        plain[B] = row[policy]
                print(f"budget: T={T} B={B} {policy}: {row[policy]}", file=sys.stderr, flush=True)
            doc["fixed"].append(row)
    budgets = {
        "none": Budget("none"),
        "auto_cpu": Budget("auto", cost=lambda: cpu),
        "auto_gpu": Budget("auto", cost=lambda: gpu),
    }
    for B in counts:
        row: dict = {"sequences": B}
        # plain decoding timed beside `auto`, A-B-B-A: this machine's speed drifts within minutes, and
        # in a fixed order the first would be favoured (each tokens/s the mean of its two decodes;
        # the steps are the same in both)
        for name in ("none", "auto_cpu", "auto_cpu", "none", "auto_gpu"):
            run = decode(lm, prompts, B, budgets[name], args.max_new_tokens, 255, memory=warm)
            speed = rate(run, lambda s: s["seconds"])
            if name in row:
                runs = row[name]["cpu_tokens_per_s_runs"] + [speed]
                row[name] |= {
                    "identical": row[name]["identical"] and same(run),
                    "cpu_tokens_per_s_runs": runs,
                    "cpu_tokens_per_s": statistics.mean(runs),
                }
                print(f"budget: B={B} {name} again: tokens/s {runs}", file=sys.stderr, flush=True)
                continue
            row[name] = full(run, B) | {
                "identical": same(run),
                "cpu_tokens_per_s": speed,
                "cpu_tokens_per_s_runs": [speed],
                "gpu_tokens_per_s_projected": rate(run, lambda s: gpu.seconds_at(s["fed"])),
            }
            print(f"budget: B={B} {name}: {row[name]}", file=sys.stderr, flush=True)
        doc["auto"].append(row)
    (args.out / "budget.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "budget.md").write_text(markdown(doc))
    plot(doc, args.out / "budget.png")
    print(markdown(doc))
    ok = all(r["shared"]["tokens_per_step"] >= r["even"]["tokens_per_step"] for r in doc["fixed"])
    ok = ok and not any(r[p].get("same_trees_mismatches") for r in doc["fixed"] for p in ("shared", "even"))
    ok = ok and all(p["identical"] for r in doc["fixed"] + doc["auto"] for p in r.values() if isinstance(p, dict))
    return 0 if ok else 1


def markdown(doc: dict) -> str:
    gpu = doc["gpu_costs"]
    w = doc.get("warm")
    memory = (
        f"- every decode starts from the draft memory of {w['requests']} other Spec-Bench prompts' decodes "
        f"({w['tokens']} tokens, `{w['file']}`): its rates from their counts, text drafts from their outputs"
        if w
        else "- no draft memory: every sequence's rates start from the blind prior"
    )
    lines = [
        "# The step's shared budget: tokens committed per step",
        "",
        f"- command: `{doc['command']}`",
        f"- device: {doc['device']} (the tokens a step commits do not depend on it); date: {doc['date']}",
        f"- {doc['prompts']} Spec-Bench prompts, {doc['model']}, chat, greedy, {doc['max_new_tokens']} new tokens, "
        "B at a time (each joining as another ends); every sequence W1 N2 G15, text drafts of up to 14, lone "
        "matches, 8 successors: a step spends beyond its pending tokens on tree nodes only",
        "- figures over the steps where B sequences decode; every output identical to plain decoding's "
        f"({'yes' if all(p['identical'] for r in doc['fixed'] for p in r.values() if isinstance(p, dict)) else 'NO'})",
        memory,
        "",
        "## At a fixed step size: tokens a step commits (per sequence)",
        "",
        "| step tokens | sequences | shared (best first) | even split | plain batched | shared / even | "
        "same trees, shared / even: shared's steps, even's | chances / accepted: shared, even |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["fixed"]:
        cells = [f"{r[p]['tokens_per_step']:.2f} ({r[p]['per_sequence']:.2f})" for p in ("shared", "even", "none")]
        ratio = r["shared"]["tokens_per_step"] / r["even"]["tokens_per_step"]
        same = ", ".join(
            f"{t['shared'] / t['even']:.3f}x" for t in (r[p]["same_trees_tokens_per_step"] for p in ("shared", "even"))
        )
        over = ", ".join(f"{r[p]['expected_per_accepted']:.2f}" for p in ("shared", "even"))
        lines.append(
            f"| {r['step_tokens']} | {r['sequences']} | {' | '.join(cells)} | {ratio:.2f}x | {same} | {over} |"
        )
    lines += [
        "",
        "## The cost model's choice (`auto`) against plain batched decoding",
        "",
        "Measured on this CPU with its own step costs (calibrated in this run; plain and `auto` decoded in turn "
        "A-B-B-A, each the mean of its two); "
        f"**projected** with the step costs of "
        f"{gpu.get('device_name')} ({gpu.get('arch')}, {gpu.get('dtype')}, {gpu.get('started', '')[:10]}: "
        f"`{gpu.get('path')}`): the sizes are what the cost model chose with those costs, the tokens a step commits "
        "were measured here, the seconds are each step's bucket at that GPU's measured cost, not timed.",
        "",
        "| sequences | plain: tokens/step | auto (CPU): tokens/step, step tokens | CPU tokens/s: plain, auto | "
        "auto (GPU costs): tokens/step, step tokens | projected GPU tokens/s: plain, auto |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["auto"]:
        p, c, g = r["none"], r["auto_cpu"], r["auto_gpu"]
        cpu = (p["cpu_tokens_per_s"], c["cpu_tokens_per_s"])
        gpu = (p["gpu_tokens_per_s_projected"], g["gpu_tokens_per_s_projected"])
        lines.append(
            f"| {r['sequences']} | {p['tokens_per_step']:.2f} | {c['tokens_per_step']:.2f}, {c['fed_per_step']:.0f} | "
            f"{cpu[0]:.1f}, {cpu[1]:.1f} ({cpu[1] / cpu[0]:.2f}x) | {g['tokens_per_step']:.2f}, "
            f"{g['fed_per_step']:.0f} | {gpu[0]:.0f}, {gpu[1]:.0f} ({gpu[1] / gpu[0]:.2f}x) |"
        )
    lines.append("")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["step_tokens"] for r in doc["fixed"]})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.6), sharey=True)
    for ax, T in zip([axes] if len(sizes) == 1 else axes, sizes):
        rows = [r for r in doc["fixed"] if r["step_tokens"] == T]
        xs = [r["sequences"] for r in rows]
        for policy, label in (("shared", "shared, best first"), ("even", "even split"), ("none", "plain batched")):
            ax.plot(xs, [r[policy]["tokens_per_step"] for r in rows], marker="o", label=label)
        ax.set_title(f"{T}-token steps")
        ax.set_xlabel("sequences decoding together")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    (axes if len(sizes) == 1 else axes[0]).set_ylabel("tokens committed per step")
    (axes if len(sizes) == 1 else axes[0]).legend()
    warm = f", a memory of {doc['warm']['requests']} other prompts" if doc.get("warm") else ""
    fig.suptitle(f"{doc['model']}, {doc['prompts']} Spec-Bench prompts{warm}: the step's nodes shared best first")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())

"""Price (T, P) meshes, PROJECTED: P LP replicas, each a tensor-parallel group of T GPUs.

    python -m tools.layouts [--costs STEPS.json] [--sweep SWEEP.json] [--gpus 8] [--node 8]
        [--allgather-ms 0.05] [--cross-node-ms 0.05,0.5] [--ancestors 3] [--out DIR]

Every mesh of `--gpus` GPUs in nodes of `--node` (T a power of two up to the node: a group never
spans nodes; P = GPUs / T) at every shape of W=auto's ladder sized for P, as tools/project.py
prices LP replicas (tools/pricing.py: one GPU's step per bucket from a `tools.steps` run, every
row; S from a sweep, priced on P > 1 at the step size the shares cut to a bucket leave), a
group's step from one GPU's with the model of lp/decode/mesh_cost.py (`a` and the all-reduce
latency fitted to gpt-fast's published tensor-parallel speedups, the bandwidth assumed), plus the
LP all-gather with P > 1 (`--allgather-ms` inside a node, each of `--cross-node-ms` across).

References: `mode=ar` on a TP group of a node's GPUs (TP plain decoding), one GPU's best shape,
and LP alone (T = 1, P = GPUs). Writes DIR/layouts.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lp.decode.ladder import rank_tokens
from lp.decode.mesh_cost import PUBLISHED_SOURCE, PUBLISHED_TP, GroupModel, fit, priced_shapes
from lp.errors import LPError
from tools import pricing

LABEL = (
    "PROJECTION, not a multi-GPU run: measured: one GPU's step cost per bucket (the GPU named) and S (exact SmolLM2 "
    "decodes); priced: S on P > 1 replicas at the step size their cut shares leave; fitted: a TP group's "
    "unsplit share and all-reduce latency, to published A100 tensor-parallel speedups; assumed: those carry "
    "over to that GPU, the all-reduce bandwidth, the LP all-gather latencies; not priced: what drafts add to a "
    "step beyond its size (their top-k, their attention group: not measured on a GPU)"
)


def tp_sizes(gpus: int, node: int) -> list[int]:
    """T of every mesh: powers of two dividing `gpus`, no larger than a node."""
    return [T for T in (1, 2, 4, 8, 16, 32) if T <= min(gpus, node) and gpus % T == 0]


def price(
    curve, S: pricing.SweepS, model: GroupModel, gpus: int, node: int, allgather_ms: float, cross_node_ms: float
) -> list[dict]:
    """Every mesh of `gpus` GPUs at its best shape (and every shape, under "shapes"); the
    all-gather crosses nodes where a mesh spans them."""
    out = []
    for T in tp_sizes(gpus, node):
        P = gpus // T
        spans = P > 1 and gpus > node
        gather = 0.0 if P == 1 else cross_node_ms if spans else allgather_ms
        shapes = []
        for x in priced_shapes(T, P, curve.seconds_at, model, gather, S_of=S):
            share = 1 if x.shape is None else rank_tokens(x.shape, P)
            shapes.append(
                {
                    "config": "ar" if x.shape is None else x.shape.name,
                    "share_tokens": share,
                    "S": x.S,
                    "S_measured": x.shape is None or S.measured(x.shape, P),
                    "step_ms": x.S / x.tok_s * 1e3,
                    "tok_s": x.tok_s,
                }
            )
        best = max(shapes, key=lambda x: x["tok_s"])
        out.append(dict(gpus=gpus, T=T, P=P, spans_nodes=spans, allgather_ms=gather, **best, shapes=shapes))
    return out


def references(curve, S: pricing.SweepS, model: GroupModel, gpus: int, node: int) -> dict:
    """TP plain decoding on a node's GPUs (T = min(node, gpus)), one GPU's `mode=ar` and best shape."""
    T = min(node, gpus)
    one = max(priced_shapes(1, 1, curve.seconds_at, model, 0.0, S_of=S), key=lambda x: x.tok_s)
    return {
        "tp_ar_T": T,
        "tp_ar_tok_s": 1e3 / model.step_ms(1e3 * curve.seconds_at(1), T, 1),
        "one_gpu_ar_tok_s": 1 / curve.seconds_at(1),
        "one_gpu_best": {"config": one.shape.name if one.shape else "ar", "tok_s": one.tok_s, "S": one.S},
    }


def verdict(layouts: list[dict], refs: dict) -> dict:
    """The best mesh against TP plain decoding, LP alone (T = 1) and one GPU's best."""
    best = max(layouts, key=lambda x: x["tok_s"])
    alone = next((x for x in layouts if x["T"] == 1), None)
    return {
        "best": {k: best[k] for k in ("T", "P", "config", "tok_s")},
        "vs_tp_ar": best["tok_s"] / refs["tp_ar_tok_s"],
        "vs_lp_alone": None if alone is None else best["tok_s"] / alone["tok_s"],
        "lp_alone_vs_one_gpu": None if alone is None else alone["tok_s"] / refs["one_gpu_best"]["tok_s"],
    }


def run(args: argparse.Namespace) -> dict:
    curve, costs = pricing.bucket_costs(args.costs)
    S = pricing.SweepS(args.sweep, args.ancestors)
    model = fit(gbps=args.allreduce_gbps)
    refs = references(curve, S, model, args.gpus, args.node)
    latencies = args.cross_node_ms if args.gpus > args.node else [args.allgather_ms]
    scenarios = []
    for cross in latencies:
        layouts = price(curve, S, model, args.gpus, args.node, args.allgather_ms, cross)
        scenarios.append(
            {"cross_node_ms": cross if args.gpus > args.node else None, "layouts": layouts, **verdict(layouts, refs)}
        )
    return {
        "label": LABEL,
        "command": args.command,
        "device": f"priced on a CPU from one {costs['device_name']}'s measured step costs",
        "date": time.strftime("%Y-%m-%d"),
        "published": PUBLISHED_TP,
        "published_source": PUBLISHED_SOURCE,
        "model": asdict(model),
        "gpus": args.gpus,
        "node": args.node,
        "allgather_ms": args.allgather_ms,
        "ancestors": args.ancestors,
        "costs": costs,
        "sweep": S.about,
        "references": refs,
        "scenarios": scenarios,
    }


def markdown(doc: dict) -> str:
    m, c, s, node, refs = doc["model"], doc["costs"], doc["sweep"], doc["node"], doc["references"]
    spans = doc["gpus"] > node
    nodes = f"{doc['gpus'] // node} nodes" if spans else "one node"
    lines = [
        f"**{doc['label']}.**",
        "",
        f"# (T, P) meshes of {doc['gpus']} GPUs ({nodes} of {node}), {c['arch']} on {c['device_name']}, "
        f"S on {s['dataset']}",
        "",
        f"Command: `{doc['command']}`. Device: {doc['device']}. Date: {doc['date']}.",
        "",
        f"- measured: one GPU's step cost per bucket, `{c['path']}` ({c['started']}, every row); S, `{s['path']}` "
        f"({s['prompts']} prompts); S on P > 1 priced at the step size the shares cut to a bucket leave "
        f"({doc['ancestors']:g} tokens a rank fed again past its pending)",
        f"- fitted to {PUBLISHED_SOURCE}: unsplit share a = {m['a']:.3f}, all-reduce latency "
        f"{m['lat_ms'] * 1e3:.1f} us",
        f"- assumed: those carry over to {c['device_name']}; all-reduce bandwidth {m['gbps']:g} GB/s; LP all-gather "
        f"{doc['allgather_ms']:g} ms inside a node"
        + (
            ", " + " or ".join(f"{x['cross_node_ms']:g}" for x in doc["scenarios"]) + " ms across nodes"
            if spans
            else ""
        ),
        f"- references: TP{refs['tp_ar_T']} `mode=ar` {refs['tp_ar_tok_s']:.1f} tok/s; one GPU: `mode=ar` "
        f"{refs['one_gpu_ar_tok_s']:.1f} tok/s, its best shape {refs['one_gpu_best']['config']} "
        f"{refs['one_gpu_best']['tok_s']:.1f} tok/s",
        "",
    ]
    for sc in doc["scenarios"]:
        if spans:
            lines += [f"## LP all-gather across nodes: {sc['cross_node_ms']:g} ms (assumed)", ""]
        lines += [
            "| T (tp) | P (replicas) | best shape | largest share | S | step ms | tok/s | x TP plain | "
            "x one GPU's best |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for x in sc["layouts"]:
            S = f"{x['S']:.2f}" if x["S_measured"] else f"*{x['S']:.2f}*"
            lines.append(
                f"| {x['T']} | {x['P']} | {x['config']} | {x['share_tokens']} | {S} | {x['step_ms']:.2f} | "
                f"{x['tok_s']:.1f} | {x['tok_s'] / refs['tp_ar_tok_s']:.2f}x | "
                f"{x['tok_s'] / refs['one_gpu_best']['tok_s']:.2f}x |"
            )
        b = sc["best"]
        alone = (
            ""
            if sc["vs_lp_alone"] is None
            else (
                f", {sc['vs_lp_alone']:.2f}x LP alone (T = 1), which is {sc['lp_alone_vs_one_gpu']:.2f}x one GPU's best"
            )
        )
        lines += [
            "",
            f"Best: T = {b['T']} x P = {b['P']} ({b['config']}), {b['tok_s']:.1f} tok/s, "
            f"**{sc['vs_tp_ar']:.2f}x TP plain decoding**{alone}. S in italics: priced, not a sweep row.",
            "",
        ]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> Path:
    """Tokens/s per mesh (one bar group per cross-node latency), TP plain decoding as a line."""
    from lp.bench.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    scenarios = doc["scenarios"]
    names = [f"T{x['T']} x P{x['P']}\n{x['config']}" for x in scenarios[0]["layouts"]]
    width = 0.8 / len(scenarios)
    for i, s in enumerate(scenarios):
        xs = [j + (i - (len(scenarios) - 1) / 2) * width for j in range(len(names))]
        label = "lp" if s["cross_node_ms"] is None else f"lp, all-gather across nodes {s['cross_node_ms']:g} ms"
        ax.bar(xs, [x["tok_s"] for x in s["layouts"]], width, label=label, color=f"C{i}")
    refs = doc["references"]
    ax.axhline(
        refs["tp_ar_tok_s"], color="k", ls="--", label=f"TP{refs['tp_ar_T']} mode=ar ({refs['tp_ar_tok_s']:.0f})"
    )
    ax.axhline(
        refs["one_gpu_best"]["tok_s"], color="C3", ls=":", label=f"one GPU's best ({refs['one_gpu_best']['tok_s']:.0f})"
    )
    ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set_ylabel("tokens/s (projected)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    c = doc["costs"]
    fig.suptitle(
        f"PROJECTION: {doc['gpus']} GPUs, {c['arch']}, step costs of {c['device_name']}, "
        f"S on {doc['sweep']['dataset']}\n"
        "measured: S, one GPU's steps; fitted: TP group (gpt-fast A100); assumed: all-reduce bw, all-gathers",
        fontsize=9,
    )
    return _save(plt, fig, path, rect=(0, 0, 1, 0.9))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", type=Path, default=pricing.COSTS, help="a tools.steps steps.json (fixed-shape steps)")
    ap.add_argument("--sweep", type=Path, default=pricing.SWEEP, help="a lp.bench.sweep sweep.json")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of every mesh priced")
    ap.add_argument("--node", type=int, default=8, help="GPUs per node (a TP group stays in one)")
    ap.add_argument("--allgather-ms", type=float, default=0.05, help="assumed LP all-gather inside a node")
    ap.add_argument("--cross-node-ms", default="0.05,0.5", help="assumed LP all-gather latencies across nodes")
    ap.add_argument("--allreduce-gbps", type=float, default=150.0, help="assumed all-reduce bus bandwidth")
    ap.add_argument("--ancestors", type=float, default=pricing.ANCESTORS, help="tokens a rank feeds again")
    ap.add_argument("--out", type=Path, default=None, help="write layouts.json, .md and .png here")
    args = ap.parse_args(argv)
    args.cross_node_ms = [float(x) for x in args.cross_node_ms.split(",")]
    args.command = "python -m tools.layouts " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        doc = run(args)
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    text = markdown(doc)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layouts.json").write_text(json.dumps(doc, indent=1))
        (args.out / "layouts.md").write_text(text)
        plot(doc, args.out / "layouts.png")


if __name__ == "__main__":
    main()

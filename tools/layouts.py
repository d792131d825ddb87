"""Price (T, P) layouts, PROJECTED: P LP replicas, each a tensor-parallel group of T GPUs.

    python -m tools.layouts [--projection PROJECT.json] [--sweep SWEEP] [--costs STEPS.json]
        [--gpus 8] [--node 8] [--allgather-ms 0.05] [--cross-node-ms 0.05,0.5] [--out DIR]

Every layout of `--gpus` GPUs in nodes of `--node`, T a power of two up to the node (a group
never spans nodes), P = GPUs / T, priced with the group model of lp/decode/mesh_cost.py (`a` and the
all-reduce latency fitted to gpt-fast's published tensor-parallel speedups, the bandwidth
assumed):

- P > 1: a strong-scaling projection's row for that P (`python -m tools.project`, measured: S
  and the mean forward of the slowest rank's share on ONE GPU), its group step plus the LP
  all-gather: `--allgather-ms` inside a node, each of `--cross-node-ms` when the layout spans
  nodes (assumed latencies).
- P = 1 (one replica of T GPUs): with `--sweep` (a `python -m lp.bench.sweep` sweep.json, or an
  `lp.bench` result directory, whose pooled S and mean tokens per forward are read for each
  lp config), every lp row of the sweep: S from the row, one GPU's step at the row's mean step
  tokens from a measured step-cost curve (`--costs`, a `tools.steps` result; interpolated as
  lp/decode/auto.py's CostCurve does), scaled by the group model; the best row is the layout's
  shape. Without a sweep, the projection's P = 1 row.

The reference is `mode=ar` on a TP group of all the node's GPUs (TP8 plain decoding), priced
by the same model from the projection's one-GPU `mode=ar`. Writes DIR/layouts.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lp.bench.sweep import step_tokens_of
from lp.decode.auto import CostCurve
from lp.decode.mesh_cost import PUBLISHED_SOURCE, PUBLISHED_TP, GroupModel, fit
from lp.errors import LPError
from tools.project import causal_steps, read_costs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROJECTION = ROOT / "results" / "projection" / "h100-llama-7b-spec-bench" / "project.json"
DEFAULT_COSTS = ROOT / "results" / "gpu" / "h100-2026-11-22" / "steps-llama-7b" / "steps.json"
LABEL = (
    "PROJECTION, not a multi-GPU run: measured: S (SmolLM2 decodes) and one GPU's step costs (H100); "
    "fitted: a TP group's unsplit share and all-reduce latency, to published A100 tensor-parallel speedups; "
    "assumed: those carry over to the H100, the all-reduce bandwidth, the LP all-gather latencies"
)


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def read_sweep(path: Path) -> dict:
    """The lp rows of a sweep: a sweep.json (its schema's keys), or an `lp.bench` result
    directory, whose pooled rows (category "all") of lp configs give S and the mean tokens per
    forward. One-line LPError when it is neither."""
    try:
        if path.is_dir():
            meta = json.loads((path / "meta.json").read_text())
            rows = [
                {
                    "config": r["decoder"][3:-1],
                    "step_tokens": step_tokens_of(r["decoder"][3:-1]),
                    "step_tokens_mean": r["step_tokens"],
                    "S": r["S"],
                }
                for r in json.loads((path / "summary.json").read_text())
                if r["decoder"].startswith("lp[") and r["category"] == "all"
            ]
            doc = {"label": path.name, "device": meta["device"], "date": meta["started"][:10], "rows": rows}
            doc["prompts"] = meta["prompts"]
        else:
            doc = json.loads(path.read_text())
            doc["rows"] = [r for r in doc["rows"] if r["decoder"] == "lp"]
        rows = [{k: r[k] for k in ("config", "step_tokens", "step_tokens_mean", "S")} for r in doc["rows"]]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise LPError(f"sweep: cannot read {path} ({type(e).__name__}: {e})") from None
    if not rows:
        raise LPError(f"sweep: {path} has no lp rows")
    return {"path": _rel(path), **{k: doc.get(k) for k in ("label", "device", "date", "prompts")}, "rows": rows}


def cost_curve(path: Path) -> CostCurve:
    """One GPU's step seconds against step tokens, from a `tools.steps` result."""
    measured, fixed = causal_steps(read_costs(str(path)), str(path))
    sizes = sorted(measured)
    return CostCurve(tuple(sizes), tuple(measured[t] for t in sizes), fixed)


def tp_sizes(gpus: int, node: int) -> list[int]:
    """T of every layout: powers of two dividing `gpus`, no larger than a node."""
    return [T for T in (1, 2, 4, 8, 16, 32) if T <= min(gpus, node) and gpus % T == 0]


def price_shapes(sweep: dict, curve: CostCurve, model: GroupModel, T: int) -> list[dict]:
    """One replica of T GPUs at every lp row of the sweep whose steps the measured costs cover
    (a longer step's cost would be extrapolated: it is not priced)."""
    out = []
    for r in sweep["rows"]:
        if r["step_tokens"] > curve.tokens[-1]:
            continue
        one_gpu_ms = 1e3 * curve.seconds_at(r["step_tokens_mean"])
        step = model.step_ms(one_gpu_ms, T, r["step_tokens_mean"])
        out.append({**r, "T": T, "one_gpu_ms": one_gpu_ms, "step_ms": step, "tok_s": r["S"] / step * 1e3})
    return out


def best_shape(priced: list[dict]) -> dict:
    """The sweep row with the most tokens/s."""
    return max(priced, key=lambda x: x["tok_s"])


def price(
    rows: list[dict],
    model: GroupModel,
    gpus: int,
    node: int,
    allgather_ms: float,
    cross_node_ms: float,
    shapes: dict[int, dict] | None = None,
) -> list[dict]:
    """Every layout of `gpus` GPUs: P > 1 from the projection's row for P (a layout whose P it
    lacks is listed unpriced: tok_s None), P = 1 from `shapes[T]` (a priced sweep row) or the projection's P = 1
    row; the all-gather crosses nodes where a layout spans them."""
    by_P = {r["P"]: r for r in rows}
    out = []
    for T in tp_sizes(gpus, node):
        P = gpus // T
        spans = gpus > node
        if P == 1 and shapes and T in shapes:
            s = shapes[T]
            out.append(dict(gpus=gpus, T=T, P=1, config=s["config"], S=s["S"], step_ms=s["step_ms"], source="sweep"))
        elif P in by_P:
            r = by_P[P]
            gather = 0.0 if P == 1 else cross_node_ms if spans else allgather_ms
            step = model.step_ms(r["slowest_rank_ms_mean"], T, r["slowest_rank_tokens_mean"]) + gather
            config = f"W{r['W']}N{r['N']}G{r['G']}"
            out.append(dict(gpus=gpus, T=T, P=P, config=config, S=r["S"], step_ms=step, source="projection"))
            out[-1]["allgather_ms"] = gather
        else:
            out.append(dict(gpus=gpus, T=T, P=P, config=None, S=None, step_ms=None, source=None, tok_s=None))
            continue
        out[-1].update(spans_nodes=spans and P > 1, tok_s=out[-1]["S"] / out[-1]["step_ms"] * 1e3)
    return out


def reference_tok_s(rows: list[dict], model: GroupModel, T: int) -> float:
    """`mode=ar` on one TP group of T GPUs, from the projection's one-GPU `mode=ar`."""
    return 1e3 / model.step_ms(1e3 / rows[0]["ar_tok_s"], T, 1)


def verdict(layouts: list[dict], reference: float) -> dict:
    """lp's best priced layout against TP plain decoding and against LP alone (T = 1)."""
    priced = [x for x in layouts if x["tok_s"] is not None]
    best = max(priced, key=lambda x: x["tok_s"])
    lp_alone = next((x for x in priced if x["T"] == 1), None)
    return {
        "best": {k: best[k] for k in ("T", "P", "config", "tok_s")},
        "vs_tp_ar": best["tok_s"] / reference,
        "vs_lp_alone": None if lp_alone is None else best["tok_s"] / lp_alone["tok_s"],
    }


def run(args: argparse.Namespace) -> dict:
    source = json.loads(args.projection.read_text())
    model = fit(gbps=args.allreduce_gbps)
    sweep = read_sweep(args.sweep) if args.sweep else None
    shapes: dict[int, list[dict]] = {}
    curve = cost_curve(args.costs) if sweep else None
    if curve and args.gpus <= args.node:  # one replica (P = 1) only fits in a node
        shapes = {T: price_shapes(sweep, curve, model, T) for T in tp_sizes(args.gpus, args.node)}
    best = {T: best_shape(s) for T, s in shapes.items() if s}
    latencies = args.cross_node_ms if args.gpus > args.node else [args.allgather_ms]
    scenarios = []
    for cross in latencies:
        layouts = price(source["rows"], model, args.gpus, args.node, args.allgather_ms, cross, best)
        reference = reference_tok_s(source["rows"], model, min(args.node, args.gpus))
        scenarios.append(
            {"cross_node_ms": cross if args.gpus > args.node else None, "layouts": layouts}
            | {"tp_ar_tok_s": reference, **verdict(layouts, reference)}
        )
    return {
        "label": LABEL,
        "command": args.command,
        "device": "2-core CPU, projected onto 1x H100",
        "date": time.strftime("%Y-%m-%d"),
        "published": PUBLISHED_TP,
        "published_source": PUBLISHED_SOURCE,
        "model": asdict(model),
        "gpus": args.gpus,
        "node": args.node,
        "allgather_ms": args.allgather_ms,
        "projection": _rel(args.projection),
        "projection_source": {k: source.get(k) for k in ("device_name", "arch", "dataset", "model", "started")},
        "costs": _rel(args.costs) if sweep else None,
        "costs_max_tokens": curve.tokens[-1] if curve else None,
        "sweep": None if sweep is None else {k: v for k, v in sweep.items() if k != "rows"},
        "shapes": [x for T in sorted(shapes) for x in shapes[T]],
        "scenarios": scenarios,
    }


def markdown(doc: dict) -> str:
    m, src, node = doc["model"], doc["projection_source"], doc["node"]
    spans = doc["gpus"] > node
    lines = [
        f"**{doc['label']}.**",
        "",
        f"# (T, P) layouts of {doc['gpus']} GPUs ({doc['gpus'] // node if spans else 'one'} node{'s' if spans else ''} "
        f"of {node}), "
        f"{src['arch']} on {src['device_name']}, S on {src['dataset']}",
        "",
        f"Command: `{doc['command']}`. Device: {doc['device']}. Date: {doc['date']}.",
        "",
        f"- measured: one GPU's step costs and S: {doc['projection']} (P > 1 rows: S of {src['model']} and "
        "the slowest rank's mean share)"
        + (
            f"; P = 1: every lp row of the sweep {doc['sweep']['path']} ({doc['sweep']['prompts']} prompts; "
            f"S and mean tokens per step), one GPU's step at those tokens from {doc['costs']} (rows whose "
            f"steps exceed its {doc['costs_max_tokens']} tokens not priced); the two S come from different "
            "prompt sets"
            if doc["sweep"]
            else "; P = 1: the projection's row"
        ),
        f"- fitted to {PUBLISHED_SOURCE}: unsplit share a = {m['a']:.3f}, all-reduce latency "
        f"{m['lat_ms'] * 1e3:.1f} us",
        f"- assumed: those carry over to the H100; all-reduce bandwidth {m['gbps']:g} GB/s; LP all-gather "
        f"{doc['allgather_ms']:g} ms inside a node"
        + (
            ", " + " or ".join(f"{s['cross_node_ms']:g}" for s in doc["scenarios"]) + " ms across nodes"
            if spans
            else ""
        ),
        "",
    ]
    for s in doc["scenarios"]:
        if spans:
            lines += [f"## LP all-gather across nodes: {s['cross_node_ms']:g} ms (assumed)", ""]
        lines += [
            "| T (tp) | P (replicas) | config | S from | S | step ms | tok/s | vs TP plain |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for x in s["layouts"]:
            if x["tok_s"] is None:
                missing = f"not priced: the projection has no row for P = {x['P']}"
                lines.append(f"| {x['T']} | {x['P']} | {missing} | | | | | |")
                continue
            lines.append(
                f"| {x['T']} | {x['P']} | {x['config']} | {x['source']} | {x['S']:.2f} | {x['step_ms']:.2f} | "
                f"{x['tok_s']:.1f} | {x['tok_s'] / s['tp_ar_tok_s']:.2f}x |"
            )
        b = s["best"]
        alone = "" if s["vs_lp_alone"] is None else f", {s['vs_lp_alone']:.2f}x LP alone (T = 1)"
        lines += [
            "",
            f"Reference: TP{min(node, doc['gpus'])} `mode=ar` on one node, {s['tp_ar_tok_s']:.1f} tok/s. "
            f"lp's best: T = {b['T']} x P = {b['P']} ({b['config']}), {b['tok_s']:.1f} tok/s, "
            f"**{s['vs_tp_ar']:.2f}x TP plain decoding**{alone}.",
            "",
        ]
    if doc["shapes"]:
        lines += [
            "## Step shapes of one replica (P = 1), every lp row of the sweep",
            "",
            "| T | config | most step tokens | mean step tokens | S | one GPU ms | group step ms | tok/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for x in doc["shapes"]:
            lines.append(
                f"| {x['T']} | {x['config']} | {x['step_tokens']} | {x['step_tokens_mean']:.1f} | {x['S']:.2f} | "
                f"{x['one_gpu_ms']:.2f} | {x['step_ms']:.2f} | {x['tok_s']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> Path:
    """Tokens/s per layout (one bar group per cross-node latency), TP plain decoding as a line."""
    from lp.bench.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    scenarios = doc["scenarios"]
    names = [f"T{x['T']} x P{x['P']}\n{x['config']}" for x in scenarios[0]["layouts"] if x["tok_s"] is not None]
    width = 0.8 / len(scenarios)
    for i, s in enumerate(scenarios):
        xs = [j + (i - (len(scenarios) - 1) / 2) * width for j in range(len(names))]
        label = "lp" if s["cross_node_ms"] is None else f"lp, all-gather across nodes {s['cross_node_ms']:g} ms"
        ax.bar(xs, [x["tok_s"] for x in s["layouts"] if x["tok_s"] is not None], width, label=label, color=f"C{i}")
    ref = scenarios[0]["tp_ar_tok_s"]
    ax.axhline(ref, color="k", ls="--", label=f"TP{min(doc['node'], doc['gpus'])} mode=ar, one node ({ref:.0f})")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("tokens/s (projected)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    src = doc["projection_source"]
    fig.suptitle(
        f"PROJECTION: {doc['gpus']} GPUs, {src['arch']} on {src['device_name']}, S on {src['dataset']}\n"
        "measured: S, one GPU's steps; fitted: TP group (gpt-fast A100); assumed: all-reduce bw, all-gathers",
        fontsize=9,
    )
    return _save(plt, fig, path, rect=(0, 0, 1, 0.9))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--projection", type=Path, default=DEFAULT_PROJECTION, help="a tools.project project.json")
    ap.add_argument("--sweep", type=Path, default=None, help="a sweep.json or an lp.bench result directory")
    ap.add_argument("--costs", type=Path, default=DEFAULT_COSTS, help="a tools.steps steps.json (with --sweep)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of every layout priced")
    ap.add_argument("--node", type=int, default=8, help="GPUs per node (a TP group stays in one)")
    ap.add_argument("--allgather-ms", type=float, default=0.05, help="assumed LP all-gather inside a node")
    ap.add_argument("--cross-node-ms", default="0.05,0.5", help="assumed LP all-gather latencies across nodes")
    ap.add_argument("--allreduce-gbps", type=float, default=150.0, help="assumed all-reduce bus bandwidth")
    ap.add_argument("--out", type=Path, default=None, help="write layouts.json, .md and .png here")
    args = ap.parse_args(argv)
    args.cross_node_ms = [float(x) for x in args.cross_node_ms.split(",")]
    args.command = "python -m tools.layouts " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = run(args)
    text = markdown(doc)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layouts.json").write_text(json.dumps(doc, indent=1))
        (args.out / "layouts.md").write_text(text)
        plot(doc, args.out / "layouts.png")


if __name__ == "__main__":
    main()

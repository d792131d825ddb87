"""PNG plots of benchmark runs (matplotlib, Agg backend) and the tables behind them.

    python -m lp.bench.plots categories RUN_DIR [--out FILE.png]
    python -m lp.bench.plots scaling-law RUN_DIR [RUN_DIR ...] --out DIR
    python -m lp.bench.plots strong-scaling RUN_DIR [RUN_DIR ...] --out DIR [--name NAME] [--kinds lp,tp,pp]

- categories: S and speedup per category, one bar per decoder (written by every run too).
- scaling-law: S against log2 W, one line per N (lp rows of the runs, pooled over prompts),
  `DIR/scaling_law.png` and `.csv`.
- sweep (written by `lp.bench.sweep`): S against step tokens, per category and pooled, with
  the baselines as points.
- strong-scaling: decode latency (ms per generated token) and speedup against the
  autoregressive baseline of each run, against the number of ranks, one line per decoder kind
  (lp, tp, pp, ...), `DIR/strong_scaling.png` and `.csv`. Decoders that could not run at some
  rank count are listed in the CSV with their status, and marked on the plot.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from lp.bench import metrics
from lp.bench.report import read_run

MARKERS = "osD^v<>pP*X"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out (inside `rect`, leaving room for a figure legend), write the PNG, free the figure."""
    fig.tight_layout(rect=rect)
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


def per_category(summary: list[dict], path: str | Path, title: str | None = None) -> Path:
    """Grouped bars: S (left) and speedup (right) per category, one bar per decoder."""
    plt = _plt()
    rows = [r for r in summary if r.get("prompts")]
    cats = list(dict.fromkeys(r["category"] for r in rows))
    decs = list(dict.fromkeys(r["decoder"] for r in rows))
    val = {(r["decoder"], r["category"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(cats) * 2), 4.5))
    width = 0.8 / max(len(decs), 1)
    for ax, key, ylabel in ((axes[0], "S", "S (tokens per step)"), (axes[1], "speedup", "speedup vs baseline")):
        for i, d in enumerate(decs):
            ys = [val.get((d, c), {}).get(key) for c in cats]
            ys = [y if _finite(y) else 0.0 for y in ys]
            ax.bar([j + (i - (len(decs) - 1) / 2) * width for j in range(len(cats))], ys, width, label=d)
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(decs), 4), fontsize=8, frameon=False)
    fig.suptitle(title or "S and speedup per category")
    return _save(plt, fig, path, rect=(0, 0.06 + 0.04 * ((len(decs) - 1) // 4), 1, 1))


def scaling_points(runs: list[dict]) -> list[dict]:
    """Pooled S per lp (W, N, G) over all ok rows of the runs, sorted by N then W (rows of
    `lp[auto]` are left out: their shape is chosen per prompt, not swept)."""
    acc: dict[tuple, list[int]] = {}
    for run in runs:
        for r in run["rows"]:
            if r.get("kind") == "lp" and r.get("status") == "ok" and not r.get("auto"):
                key = (int(r["N"]), int(r["W"]), int(r["G"]))
                a = acc.setdefault(key, [0, 0, 0])
                a[0] += int(r["new_tokens"])
                a[1] += int(r["steps"])
                a[2] += 1
    return [
        {
            "N": n,
            "W": w,
            "G": g,
            "prompts": a[2],
            "new_tokens": a[0],
            "steps": a[1],
            "S": metrics.tokens_per_step(a[0], a[1]),
        }
        for (n, w, g), a in sorted(acc.items())
    ]


def scaling_law(points: list[dict], path: str | Path, title: str | None = None) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, n in enumerate(sorted({p["N"] for p in points})):
        ps = sorted((p for p in points if p["N"] == n), key=lambda p: p["W"])
        ax.plot([p["W"] for p in ps], [p["S"] for p in ps], marker=MARKERS[i % len(MARKERS)], label=f"N={n}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("W (lookahead window, log scale)")
    ax.set_ylabel("S (tokens per step)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    ax.set_title(title or "Scaling law: S vs log W (G = W unless set)")
    return _save(plt, fig, path)


def strong_points(runs: list[dict]) -> list[dict]:
    """One point per (run, decoder): its world size, ms per generated token (pooled decode
    seconds / tokens), mean decode seconds per prompt, pooled speedup against the run's
    baseline, S; unsupported / failed decoders give a point with status and no numbers."""
    pts = []
    for run in runs:
        ws_run = int(run["meta"].get("world_size", 1))
        by_label: dict[str, list[dict]] = {}
        for r in run["rows"]:
            by_label.setdefault(r["decoder"], []).append(r)
        kinds = [rs[0].get("kind") for rs in by_label.values()]
        for label, rs in by_label.items():
            kind = rs[0].get("kind") or label
            ok = [r for r in rs if r.get("status") == "ok"]
            series = kind if kinds.count(kind) == 1 else label
            pt = {
                "series": series,
                "decoder": label,
                "kind": kind,
                "ranks": ws_run,
                "world_size": rs[0].get("world_size"),
                "prompts": len(ok),
                "tag": rs[0].get("tag"),
            }
            if ok:
                tokens = sum(int(r["new_tokens"]) for r in ok)
                secs = sum(float(r["decode_seconds"]) for r in ok)
                paired = [r for r in ok if _finite(r.get("baseline_seconds"))]
                pt.update(
                    ms_per_token=1e3 * secs / tokens if tokens else float("nan"),
                    decode_seconds_mean=secs / len(ok),
                    speedup=metrics.speedup(
                        sum(float(r["baseline_seconds"]) for r in paired),
                        sum(float(r["decode_seconds"]) for r in paired),
                    )
                    if paired
                    else float("nan"),
                    S=metrics.tokens_per_step(tokens, sum(int(r["steps"]) for r in ok)),
                    matches_greedy=all(r.get("matches_greedy") is not False for r in ok),
                    status="ok",
                )
            else:
                pt["status"] = "; ".join(sorted({str(r.get("status")) for r in rs}))
            pts.append(pt)
    return sorted(pts, key=lambda p: (p["series"], p["ranks"]))


def strong_scaling(
    points: list[dict], path: str | Path, title: str | None = None, kinds: tuple[str, ...] | None = None
) -> Path:
    """Two panels against the number of ranks: ms per token and speedup vs AR."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    series = list(dict.fromkeys(p["series"] for p in points if kinds is None or p["kind"] in kinds))
    ranks = sorted({p["ranks"] for p in points})
    for i, name in enumerate(series):
        ps = [p for p in points if p["series"] == name]
        ok = [p for p in ps if p["status"] == "ok"]
        m = MARKERS[i % len(MARKERS)]
        for ax, key in ((axes[0], "ms_per_token"), (axes[1], "speedup")):
            (line,) = ax.plot([p["ranks"] for p in ok], [p[key] for p in ok], marker=m, label=name)
            for p in ps:
                if p["status"] != "ok":  # say it, don't silently drop it
                    ax.annotate(
                        "n/a",
                        (p["ranks"], 0),
                        color=line.get_color(),
                        fontsize=8,
                        xycoords=("data", "axes fraction"),
                        xytext=(0, 4 + 9 * i),
                        textcoords="offset points",
                        ha="center",
                    )
    for ax, ylabel in ((axes[0], "decode latency (ms per token)"), (axes[1], "speedup vs autoregressive")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks)
        ax.set_xticklabels([str(r) for r in ranks])
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "Strong scaling: lp (Lookahead Parallelism) vs TP and PP")
    return _save(plt, fig, path)


def write_csv(points: list[dict], path: str | Path) -> Path:
    keys = list(dict.fromkeys(k for p in points for k in p))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for p in points:
            w.writerow({k: ("" if not _finite(p.get(k)) and isinstance(p.get(k), float) else p.get(k)) for k in keys})
    return Path(path)


def sweep(summary: list[dict], path: str | Path, title: str | None = None) -> Path:
    """S against step tokens (log2 axis), written by `lp.bench.sweep`: lp's pooled line and one
    line per category; each baseline a marked point (pooled) at its own step size."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    lp = sorted((r for r in summary if r["decoder"] == "lp" and _finite(r["S"])), key=lambda r: r["step_tokens"])
    x = [r["step_tokens"] for r in lp]
    cats = list(dict.fromkeys(c for r in lp for c in r["S_by_category"]))
    for i, c in enumerate(cats):
        ys = [r["S_by_category"].get(c) for r in lp]
        ax.plot(x, [y if _finite(y) else float("nan") for y in ys], marker=MARKERS[i % len(MARKERS)], lw=1, label=c)
    ax.plot(x, [r["S"] for r in lp], color="black", lw=2.5, marker="o", label="lp, pooled")
    baselines = [r for r in summary if r["decoder"] != "lp" and _finite(r["S"])]
    for i, r in enumerate(baselines):
        ax.scatter(
            [r["step_tokens"]],
            [r["S"]],
            marker="*^sD"[i % 4],
            s=160,
            zorder=3,
            facecolors="white",
            edgecolors="black",
            linewidths=1.5,
            label=f"{r['decoder']} (pooled)",
        )
    ax.set_xscale("log", base=2)
    ticks = sorted({r["step_tokens"] for r in lp + baselines})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("step tokens (most tokens a step feeds the model, log scale)")
    ax.set_ylabel("S (new tokens per step)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title or "S against step tokens")
    return _save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lp.bench.plots", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("categories")
    c.add_argument("run")
    c.add_argument("--out")
    for name in ("scaling-law", "strong-scaling"):
        p = sub.add_parser(name)
        p.add_argument("runs", nargs="+")
        p.add_argument("--out", required=True, help="output directory")
        p.add_argument("--name", default=name.replace("-", "_"))
        p.add_argument("--title")
        if name == "strong-scaling":
            p.add_argument("--kinds", help="comma-separated decoder kinds to plot (default: all)")
    args = ap.parse_args(argv)
    if args.cmd == "categories":
        run = read_run(Path(args.run))
        print(per_category(run["summary"], args.out or Path(args.run) / "categories.png"))
        return 0
    runs = [read_run(Path(r)) for r in args.runs]
    missing = [r["dir"] for r in runs if not r["rows"]]
    if missing:
        print(f"lp.bench.plots: no rows in {', '.join(missing)} (skipped)", file=sys.stderr)
    runs = [r for r in runs if r["rows"]]
    if not runs:
        print("lp.bench.plots: nothing to plot", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "scaling-law":
        pts = scaling_points(runs)
        write_csv(pts, out / f"{args.name}.csv")
        print(scaling_law(pts, out / f"{args.name}.png", args.title))
    else:
        pts = strong_points(runs)
        kinds = tuple(args.kinds.split(",")) if args.kinds else None
        if kinds:
            pts = [p for p in pts if p["kind"] in kinds]
        write_csv(pts, out / f"{args.name}.csv")
        print(strong_scaling(pts, out / f"{args.name}.png", args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())

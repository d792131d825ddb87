"""LP replicas, PROJECTED: P GPUs each holding the model, splitting each step (P = 1 to `gpus`).

    python -m tools.project [key=value ...]      (--help lists every key)

Each P is priced at every shape of W=auto's ladder sized for P (lp/decode/auto.py `ladder`), and
at its best: a step costs one GPU's step at the bucket its largest share fills (each greedy
share cut to the bucket of an even share, lp/decode/shares.py), as a `tools.steps` run timed it
(tools/pricing.py: every row, 1 to 1,024 tokens), plus an assumed all-gather with P > 1; S is a
sweep's (lp.bench.sweep: exact SmolLM2 decodes) at that shape on one GPU, and on P > 1 the sweep's
S at the step size the cut shares leave (tools/pricing.py). `mode=ar` (S = 1) is priced by the
same run's 1-token step. Measured: the step costs (the GPU named) and S (the sweep). Not measured:
a multi-GPU step, the all-gather, the host's work between steps, interference between GPUs.
Writes OUT/project.json, .md and .png; prints the markdown.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lp.decode.ladder import rank_tokens
from lp.decode.mesh_cost import GroupModel, priced_shapes
from lp.engine.packed import bucket
from lp.errors import LPError
from tools import pricing, steps

LABEL = (
    "PROJECTION, not a multi-GPU run: measured: one GPU's step cost per bucket (the steps run named), S "
    "(exact SmolLM2 decodes, the sweep named); priced: S on P > 1 replicas at the step size their cut "
    "shares leave; assumed: the all-gather; not measured: the host's work, interference between GPUs, what "
    "drafts add to a step beyond its size (their top-k, their attention group)"
)
ONE_GPU = GroupModel(a=1.0, lat_ms=0.0)  # a replica of one GPU: its own step, no all-reduce


@dataclass
class Settings:
    """The tool's keys."""

    costs: str = str(pricing.COSTS)
    sweep: str = str(pricing.SWEEP)
    gpus: int = 8
    allgather_ms: float = 0.05
    ancestors: float = pricing.ANCESTORS
    out: str = ""

    def validate(self) -> Settings:
        if self.gpus < 1:
            raise LPError(f"gpus must be >= 1, got {self.gpus}")
        if self.allgather_ms < 0 or self.ancestors < 0:
            raise LPError("allgather_ms and ancestors must be >= 0")
        return self


HELP = {
    "costs": f"a tools.steps steps.json with fixed-shape steps (default {pricing.rel(pricing.COSTS)})",
    "sweep": f"a lp.bench.sweep sweep.json (default {pricing.rel(pricing.SWEEP)})",
    "gpus": "the most replicas priced, one GPU each (8)",
    "allgather_ms": "the all-gather of a step over P > 1 GPUs, assumed (0.05 ms)",
    "ancestors": f"tokens a rank feeds again past its pending ones, on average ({pricing.ANCESTORS:g})",
    "out": "results directory (default $LP_CACHE/bench/project/TIME)",
}


def shape_rows(P: int, curve, S: pricing.SweepS, allgather_ms: float, ar_tok_s: float) -> list[dict]:
    """Every shape (plain decoding too, on one GPU) on P replicas of one GPU, priced."""
    rows = []
    for x in priced_shapes(1, P, curve.seconds_at, ONE_GPU, allgather_ms, S_of=S):
        share = 1 if x.shape is None else rank_tokens(x.shape, P)
        rows.append(
            {
                "P": P,
                "config": "ar" if x.shape is None else x.shape.name,
                "step_tokens": 1 if x.shape is None else x.shape.step_tokens,
                "tree_step_tokens": 1.0 if x.shape is None else S.tree_tokens(x.shape, P),
                "share_tokens": share,
                "bucket": bucket(share),
                "bucket_measured": not pricing.unmeasured(curve, share),
                "S": x.S,
                "S_measured": x.shape is None or S.measured(x.shape, P),
                "step_ms": x.S / x.tok_s * 1e3,
                "tok_s": x.tok_s,
                "vs_ar": x.tok_s / ar_tok_s,
            }
        )
    return rows


def run(cfg: Settings) -> dict:
    curve, costs = pricing.bucket_costs(Path(cfg.costs))
    S = pricing.SweepS(Path(cfg.sweep), cfg.ancestors)
    ar_tok_s = 1 / curve.seconds_at(1)
    rows = [r for P in range(1, cfg.gpus + 1) for r in shape_rows(P, curve, S, cfg.allgather_ms, ar_tok_s)]
    best = [max((r for r in rows if r["P"] == P), key=lambda r: r["tok_s"]) for P in range(1, cfg.gpus + 1)]
    for r in rows:
        r["vs_one_gpu"] = r["tok_s"] / best[0]["tok_s"]
    return {
        "tool": "tools.project",
        "projection": LABEL,
        "command": " ".join(["python -m tools.project", *_given(cfg)]),
        "date": time.strftime("%Y-%m-%d"),
        "costs": costs,
        "sweep": S.about,
        "settings": dataclasses.asdict(cfg),
        "ar_tok_s": ar_tok_s,
        "best": [r["config"] for r in best],
        "rows": rows,
    }


def _given(cfg: Settings) -> list[str]:
    """The keys given other values than their defaults, as `key=value` (paths as the repository's)."""
    default = Settings()
    return [
        f"{k}={pricing.rel(Path(v)) if k in ('costs', 'sweep', 'out') else v}"
        for k, v in dataclasses.asdict(cfg).items()
        if v != getattr(default, k)
    ]


def markdown(r: dict) -> str:
    c, s, st = r["costs"], r["sweep"], r["settings"]
    best = [next(x for x in r["rows"] if x["P"] == P and x["config"] == name) for P, name in enumerate(r["best"], 1)]
    lines = [
        f"**{r['projection']}.**",
        "",
        f"# LP replicas, projected: {c['arch']} ({c['dtype']}) on {c['device_name']}, S on {s['dataset']}",
        "",
        f"Command: `{r['command']}`. Date: {r['date']}.",
        "",
        f"- step costs: `{c['path']}` ({c['started']}): per bucket, the median of every step timed in it",
        f"- S: `{s['path']}` ({s['prompts']} prompts, {s['model']}, {s['date']}); on P > 1 replicas priced at the "
        f"step size the shares cut to a bucket leave, {st['ancestors']:g} tokens a rank fed again past its pending",
        f"- all-gather: {st['allgather_ms']:g} ms a step with P > 1, assumed; `mode=ar` {r['ar_tok_s']:.1f} tok/s "
        "(the run's 1-token step)",
        "",
        *TABLE,
        *(_row(x) for x in best),
        "",
        "Every shape (S in italics: priced, not a sweep row; the step tokens in brackets: one replica's "
        "step that the cut shares hold):",
        "",
        *TABLE,
        *(_row(x) for x in r["rows"]),
    ]
    return "\n".join(lines) + "\n"


TABLE = (
    "| P (GPUs) | shape | step tokens | largest share, its bucket | S | step ms | tok/s | x `mode=ar` | "
    "x one GPU's best |",
    "|---|---|---|---|---|---|---|---|---|",
)


def _row(x: dict) -> str:
    S = f"{x['S']:.2f}" if x["S_measured"] else f"*{x['S']:.2f}*"
    B = f"{x['bucket']}" + ("" if x["bucket_measured"] else " (interpolated)")
    return (
        f"| {x['P']} | {x['config']} | {x['step_tokens']} ({x['tree_step_tokens']:.0f}) | {x['share_tokens']}, {B} | "
        f"{S} | {x['step_ms']:.2f} | {x['tok_s']:.1f} | {x['vs_ar']:.2f}x | {x['vs_one_gpu']:.2f}x |"
    )


def plot(r: dict, path: Path) -> Path:
    """The best projected tokens/s against P, beside one GPU's best and `mode=ar`."""
    from lp.bench.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    best = [next(x for x in r["rows"] if x["P"] == P and x["config"] == n) for P, n in enumerate(r["best"], 1)]
    Ps = [x["P"] for x in best]
    ax.plot(Ps, [x["tok_s"] for x in best], marker="o", label="LP replicas, best shape (projected)")
    ax.axhline(best[0]["tok_s"], color="C1", ls="--", label=f"one GPU's best ({best[0]['config']})")
    ax.axhline(r["ar_tok_s"], color="k", ls=":", label="mode=ar, one GPU")
    for x in best:
        ax.annotate(
            x["config"].split("-")[1], (x["P"], x["tok_s"]), fontsize=7, xytext=(3, 4), textcoords="offset points"
        )
    ax.set_xlabel("P (GPUs, one replica each)")
    ax.set_ylabel("tokens/s (projected)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    c = r["costs"]
    ax.set_title(
        f"PROJECTION: {c['arch']} {c['dtype']}, step costs of {c['device_name']}; S: exact SmolLM2 decodes", fontsize=9
    )
    return _save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = steps.parse_keys(argv, Settings, HELP, "python -m tools.project", __doc__.splitlines()[0])
        r = run(cfg)
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    out = Path(cfg.out) if cfg.out else steps.cache_dir() / "bench" / "project" / time.strftime("%Y%m%d-%H%M%S")
    paths = steps.write(r, out, "project", markdown, plot)
    print(markdown(r))
    print(f"tools.project: results in {', '.join(map(str, paths))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the projections price with (tools/project.py, tools/layouts.py): one GPU's step cost per
fixed-shape bucket from a `tools.steps` run, and S per step size from a `lp.bench.sweep` sweep.

- Cost: lp runs a step padded to its bucket (lp/engine/packed.py), so a bucket costs the
  median of every step the run timed in it (its causal blocks and W=auto's ladder shapes: the
  1,024-token bucket has only the ladder's); a bucket it did not time costs what its neighbours
  give, linearly (`CostCurve`), and is named in `unmeasured`.
- S on one replica: the sweep's S of that shape (measured, exact decodes). Over P > 1 replicas
  (lp/decode/shares.py), a step's shares are cut to a bucket of `share` tokens, each holding the
  tokens the last step committed (S on average) and the ancestors fed again (`ancestors` on
  average), so its tree holds P x (share - S - ancestors) nodes and the window: S there is the
  sweep's at that step size, linear in log2(step tokens) between the sweep's sizes (as W=auto's
  prior is), never above the step's own.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

from lp.decode.auto import CostCurve
from lp.decode.ladder import Shape, rank_tokens
from lp.engine.packed import bucket
from lp.errors import LPError

ROOT = Path(__file__).resolve().parent.parent
COSTS = ROOT / "results" / "gpu" / "h100-2026-11-26" / "steps-llama-7b" / "steps.json"
SWEEP = ROOT / "results" / "sweep" / "spec_bench_48" / "sweep.json"
ANCESTORS = 3.0  # tokens a rank feeds again: 2-4 a rank on two Spec-Bench prompts' 1,024-token trees cut 8 ways


def rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def read_json(path: Path, what: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LPError(f"{what}: cannot read {path}: {e}") from None
    if not isinstance(doc, dict):
        raise LPError(f"{what}: {path} is not a JSON object")
    return doc


def bucket_costs(path: Path) -> tuple[CostCurve, dict]:
    """One GPU's step seconds per bucket (every row of a `tools.steps` run with fixed-shape steps),
    and what the run was (device, arch, dtype, date, the rows per bucket)."""
    doc = read_json(path, "costs")
    if doc.get("tool") != "tools.steps" or not doc.get("graphs") or not doc.get("steps"):
        raise LPError(f"costs: {path} is not a tools.steps run with fixed-shape steps (graphs=true)")
    rows: dict[int, list[float]] = {}
    for row in (r for r in doc["steps"] if r.get("kind") != "packed"):  # one sequence's steps
        rows.setdefault(bucket(int(row["tokens"])), []).append(float(row["median_ms"]) / 1e3)
    sizes = sorted(rows)
    curve = CostCurve(tuple(sizes), tuple(statistics.median(rows[B]) for B in sizes), padded=True)
    about = {k: doc.get(k) for k in ("arch", "device_name", "dtype", "started", "torch")}
    about.update(path=rel(path), rows_per_bucket={B: len(rows[B]) for B in sizes})
    return curve, about


class SweepS:
    """S per step size from a sweep.json: the ladder rows of lp (one replica, exact decodes)."""

    def __init__(self, path: Path, ancestors: float = ANCESTORS) -> None:
        doc = read_json(path, "sweep")
        try:
            rows = sorted((r for r in doc["rows"] if r["decoder"] == "lp"), key=lambda r: r["step_tokens"])
            self.by_name = {r["config"]: float(r["S"]) for r in rows}
            self.sizes = np.log2([float(r["step_tokens"]) for r in rows])
            self.S = np.array([float(r["S"]) for r in rows])
        except (KeyError, TypeError, ValueError) as e:
            raise LPError(f"sweep: {path} is not a sweep.json ({type(e).__name__}: {e})") from None
        if not rows:
            raise LPError(f"sweep: {path} has no lp rows")
        self.about = {k: doc.get(k) for k in ("label", "prompts", "date", "model", "dataset")} | {"path": rel(path)}
        self.ancestors = ancestors

    def at(self, tokens: float) -> float:
        """S at a step of `tokens` tokens: linear in log2(tokens) between the sweep's sizes (its
        first and last S outside them)."""
        return float(np.interp(math.log2(tokens), self.sizes, self.S))

    def tree_tokens(self, shape: Shape, P: int) -> float:
        """The step tokens of `shape` on P replicas as one replica counts them (x0, the window, the
        tree): its own on one; on more, what P shares of its bucket hold after each rank's
        pending tokens and ancestors fed again (module docstring)."""
        if P == 1:
            return float(shape.step_tokens)
        share = rank_tokens(shape, P)
        fed_again = self.at(shape.step_tokens) + self.ancestors  # pending (S on average) and ancestors
        return max(1.0, min(float(shape.step_tokens), P * (share - fed_again) + 1))

    def __call__(self, shape: Shape, P: int) -> float:
        """S of `shape` on P replicas: the sweep's own row on one, else priced (`tree_tokens`)."""
        if P == 1 and shape.name in self.by_name:
            return self.by_name[shape.name]
        return self.at(self.tree_tokens(shape, P))

    def measured(self, shape: Shape, P: int) -> bool:
        """Whether `self(shape, P)` is a sweep row's S (not priced from the step's size)."""
        return P == 1 and shape.name in self.by_name


def unmeasured(curve: CostCurve, tokens: int) -> bool:
    """Whether the bucket of a step of `tokens` tokens was not timed (its cost is interpolated)."""
    return bucket(tokens) not in curve.tokens


__all__ = ["ANCESTORS", "COSTS", "SWEEP", "SweepS", "bucket_costs", "read_json", "rel", "unmeasured"]

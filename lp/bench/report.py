"""Writing and reading benchmark results: `rows.jsonl` (one line per prompt and decoder),
`summary.csv` / `summary.json` (one line per decoder and category, plus category `all`),
`meta.json` (settings, world size, device, versions) and the printed table."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

SUMMARY_COLUMNS = (
    "decoder",
    "category",
    "world_size",
    "prompts",
    "new_tokens",
    "steps",
    "S",
    "step_tokens",
    "S_mean",
    "tokens_per_s",
    "decode_seconds",
    "prefill_seconds",
    "step_latency_median_ms",
    "speedup",
    "speedup_geomean",
    "outside_forward",
    "matches_greedy",
    "mismatches",
    "accepted_hist",
    "status",
)


def clean(obj):
    """JSON-safe copy: NaN and infinities become null, dict keys strings."""
    if isinstance(obj, float):
        return None if (math.isnan(obj) or math.isinf(obj)) else obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj) -> str:
    return json.dumps(clean(obj), allow_nan=False)


def write_meta(path: Path, meta: dict) -> None:
    Path(path).write_text(json.dumps(clean(meta), indent=2, allow_nan=False, default=str) + "\n")


def hist_text(hist: dict) -> str:
    """{1: 50, 2: 20} -> "1:50 2:20"."""
    return " ".join(f"{int(k)}:{int(v)}" for k, v in sorted((hist or {}).items(), key=lambda kv: int(kv[0])))


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def summary_records(summary: list[dict]) -> list[dict]:
    out = []
    for s in summary:
        r = {k: s.get(k) for k in SUMMARY_COLUMNS if k in s}
        r["step_latency_median_ms"] = (
            s["step_latency_median"] * 1e3 if s.get("step_latency_median") is not None else None
        )
        r["accepted_hist"] = hist_text(s.get("accepted_hist") or {})
        out.append(r)
    return out


def write_summary(out_dir: Path, summary: list[dict]) -> None:
    out_dir = Path(out_dir)
    with open(out_dir / "summary.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(SUMMARY_COLUMNS))
        w.writeheader()
        for r in summary_records(summary):
            w.writerow({k: _fmt(r.get(k), 6) for k in SUMMARY_COLUMNS})
    (out_dir / "summary.json").write_text(json.dumps(clean(summary), indent=1, allow_nan=False) + "\n")


def table(summary: list[dict]) -> str:
    """The printed summary: one line per decoder and category."""
    cols = [
        ("decoder", "decoder", 0),
        ("category", "category", 0),
        ("ws", "world_size", 0),
        ("n", "prompts", 0),
        ("tokens", "new_tokens", 0),
        ("steps", "steps", 0),
        ("S", "S", 2),
        ("step tok", "step_tokens", 1),
        ("tok/s", "tokens_per_s", 1),
        ("step ms", "step_latency_median_ms", 1),
        ("speedup", "speedup", 2),
        ("outside fwd", "outside_forward", 3),
        ("exact", "matches_greedy", 0),
        ("accepted/step", "accepted_hist", 0),
        ("status", "status", 0),
    ]
    recs = summary_records(summary)
    cells = [[h for h, _, _ in cols]]
    for r in recs:
        cells.append([_fmt(r.get(k), d) if d else _fmt(r.get(k)) for _, k, d in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def read_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def read_run(run_dir: Path) -> dict:
    """A finished run directory: {"meta", "rows", "summary", "dir"}."""
    d = Path(run_dir)
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {}
    rows = read_rows(d / "rows.jsonl") if (d / "rows.jsonl").exists() else []
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else []
    return {"meta": meta, "rows": rows, "summary": summary, "dir": str(d)}

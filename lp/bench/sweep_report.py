"""The budget sweep's files (lp/bench/sweep.py): sweep.json (its rows pooled per decoder and step
size), sweep.md (a table of them) and sweep.png (S against step tokens, lp/bench/plots.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from lp.bench import metrics, report


def summarize(rows: list[dict]) -> list[dict]:
    """One sweep.json row per (decoder, config, step size), pooled over its prompts ("ok" rows)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["decoder"], r["config"], r["step_tokens"]), []).append(r)
    out = []
    for (decoder, config, size), rs in groups.items():
        cats: dict[str, list[dict]] = {}
        for r in rs:
            cats.setdefault(r["category"], []).append(r)
        steps = sum(r["steps"] for r in rs)
        out.append(
            {
                "decoder": decoder,
                "config": config,
                "step_tokens": size,
                "step_tokens_mean": sum(r["step_tokens_total"] for r in rs) / steps if steps else None,
                "S": _pooled(rs),
                "S_by_category": {c: _pooled(v) for c, v in cats.items()},
                "identical": sum(1 for r in rs if r["identical"]),
                "prompts": len(rs),
            }
        )
    return sorted(out, key=lambda x: (x["decoder"] != "lp", x["step_tokens"], x["decoder"]))


def _pooled(rs: list[dict]) -> float:
    """S over a group of prompts: all their new tokens / all their steps."""
    return metrics.tokens_per_step(sum(r["new_tokens"] for r in rs), sum(r["steps"] for r in rs))


def markdown(head: dict, summary: list[dict], rows: list[dict]) -> str:
    """sweep.md: one line per decoder and step size: S pooled and per category, identical
    outputs, lp's time per step outside its forwards (host work, the all-gather and, on a CPU, the
    acceptance's tensor ops, which a GPU runs; `python -m tools.host` measures the host's part alone) and
    the group's seconds (prefills and decodes)."""
    cats = list(dict.fromkeys(r["category"] for r in rows if r["status"] == "ok"))
    lines = [
        f"# {head['label']}",
        "",
        f"`{head['command']}`",
        "",
        f"{head['device']}, {head['date']}; model {head['model']}, {head['dataset']}, {head['prompts']} prompts, "
        f"{head['max_new_tokens']} new tokens at most, greedy. S = all new tokens / all decoding steps.",
        "",
        "| decoder | config | step tokens | mean | S | "
        + " | ".join(cats)
        + " | identical | ms/step outside the forward | seconds |",
        "|" + "---|" * (8 + len(cats)),
    ]
    for x in summary:
        rs = [
            r
            for r in rows
            if (r["decoder"], r["config"], r["step_tokens"]) == (x["decoder"], x["config"], x["step_tokens"])
        ]
        ok = [r for r in rs if r["status"] == "ok"]
        host = [r["host_ms_per_step"] * r["steps"] for r in ok if "host_ms_per_step" in r]
        steps = sum(r["steps"] for r in ok if "host_ms_per_step" in r)
        seconds = sum(r["prefill_seconds"] + r["decode_seconds"] for r in ok)
        by_cat = [_num(x["S_by_category"].get(c), 2) for c in cats]
        lines.append(
            f"| {x['decoder']} | {x['config']} | {x['step_tokens']} | {_num(x['step_tokens_mean'], 1)} | "
            f"**{_num(x['S'], 2)}** | {' | '.join(by_cat)} | {x['identical']}/{x['prompts']} | "
            f"{_num(sum(host) / steps if steps else None, 2)} | {seconds:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _num(v, digits: int) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def write(out: Path, head: dict, rows: list[dict]) -> None:
    """sweep.json, sweep.md and sweep.png of `rows` under `out`."""
    summary = summarize(rows)
    (out / "sweep.json").write_text(report.dumps({**head, "rows": summary}) + "\n")
    (out / "sweep.md").write_text(markdown(head, summary, rows))
    if summary:
        from lp.bench import plots

        try:
            plots.sweep(summary, out / "sweep.png", title=head["label"])
        except Exception as e:  # noqa: BLE001 -- a plot must never lose the results
            print(f"lp.bench.sweep: plot failed: {e}", file=sys.stderr)


__all__ = ["markdown", "summarize", "write"]

"""Pure metric functions of the benchmark (no torch, no I/O): step compression S, the histogram
of tokens accepted per step, step-latency statistics, speedup against the autoregressive
baseline of the same run, exactness against the greedy reference, and per-group aggregation of
result rows.

Conventions (docs/design.md section 1):
- S = generated tokens / decoding steps and tokens/s are `lp.decode.throughput`'s formulas, the ones
  lp's own results use (nan when undefined). For lp a step is one forward of the step layout
  (its prefill is separate and not a step); for transformers decoders a step is one model
  forward, the first of which (prompt -> first token) is also timed as their prefill.
- speedup = baseline decode seconds / decoder decode seconds on the same prompt, in the same
  run. Over a group of prompts it is the ratio of summed decode seconds (a throughput ratio,
  the way Spec-Bench pools it), computed only over prompts where both ran.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from lp.decode.throughput import NAN, tokens_per_s, tokens_per_step  # S and tokens/s: one formula for lp and the bench


def mean_step_tokens(step_tokens: Iterable[int]) -> float:
    """Mean tokens fed to a step's forward, what S is bought with (nan when no step ran)."""
    t = list(step_tokens)
    return sum(t) / len(t) if t else NAN


def accepted_histogram(accepted_per_step: Iterable[int]) -> dict[int, int]:
    """How many steps committed k tokens, for each k seen: `{k: count}`, sorted by k."""
    counts = Counter(int(a) for a in accepted_per_step)
    if any(k < 0 for k in counts):
        raise ValueError("a step cannot commit a negative number of tokens")
    return dict(sorted(counts.items()))


def merge_histograms(histograms: Iterable[dict]) -> dict[int, int]:
    """Sum histograms; keys may be ints or their JSON string form."""
    total: Counter = Counter()
    for h in histograms:
        for k, v in (h or {}).items():
            total[int(k)] += int(v)
    return dict(sorted(total.items()))


def histogram_fractions(hist: dict) -> dict[int, float]:
    n = sum(int(v) for v in hist.values())
    return {int(k): (int(v) / n if n else NAN) for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))}


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count); nan when empty."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return NAN
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def intervals(starts: Sequence[float], end: float) -> list[float]:
    """Per-step latencies from step start times and the time the last step ended: step i lasts
    from its start to the next step's start (so host work between forwards is included)."""
    if not starts:
        return []
    bounds = list(starts) + [end]
    out = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if any(x < 0 for x in out):
        raise ValueError("step times must be non-decreasing")
    return out


def speedup(baseline_seconds: float | None, seconds: float | None) -> float:
    """How many times faster than the baseline (nan if either is missing or not positive)."""
    if baseline_seconds is None or seconds is None:
        return NAN
    if baseline_seconds <= 0 or seconds <= 0 or math.isnan(baseline_seconds) or math.isnan(seconds):
        return NAN
    return baseline_seconds / seconds


def outside_forward(forward_seconds: float, decode_seconds: float) -> float:
    """Share of decode time spent outside the model forward: host work between forwards, plus
    the all-gather under LP (nan without a positive decode time)."""
    if not decode_seconds or decode_seconds <= 0:
        return NAN
    return max(0.0, 1.0 - forward_seconds / decode_seconds)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (a length difference
    counts at the shorter length); None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def geomean(values: Iterable[float]) -> float:
    xs = [v for v in values if v is not None and not math.isnan(v) and v > 0]
    if not xs:
        return NAN
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def _ok(row: dict) -> bool:
    return row.get("status", "ok") == "ok"


def summarize(
    rows: Sequence[dict], by: Sequence[str] = ("decoder", "category"), overall: str | None = "all"
) -> list[dict]:
    """Aggregate per-prompt rows into one summary row per group of `by` keys (only rows whose
    status is "ok" contribute). With `overall`, also one row per decoder over every category
    (its category is `overall`). Speedup pools decode seconds over the prompts that have both
    this decoder's and the baseline's timing (`baseline_seconds` set on the row)."""
    groups: dict[tuple, list[dict]] = {}
    order: list[tuple] = []

    def add(key: tuple, row: dict) -> None:
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(row)

    status_of: dict[tuple, list[str]] = {}
    for row in rows:
        key = tuple(row.get(k) for k in by)
        keys = [key]
        if overall is not None and "category" in by:
            keys.append(tuple(overall if k == "category" else row.get(k) for k in by))
        for k in keys:
            if _ok(row):
                add(k, row)
            else:
                status_of.setdefault(k, []).append(str(row.get("status")))
                if k not in groups:
                    groups[k] = []
                    order.append(k)
    out = []
    for key in order:
        rs = groups[key]
        new = sum(int(r["new_tokens"]) for r in rs)
        steps = sum(int(r["steps"]) for r in rs)
        dec = sum(float(r["decode_seconds"]) for r in rs)
        pre = sum(float(r["prefill_seconds"]) for r in rs)
        lat = [x for r in rs for x in (r.get("step_latencies") or [])]
        paired = [
            r for r in rs if r.get("baseline_seconds") is not None and not math.isnan(float(r["baseline_seconds"]))
        ]
        base = sum(float(r["baseline_seconds"]) for r in paired)
        mine = sum(float(r["decode_seconds"]) for r in paired)
        timed = [r for r in rs if r.get("forward_seconds") is not None]
        matches = [r.get("matches_greedy") for r in rs if r.get("matches_greedy") is not None]
        first = rs[0] if rs else {}
        summary = dict(zip(by, key))
        summary.update(
            label=first.get("label"),
            world_size=first.get("world_size"),
            prompts=len(rs),
            new_tokens=new,
            steps=steps,
            S=tokens_per_step(new, steps),
            step_tokens=(sum(int(r.get("step_tokens_total") or 0) for r in rs) / steps) if steps else NAN,
            S_mean=(sum(tokens_per_step(int(r["new_tokens"]), int(r["steps"])) for r in rs) / len(rs)) if rs else NAN,
            prefill_seconds=pre,
            decode_seconds=dec,
            tokens_per_s=tokens_per_s(new, dec),
            step_latency_median=median(lat),
            accepted_hist=merge_histograms(r.get("accepted_hist") for r in rs),
            speedup=speedup(base, mine) if paired else NAN,
            speedup_geomean=geomean(float(r.get("speedup", NAN)) for r in paired),
            outside_forward=outside_forward(
                sum(float(r["forward_seconds"]) for r in timed), sum(float(r["decode_seconds"]) for r in timed)
            )
            if timed
            else NAN,
            matches_greedy=(all(matches) if matches else None),
            mismatches=sum(1 for m in matches if m is False),
            status="ok" if rs else "; ".join(sorted(set(status_of.get(key, [])))) or "no rows",
        )
        if rs and status_of.get(key):
            summary["status"] = f"ok ({len(status_of[key])} not run: {'; '.join(sorted(set(status_of[key])))})"
        out.append(summary)
    # Order: decoders as first seen, then their categories as first seen, `overall` last.
    rank = {k: {} for k in by}
    for key in order:
        for name, v in zip(by, key):
            if v != overall:
                rank[name].setdefault(v, len(rank[name]))
    return sorted(
        out, key=lambda s: tuple((1, 0) if s.get(k) == overall else (0, rank[k].get(s.get(k), 0)) for k in by)
    )

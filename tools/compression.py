"""Step compression S (generated tokens per decoding step) on Spec-Bench category groups.

    python -m tools.compression [--per-group 8] [--max-new-tokens 128]
        [--configs W5N3G5,W7N5G7] [--out DIR] [--resume]

Configs are named as lp.bench names them (W5N3G5: W=5 N=3 G=5). World size 1, greedy, chat
template, default model. Prompts: the first `--per-group` of each of the 6 groups (mt_bench =
Spec-Bench's first 80 lines, translation, summarization, qa, math_reasoning, rag). Writes one
JSONL per config (`OUT/W5N3G5.jsonl`, ...) and `OUT/table.md` (group x config: mean S and the
histogram of tokens committed per step). S is hardware independent; this script deliberately
reports no tokens/s (the machine it ran on was shared). `--table-only` rebuilds the table from
the JSONL files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from tools.exactness import GROUPS, ROOT, cfg_name, parse_configs, pick_prompts


def run(args, prompts, configs, out_dir: Path) -> None:
    import torch
    from tqdm import tqdm

    from lp import LP

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = LP(args.model)
    done: dict[str, set] = {}
    files = {}
    for c in configs:
        path = out_dir / f"{cfg_name(c)}.jsonl"
        done[cfg_name(c)] = set()
        if args.resume and path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    done[cfg_name(c)].add(json.loads(line)["question_id"])
        files[cfg_name(c)] = open(path, "a" if args.resume else "w", encoding="utf-8")
    jobs = [(p, c) for p in prompts for c in configs if p["question_id"] not in done[cfg_name(c)]]
    try:
        bar = tqdm(jobs, desc="compression", file=sys.stderr, mininterval=5, ncols=100)
        for p, (n, w, g) in bar:
            bar.set_postfix_str(f"q{p['question_id']} {cfg_name((n, w, g))}")
            ids = p.get("ids") or lm.encode(p["text"], chat=True)
            p["ids"] = ids
            r = lm.generate(ids, W=w, N=n, G=g, max_new_tokens=args.max_new_tokens)
            row = {
                "question_id": p["question_id"],
                "group": p["group"],
                "category": p["category"],
                "config": cfg_name((n, w, g)),
                "N": n,
                "W": w,
                "G": g,
                "world_size": r.world_size,
                "prompt_len": len(ids),
                "new_tokens": r.new_tokens,
                "steps": r.steps,
                "compression": r.compression,
                "accepted_per_step": r.accepted_per_step,
                "output_ids": r.output_ids,
            }
            f = files[cfg_name((n, w, g))]
            f.write(json.dumps(row) + "\n")
            f.flush()
    finally:
        for f in files.values():
            f.close()
        lm.close()


def table(out_dir: Path, configs: list[str], max_new: int) -> str:
    rows = {}
    for c in configs:
        path = out_dir / f"{c}.jsonl"
        rows[c] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    lines = [
        f"Step compression S on Spec-Bench (SmolLM2-135M-Instruct fp32, greedy, chat template, "
        f"{max_new} new tokens, world size 1). Cell: mean S over prompts (n prompts). "
        "S = generated tokens / decoding steps, every step counted (hardware independent).",
        "",
        "| group | " + " | ".join(configs) + " |",
        "|---|" + "---|" * len(configs),
    ]
    for grp in (*GROUPS, "all"):
        cells = []
        for c in configs:
            rs = [r for r in rows[c] if grp == "all" or r["group"] == grp]
            cells.append("-" if not rs else f"{sum(r['compression'] for r in rs) / len(rs):.3f} ({len(rs)})")
        lines.append(f"| {'**all**' if grp == 'all' else grp} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Tokens committed per step: share of steps committing k tokens (k = 1..N), pooled "
        "over the group's steps; last column: mean tokens per step pooled (total tokens / total steps).",
        "",
    ]
    for c in configs:
        if not rows[c]:
            continue
        N = rows[c][0]["N"]
        lines += [
            f"**{c}**",
            "",
            "| group | " + " | ".join(f"k={k}" for k in range(1, N + 1)) + " | pooled S |",
            "|---|" + "---|" * (N + 1),
        ]
        for grp in (*GROUPS, "all"):
            rs = [r for r in rows[c] if grp == "all" or r["group"] == grp]
            if not rs:
                continue
            h = Counter(k for r in rs for k in r["accepted_per_step"])
            steps = sum(h.values())
            toks = sum(k * v for k, v in h.items())
            extra = sorted(k for k in h if k > N or k < 1)
            cells = [f"{100 * h.get(k, 0) / steps:.1f}%" for k in range(1, N + 1)]
            lines.append(
                f"| {'**all**' if grp == 'all' else grp} | "
                + " | ".join(cells)
                + f" | {toks / steps:.3f} |"
                + (f" (k outside 1..N: {extra})" if extra else "")
            )
        lines.append("")
    # exactness as a by-product: all configs must give the same tokens for the same prompt
    if len(configs) > 1:
        by_q: dict = {}
        for c in configs:
            for r in rows[c]:
                by_q.setdefault(r["question_id"], {})[c] = r["output_ids"]
        both = {q: v for q, v in by_q.items() if len(v) == len(configs)}
        diff = [q for q, v in both.items() if len({tuple(x) for x in v.values()}) > 1]
        lines.append(
            f"Cross-config check: {len(both) - len(diff)}/{len(both)} prompts give identical "
            f"output ids under every config" + (f"; differing: {sorted(diff)}" if diff else "") + "."
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--configs", default="W5N3G5,W7N5G7", help="lookahead shapes, comma separated (W5N3G5: W=5 N=3 G=5)"
    )
    ap.add_argument("--table-configs", default=None, help="configs shown in the table (default: all JSONL files)")
    ap.add_argument("--out", default=str(ROOT / "results" / "compression"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--resume", action="store_true", help="skip prompts already in the JSONL files")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = parse_configs(args.configs)
    prompts = pick_prompts(args.per_group * len(GROUPS))
    t0 = time.perf_counter()
    if not args.table_only:
        print(
            f"{len(prompts)} prompts x {len(configs)} configs {[cfg_name(c) for c in configs]}, "
            f"{args.max_new_tokens} new tokens",
            flush=True,
        )
        run(args, prompts, configs, out_dir)
    shown = (
        args.table_configs.split(",")
        if args.table_configs
        else sorted(
            (p.stem for p in out_dir.glob("N*W*G*.jsonl")),
            key=lambda s: tuple(int(x) for x in s[1:].replace("W", " ").replace("G", " ").split()),
        )
    )
    text = table(out_dir, shown, args.max_new_tokens)
    (out_dir / "table.md").write_text(text)
    print(text)
    print(f"wrote {out_dir / 'table.md'} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

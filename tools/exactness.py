"""Full exactness check: lookahead decoding under Lookahead Parallelism must reproduce plain
greedy decoding (transformers `model.generate(do_sample=False)`) token for token, for every
prompt, every lookahead shape and every world size.

    python -m tools.exactness [--prompts 20] [--max-new-tokens 128] [--world-sizes 1,2,3,4]
        [--configs W5N2G5,W3N3G3,W7N5G7,W15N5G15,W5N3G0] [--out DIR]

Configs are named as lp.bench names them: W15N5G15, with options after dashes (W3N3G15-L128-D14:
steps of at most 128 tokens, text drafts of up to 14). `--tp T` runs every world size as world
size / T LP replicas, each a tensor-parallel group of T ranks (world sizes must be multiples of T), e.g. SmolLM2-135M (9
heads, 3 KV heads) at tp=3:

    python -m tools.exactness --tp 3 --world-sizes 3,6 --prompts 6 --max-new-tokens 64 \
        --configs W15N5G15 --out results/exactness/tp3

`--batch B` decodes the prompt x config jobs B at a time in one batch per world size (continuous
batching: each job joins as another ends, lp/decode/batch.py), so every output is checked inside a
batch whose sequences join and leave around it; `--same-steps DIR` then compares each job's steps
with another run's (its decode alone: `--batch 1`):

    python -m tools.exactness --prompts 48 --world-sizes 1,2 --configs auto,W3N3G15-L128-D14 --batch 8 \
        --out results/exactness/batch8

A quick slice for CI (about 1-2 minutes on 2 CPU cores):

    python -m tools.exactness --quick          # = --prompts 2 --max-new-tokens 24
                                                #   --world-sizes 1,2 --configs W3N3G3
                                                #   --out results/exactness/quick

Flow: prompts are picked deterministically from Spec-Bench (round robin over the 6 category
groups: mt_bench, translation, summarization, qa, math_reasoning, rag; the first k of each) and
encoded with the chat template; greedy references are computed once on fp32 CPU and cached in
`OUT/references.json` (keyed by a hash of the prompt ids and max_new_tokens). Then, per world
size P, ONE `torchrun --standalone --nproc_per_node P` process group runs this script with
`--worker`: every rank loads the model once and decodes every prompt x config; rank 0 writes
`OUT/raw/ws{P}.jsonl`. Finally every output is compared with its reference; a table
(`OUT/table.md`) and `OUT/summary.json` are written, and the exit status is 1 on any mismatch
or failed world size (the mismatches are listed with their first differing position).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lp.bench.shapes import parse_lookahead

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("LP_SPEC_BENCH", ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"))
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
QUICK = dict(prompts=2, max_new_tokens=24, world_sizes="1,2", configs="W3N3G3", threads=1)


# ----------------------------------------------------------------------------- helpers
def group_of(line_no: int, category: str) -> str:
    """Spec-Bench's first 80 lines are MT-Bench (8 sub-categories); the rest are named."""
    return "mt_bench" if line_no < 80 else category


def pick_prompts(k: int, path: Path = DATA) -> list[dict]:
    """The first prompts of each category group, taken round robin until `k` are picked."""
    by_group: dict[str, list[dict]] = {g: [] for g in GROUPS}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if line.strip():
                row = json.loads(line)
                g = group_of(n, row["category"])
                by_group.setdefault(g, []).append(
                    {
                        "question_id": row["question_id"],
                        "group": g,
                        "category": row["category"],
                        "text": row["turns"][0],
                    }
                )
    picked, i = [], 0
    while len(picked) < k:
        added = False
        for g in GROUPS:
            if i < len(by_group[g]) and len(picked) < k:
                picked.append(by_group[g][i])
                added = True
        if not added:
            break
        i += 1
    return picked


def parse_configs(text: str) -> list[str]:
    """Configs as lp.bench names them ("W15N5G15", "W3N3G15-L128-D14", "auto": W=auto's shapes, their
    trees cut by the step's budget), checked."""
    out = []
    for part in text.split(","):
        try:
            parse_lookahead(part)
        except ValueError as e:
            raise SystemExit(f"exactness: {e}") from None
        out.append(part)
    return out


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- worker mode
def worker(args) -> None:
    """Runs on every rank under torchrun: load once, decode every job, rank 0 writes JSONL."""
    import torch
    from tqdm import tqdm

    from lp import LP

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    spec = json.loads(Path(args.jobs).read_text())
    # no draft memory: each prompt's steps its own (--same-steps compares them across batch sizes)
    lm = LP(spec["model"], timeout_s=spec.get("timeout_s", 600), tp=spec.get("tp", 1), draft_memory=0)
    main = lm.comm.is_main
    if main:
        import lp

        print(
            f"worker: lp from {Path(lp.__file__).parent}, world size {lm.comm.world_size}, tp={lm.tp.size}, "
            f"{torch.get_num_threads()} threads per rank",
            file=sys.stderr,
            flush=True,
        )
    done = set()
    if main and args.resume and Path(args.results).exists():
        for line in Path(args.results).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done.add((row["key"], row["config"]))
    # every rank must skip the same jobs: share rank 0's "done" decision through the jobs order
    jobs = [(p, c) for p in spec["prompts"] for c in spec["configs"]]
    if lm.comm.world_size > 1:
        import torch.distributed as dist

        flags = torch.tensor([int((p["key"], c) in done) for p, c in jobs], dtype=torch.long)
        dist.broadcast(flags, src=0)
        todo = [j for j, f in zip(jobs, flags.tolist()) if not f]
    else:
        todo = [(p, c) for p, c in jobs if (p["key"], c) not in done]
    out = open(args.results, "a" if args.resume else "w", encoding="utf-8") if main else None
    try:
        bar = tqdm(
            total=len(todo),
            disable=not main,
            desc=f"ws{lm.comm.world_size}",
            file=sys.stderr,
            mininterval=5,
            dynamic_ncols=False,
            ncols=100,
        )
        batch = spec.get("batch", 1)
        items = [{"prompt": p["ids"], "max_new_tokens": spec["max_new_tokens"], **parse_lookahead(c)} for p, c in todo]
        for r in lm.stream(items, batch=batch):
            p, c = todo[r.index]
            bar.update()
            bar.set_postfix_str(f"q{p['question_id']} {c}")
            if main:
                settings = parse_lookahead(c)
                row = {
                    "key": p["key"],
                    "question_id": p["question_id"],
                    "group": p["group"],
                    "config": c,
                    "N": settings["N"],
                    "W": settings["W"],
                    "G": settings["G"],
                    "world_size": r.world_size,
                    "tp": r.tp,
                    "batch": batch,
                    "output_ids": r.output_ids,
                    "steps": r.steps,
                    "S": r.S,
                    "accepted_per_step": r.accepted_per_step,
                    "seconds": round(r.seconds, 3),
                    "prefill_seconds": round(r.prefill_seconds, 3),
                }
                out.write(json.dumps(row) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
        lm.close()


# ----------------------------------------------------------------------------- orchestrator
def references(prompts: list[dict], max_new: int, model: str, out_dir: Path) -> tuple[list[dict], dict]:
    """Encode prompts (chat template) and compute / load cached greedy references."""
    import torch

    from lp import LP
    from lp.bench.references import References, key

    refs = References(out_dir / "references.json")
    cache = refs.entries
    lm = LP(model, draft_memory=0)
    for p in prompts:
        p["ids"] = lm.encode(p["text"], chat=True)
        p["key"] = key(p["ids"], max_new)
    missing = [p for p in prompts if p["key"] not in cache]
    if missing:
        from tqdm import tqdm

        print(f"computing {len(missing)} greedy references (transformers generate, fp32 CPU)", flush=True)
        for p in tqdm(missing, desc="references", file=sys.stderr, mininterval=5, ncols=100):
            x = torch.tensor([p["ids"]], dtype=torch.long)
            t0 = time.perf_counter()
            with torch.no_grad():
                y = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)
            seconds = round(time.perf_counter() - t0, 2)
            refs.put(p["ids"], max_new, y[0, len(p["ids"]) :].tolist(), question_id=p["question_id"], seconds=seconds)
    else:
        print(f"all {len(prompts)} references cached in {refs.path}", flush=True)
    del lm
    return prompts, cache


def launch(P: int, jobs_path: Path, results_path: Path, args) -> int:
    env = dict(os.environ)
    threads = args.threads or max(1, args.cores // P)
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [
        torchrun,
        "--standalone",
        "--nproc_per_node",
        str(P),
        str(Path(__file__).resolve()),
        "--worker",
        "--jobs",
        str(jobs_path),
        "--results",
        str(results_path),
    ]
    if args.resume:
        cmd.append("--resume")
    print(f"\n=== world size {P} (OMP_NUM_THREADS={threads}): {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, env=env, cwd=ROOT)
    print(f"=== world size {P}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
    return rc


def compare(
    prompts, cache, configs, world_sizes, rcs, out_dir: Path, max_new: int, tp: int = 1
) -> tuple[dict, list[dict]]:
    cells, mismatches, missing = {}, [], []
    for P in world_sizes:
        path = out_dir / "raw" / f"ws{P}.jsonl"
        rows = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    rows[(r["key"], r["config"])] = r
        for c in configs:
            name = c
            matched, total, S, steps, toks = 0, 0, [], 0, 0
            for p in prompts:
                r = rows.get((p["key"], name))
                if r is None:
                    missing.append({"question_id": p["question_id"], "config": name, "world_size": P})
                    continue
                total += 1
                ref = cache[p["key"]]["output_ids"]
                d = first_diff(r["output_ids"], ref)
                S.append(r["S"])
                steps += r["steps"]
                toks += len(r["output_ids"])
                if d is None:
                    matched += 1
                else:
                    mismatches.append(
                        {
                            "question_id": p["question_id"],
                            "group": p["group"],
                            "config": name,
                            "world_size": P,
                            "first_diff": d,
                            "got": r["output_ids"][d : d + 5],
                            "want": ref[d : d + 5],
                            "got_len": len(r["output_ids"]),
                            "want_len": len(ref),
                        }
                    )
            cells[f"ws{P}/{name}"] = {
                "world_size": P,
                "config": name,
                "matched": matched,
                "total": total,
                "expected": len(prompts),
                "mean_S": (sum(S) / len(S)) if S else None,
                "pooled_S": (toks / steps) if steps else None,
            }
    summary = {
        "ok": not mismatches and not missing and all(rc == 0 for rc in rcs.values()),
        "prompts": [
            {
                "question_id": p["question_id"],
                "group": p["group"],
                "prompt_len": len(p["ids"]),
                "ref_len": len(cache[p["key"]]["output_ids"]),
            }
            for p in prompts
        ],
        "max_new_tokens": max_new,
        "configs": [c for c in configs],
        "world_sizes": world_sizes,
        "tp": tp,
        "exit_codes": {str(k): v for k, v in rcs.items()},
        "cells": cells,
        "mismatches": mismatches,
        "missing": missing[:50],
        "n_missing": len(missing),
    }
    return summary, mismatches


STEP_FIELDS = ("output_ids", "steps", "accepted_per_step")


def same_steps(out_dir: Path, base_dir: Path) -> dict:
    """Each result of `out_dir` against the result of the same prompt and config in `base_dir`
    (another run, e.g. of the code before a change that must not change a decode): equal
    outputs, steps and per-step acceptances, or the fields that differ."""

    def rows(d: Path) -> list[dict]:
        return [json.loads(x) for f in sorted((d / "raw").glob("ws*.jsonl")) for x in f.read_text().splitlines() if x]

    base = {(r["key"], r["config"]): r for r in rows(base_dir)}
    same, differ = 0, []
    for r in rows(out_dir):
        b = base.get((r["key"], r["config"]))
        fields = STEP_FIELDS if b is None else [f for f in STEP_FIELDS if r[f] != b[f]]
        if fields:
            differ.append({"question_id": r["question_id"], "world_size": r["world_size"], "fields": list(fields)})
        else:
            same += 1
    return {"base": str(base_dir), "same": same, "total": same + len(differ), "differ": differ}


def table(summary: dict) -> str:
    cfgs = summary["configs"]
    lines = [
        f"Exactness vs transformers greedy `generate` ({len(summary['prompts'])} Spec-Bench prompts, "
        f"{summary['max_new_tokens']} new tokens, SmolLM2-135M fp32 CPU"
        + (f", tp={summary['tp']}: world size / {summary['tp']} replicas" if summary.get("tp", 1) > 1 else "")
        + "). Cell: matched/total, mean S.",
        "",
        "| world size | " + " | ".join(cfgs) + " |",
        "|---|" + "---|" * len(cfgs),
    ]
    for P in summary["world_sizes"]:
        cells = []
        for c in cfgs:
            x = summary["cells"][f"ws{P}/{c}"]
            s = "-" if x["mean_S"] is None else f"{x['mean_S']:.2f}"
            flag = "" if x["matched"] == x["expected"] else " **!**"
            cells.append(f"{x['matched']}/{x['expected']}, S {s}{flag}")
        rc = summary["exit_codes"].get(str(P))
        lines.append(f"| {P}{'' if rc in (0, None) else f' (exit {rc})'} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Config names are N (n-gram size), W (window), G (max verification n-grams); "
        "S = generated tokens / decoding steps (hardware independent)."
    )
    lines.append(
        f"Overall: {'ALL MATCH' if summary['ok'] else 'FAIL'}"
        f" ({len(summary['mismatches'])} mismatches, {summary['n_missing']} missing)."
    )
    same = summary.get("same_steps")
    if same:
        lines.append(
            f"Against the run in `{same['base']}`: {same['same']}/{same['total']} results with the same outputs, "
            "steps and per-step acceptances"
            + "".join(
                f"; q{d['question_id']} ws{d['world_size']} differs in {', '.join(d['fields'])}" for d in same["differ"]
            )
            + "."
        )
    if summary["mismatches"]:
        lines += [
            "",
            "| question_id | group | config | world size | first differing position | got | want |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in summary["mismatches"]:
            lines.append(
                f"| {m['question_id']} | {m['group']} | {m['config']} | {m['world_size']} | "
                f"{m['first_diff']} | {m['got']} | {m['want']} |"
            )
    return "\n".join(lines) + "\n"


def snapshot_lp(out_dir: Path) -> dict:
    """Freeze the `lp` package under test: copy it to OUT/raw/lp_snapshot and put that first on
    the path of this process and of every worker, so that all world sizes test the same code
    even while lp/ is being edited. Returns what was frozen (git HEAD, dirty files, content hash)."""
    src, dst = ROOT / "lp", out_dir / "raw" / "lp_snapshot"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst / "lp", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    digest = hashlib.sha1()
    for f in sorted((dst / "lp").rglob("*.py")):
        digest.update(str(f.relative_to(dst)).encode() + b"\0" + f.read_bytes())
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    sys.path.insert(0, str(dst))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(dst), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {
        "path": str(dst),
        "git_head": git("rev-parse", "HEAD"),
        "dirty": git("status", "--short", "--", "lp").splitlines(),
        "sha1": digest.hexdigest()[:16],
    }


def report_only(args) -> int:
    """Rebuild the table from what OUT/raw/ws*.jsonl hold so far (progress of a running check):
    prints it and writes OUT/progress.md; never touches table.md / summary.json."""
    out_dir = Path(args.out)
    spec = json.loads((out_dir / "jobs.json").read_text())
    cache = json.loads((out_dir / "references.json").read_text())
    prompts = [p for p in spec["prompts"] if p["key"] in cache]
    configs = list(spec["configs"])
    world_sizes = [int(x) for x in args.world_sizes.split(",")]
    summary, _ = compare(prompts, cache, configs, world_sizes, {}, out_dir, spec["max_new_tokens"], spec.get("tp", 1))
    text = "PARTIAL (run in progress)\n\n" + table(summary)
    (out_dir / "progress.md").write_text(text)
    print(text)
    return 0 if not summary["mismatches"] else 1


def orchestrate(args) -> int:
    out_dir = Path(args.out)
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    frozen = snapshot_lp(out_dir) if args.snapshot else {"path": str(ROOT / "lp"), "live": True}
    print(f"testing lp from {frozen['path']} {frozen.get('sha1', '(live)')}", flush=True)
    gi = out_dir / ".gitignore"
    if not gi.exists():
        gi.write_text("raw/\nlog.txt\njobs.json\nprogress.md\n")
    configs = parse_configs(args.configs)
    world_sizes = [int(x) for x in args.world_sizes.split(",")]
    prompts = pick_prompts(args.prompts)
    names = ", ".join(f"q{p['question_id']}/{p['group']}" for p in prompts)
    print(
        f"{len(prompts)} prompts ({names}), "
        f"{len(configs)} configs, world sizes {world_sizes}, max_new_tokens {args.max_new_tokens}",
        flush=True,
    )
    prompts, cache = references(prompts, args.max_new_tokens, args.model, out_dir)
    jobs_path = out_dir / "jobs.json"
    jobs_path.write_text(
        json.dumps(
            {
                "model": args.model,
                "max_new_tokens": args.max_new_tokens,
                "timeout_s": args.timeout_s,
                "tp": args.tp,
                "batch": args.batch,
                "configs": configs,
                "prompts": [{k: p[k] for k in ("key", "question_id", "group", "ids")} for p in prompts],
            }
        )
    )
    rcs = {}
    t0 = time.perf_counter()
    for P in world_sizes:
        rcs[P] = launch(P, jobs_path, out_dir / "raw" / f"ws{P}.jsonl", args)
        summary, _ = compare(prompts, cache, configs, world_sizes, rcs, out_dir, args.max_new_tokens, args.tp)
        summary["wall_seconds"] = round(time.perf_counter() - t0)
        summary["command"] = " ".join([Path(sys.executable).name] + sys.argv)
        summary["lp_code"] = frozen
        if args.same_steps:
            summary["same_steps"] = same_steps(out_dir, Path(args.same_steps))
            summary["ok"] = summary["ok"] and not summary["same_steps"]["differ"]
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        (out_dir / "table.md").write_text(table(summary))  # updated after each world size
    print("\n" + table(summary), flush=True)
    if summary["mismatches"]:
        print("MISMATCHES:", file=sys.stderr)
        for m in summary["mismatches"]:
            print(
                f"  q{m['question_id']} ({m['group']}) {m['config']} ws{m['world_size']}: first diff at "
                f"{m['first_diff']} got {m['got']} want {m['want']}",
                file=sys.stderr,
            )
    if summary["n_missing"]:
        print(
            f"{summary['n_missing']} results missing (failed world sizes: {[P for P, rc in rcs.items() if rc]})",
            file=sys.stderr,
        )
    print(
        f"wrote {out_dir / 'table.md'} and {out_dir / 'summary.json'}: {'OK' if summary['ok'] else 'FAIL'}", flush=True
    )
    return 0 if summary["ok"] else 1


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--world-sizes", default="1,2,3,4")
    ap.add_argument(
        "--configs",
        default="W5N2G5,W3N3G3,W7N5G7,W15N5G15,W5N3G0",
        help="lookahead shapes, comma separated, as lp.bench names them: W15N5G15, W3N3G15-L128-D14",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="results folder (default results/exactness/run, results/exactness/quick with --quick)",
    )
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tp", type=int, default=1, help="ranks per replica (tensor parallelism)")
    ap.add_argument("--batch", type=int, default=1, help="jobs decoded together, each joining as another ends")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="threads per rank = max(1, cores // P)")
    ap.add_argument("--threads", type=int, default=0, help="force OMP_NUM_THREADS per rank")
    ap.add_argument("--timeout-s", type=float, default=900, help="collective timeout per step")
    ap.add_argument("--resume", action="store_true", help="keep results already in OUT/raw/ws*.jsonl")
    ap.add_argument(
        "--no-snapshot",
        dest="snapshot",
        action="store_false",
        help="test the live lp/ (default: a frozen copy, see snapshot_lp)",
    )
    ap.add_argument(
        "--report-only", action="store_true", help="only rebuild a progress table from OUT/raw (while a run is going)"
    )
    ap.add_argument(
        "--same-steps",
        metavar="BASE",
        help="also require the outputs, steps and per-step acceptances of every result to equal those of "
        "the same prompt and config in the run in BASE (e.g. of the code before a change)",
    )
    ap.add_argument("--quick", action="store_true", help="the CI slice: " + str(QUICK))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--jobs", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.report_only:
        args.out = args.out or str(ROOT / "results" / "exactness" / "run")
        sys.exit(report_only(args))
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.out is None:
        args.out = str(ROOT / "results" / "exactness" / ("quick" if args.quick else "run"))
    sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()

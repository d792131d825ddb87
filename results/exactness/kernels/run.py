"""Exactness of every matmul formulation on the real model: SmolLM2-135M-Instruct (fp32) decodes
Spec-Bench's 48 prompts (8 per category, chat template, 128 new tokens) with each formulation
forced (`kernels=NAME`, lp/engine/kernels.py), plain (`mode=ar`) and at two of W=auto's shapes
(its 11-token and 128-token steps), and every output is compared with transformers' greedy
`generate` token by token. The references are computed once and kept in `references.json`.

    python results/exactness/kernels/run.py [--prompts-per-category 8] [--threads N] [--out results/exactness/kernels]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from lp import LP, models
from lp.bench import datasets
from lp.decode.ladder import LADDER
from lp.engine.kernel_choice import cpu_name
from lp.engine.kernels import FORMULATIONS

SHAPES = {"ar": dict(mode="ar"), LADDER[0].name: asdict(LADDER[0]), LADDER[4].name: asdict(LADDER[4])}


def references(prompts, ids, eos, path: Path, max_new: int) -> dict[str, list[int]]:
    refs = json.loads(path.read_text()) if path.exists() else {}
    todo = [(p, x) for p, x in zip(prompts, ids) if str(p.id) not in refs]
    if todo:
        model = models.load("smollm2-135m")[0]
        for p, x in tqdm(todo, desc="references", file=sys.stderr):
            t = torch.tensor([x])
            out = model.generate(
                t,
                attention_mask=torch.ones_like(t),
                do_sample=False,
                max_new_tokens=max_new,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            refs[str(p.id)] = out[0, len(x) :].tolist()
            path.write_text(json.dumps(refs))
    return refs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts-per-category", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("results/exactness/kernels"))
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = datasets.load("spec_bench", None, per_category=args.prompts_per_category)
    names = [n for n, f in FORMULATIONS.items() if f.available(torch.device("cpu"), torch.float32)]
    rows = []
    for name in names:
        lm = LP("smollm2-135m", kernels=name)
        ids = [lm.encode(p.text, chat=True) for p in prompts]
        refs = references(prompts, ids, sorted(lm.decoder.eos_ids), args.out / "references.json", args.max_new_tokens)
        for shape, settings in SHAPES.items():
            same = steps = tokens = 0
            first_diffs = []
            for p, x in tqdm(list(zip(prompts, ids)), desc=f"{name} {shape}", file=sys.stderr):
                r = lm.generate(x, max_new_tokens=args.max_new_tokens, **settings)
                ref = refs[str(p.id)]
                ok = list(r.output_ids) == ref
                same += ok
                steps, tokens = steps + r.steps, tokens + r.new_tokens
                if not ok:
                    first_diffs.append(
                        (p.id, next((i for i, (a, b) in enumerate(zip(r.output_ids, ref)) if a != b), None))
                    )
            rows.append(
                dict(
                    kernels=name,
                    shape=shape,
                    identical=same,
                    prompts=len(prompts),
                    S=tokens / steps,
                    mismatches=first_diffs,
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
        lm.close()
        del lm
    head = [
        "# Exactness of every matmul formulation, SmolLM2-135M-Instruct fp32",
        "",
        f"- `python results/exactness/kernels/run.py --prompts-per-category {args.prompts_per_category} "
        f"--threads {torch.get_num_threads()}`, "
        f"{time.strftime('%Y-%m-%d')}, on {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads",
        f"- Spec-Bench, {len(prompts)} prompts ({args.prompts_per_category} per category), chat template, "
        f"{args.max_new_tokens} new tokens; each output against transformers' greedy `generate` (`references.json`)",
        "",
        "| kernels | decoding | identical | S |",
        "| --- | --- | --- | --- |",
    ]
    lines = [f"| {r['kernels']} | {r['shape']} | {r['identical']}/{r['prompts']} | {r['S']:.2f} |" for r in rows]
    (args.out / "table.md").write_text("\n".join(head + lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(head + lines))


if __name__ == "__main__":
    main()

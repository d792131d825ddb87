"""Every matmul formulation of a model on this machine, side by side, against the weight-read floor.

    python -m lp.bench.kernels [--model smollm2-135m] [--threads N] [--reps 5] [--out FILE.md]

Times whole steps as W=auto's calibration times them (lp/decode/auto.py: a plain step as
`mode=ar` runs it, and causal steps of 1 to 128 tokens after a 256-token prefill) with each
formulation forced and with the one a load chooses (lp/engine/kernel_choice.py, which times
whole forwards too), the runs alternating. Prints a markdown report (and writes it to `--out`): the CPU, torch and
threads, the other processes' load while it ran, the weights' bytes, a copy's bandwidth and the
weight-read floor they give (the weights' bytes at the copy's rate), and the tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from lp import models
from lp.decode.auto import step_costs
from lp.engine import kernel_choice
from lp.engine.kernel_choice import OtherLoad, cpu_name
from lp.engine.kernels import FORMULATIONS
from lp.worker import Worker

STEP_SIZES = (1, 2, 4, 8, 11, 16, 32, 64, 128)
CONTEXT = 512  # the workers' cache: calibration's 256-token prefill and its steps


def copy_gb_s(nbytes: int = 1 << 29, reps: int = 5) -> float:
    """A large copy's bandwidth, bytes read + written per second, in GB/s (the fastest of `reps`)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def report(model_name: str, reps: int) -> str:
    model, _ = models.load(model_name)
    others = OtherLoad()
    names = [n for n, f in FORMULATIONS.items() if f.available(torch.device("cpu"), torch.float32)]
    workers = {name: Worker(model, graphs=False, kernels=name, max_seq_len=CONTEXT) for name in names}
    matrices = workers["linear"].forward.matrices()
    weights = sum(m.weight.numel() * m.weight.element_size() for mats in matrices.values() for m in mats)
    gb_s = copy_gb_s()
    workers["auto"] = Worker(model, graphs=False, kernels="auto", max_seq_len=CONTEXT)
    curves = {name: [] for name in (*names, "auto")}
    for _ in range(reps):  # whole steps, the formulations alternating
        for name in curves:
            curves[name].append(step_costs(workers[name], sizes=STEP_SIZES, reps=1))
    floor_ms = 1e3 * weights / (gb_s * 1e9)  # as tools/steps.py counts it on a GPU
    busy = others.cores()
    lines = [
        f"# Matmul formulations on {cpu_name()}",
        "",
        f"- `python -m lp.bench.kernels --model {model_name} --threads {torch.get_num_threads()} --reps {reps}`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cores",
        f"- other processes kept {busy:.2f} cores busy on average while this ran",
        f"- {model_name}: {len(sum(matrices.values(), []))} weight matrices, {weights / 1e6:.0f} MB "
        f"(q/k/v and gate/up fused); a copy moves {gb_s:.1f} GB/s (bytes read + written), so the weight-read "
        f"floor is **{floor_ms:.1f} ms** a token (the weights' bytes at that rate, as tools/steps.py counts it)",
        f"- the `auto` rows below ran lp's own choice at load (fastest per size, "
        f"`{kernel_choice.HYSTERESIS:.0%}` hysteresis): **{workers['auto'].kernels.describe()}**",
        "",
        f"Whole steps as W=auto's calibration times them, ms (the fastest of {reps} runs, alternating; "
        "`plain`: a one-token step; `ar` tok/s: 1000 / plain):",
        "",
        _row(["kernels", "plain", *map(str, STEP_SIZES), "ar tok/s", "plain / floor"]),
        _row(["---"] * (len(STEP_SIZES) + 4)),
    ]
    for name, runs in curves.items():
        plain = min(c.plain_seconds for c in runs)
        steps = [min(c.seconds[i] for c in runs) for i in range(len(STEP_SIZES))]
        cells = [f"{1e3 * plain:.1f}", *(f"{1e3 * s:.1f}" for s in steps), f"{1 / plain:.1f}"]
        lines.append(_row([name, *cells, f"{1e3 * plain / floor_ms:.2f}x"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lp.bench.kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--reps", type=int, default=5, help="runs of the whole-step timings")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    text = report(args.model, args.reps)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"lp.bench.kernels: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Price (T, P) layouts, PROJECTED: P LP replicas, each a tensor-parallel group of T GPUs.

    python -m tools.layouts [--projection results/projection/h100-llama-7b-spec-bench/project.json]
        [--gpus 1,2,4,8] [--allgather-ms 0.05] [--allreduce-gbps 150] [--out DIR]

Inputs (measured): a strong-scaling projection's rows (`python -m tools.project`): for each P,
the decode's S and the mean forward time of the slowest rank's share on ONE GPU, and the
1-token `mode=ar` step on that GPU. What the tool adds is a model of a T-GPU group's step:

    step_T(n) = step_1(n) * (a + (1 - a) / T) + 2 * layers * (lat + 2 (T-1)/T * n * hidden * 2 B / bw)

`a`: the share of a step that tensor parallelism does not split (embedding, lm_head, norms,
launches); `lat`: one all-reduce's latency; both fitted (least squares) to the published
tensor-parallel speedups of gpt-fast's README (Llama-2-7B, bf16, batch 1, 8x A100-80GB
power-limited to 330 W: 104.9 tok/s on 1 GPU, 168.8 on 2, 254.0 on 4, 328.4 on 8), where the
1-token all-reduce's bandwidth term is negligible. Assumed: that `a` and `lat` carry over from
those A100s to the projection's GPU; the all-reduce bus bandwidth `bw` (for steps of n tokens,
whose all-reduces carry n x hidden values); the LP all-gather between replicas (`--allgather-ms`,
across nodes when a layout spans them). A layout's tokens/s is S(P) / (step_T + all-gather).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROJECTION = ROOT / "results" / "projection" / "h100-llama-7b-spec-bench" / "project.json"
# gpt-fast README, Llama-2-7B bf16 batch 1 on 8x A100-80GB (330 W): tensor-parallel ranks -> tok/s
PUBLISHED_TP = {1: 104.9, 2: 168.8, 4: 254.0, 8: 328.4}
PUBLISHED_SOURCE = "gpt-fast README: Llama-2-7B bf16, batch 1, 8x A100-80GB power-limited to 330 W"
ARCH = {"layers": 32, "hidden": 4096}  # Llama-2-7B, the projection's arch
LABEL = (
    "PROJECTION, not a multi-GPU run: measured: S and one GPU's step costs (the projection named); "
    "fitted: the unsplit share and the all-reduce latency, to published A100 tensor-parallel speedups; "
    "assumed: those carry over to this GPU, the all-reduce bandwidth, the LP all-gather"
)


@dataclass(frozen=True)
class GroupModel:
    """A tensor-parallel group's step from one GPU's: the fitted unsplit share `a` and the
    all-reduce latency `lat_ms`, with the assumed bus bandwidth `gbps`."""

    a: float
    lat_ms: float
    gbps: float
    layers: int = ARCH["layers"]
    hidden: int = ARCH["hidden"]

    def allreduce_ms(self, T: int, tokens: float) -> float:
        """One step's all-reduces (two per layer), for steps of `tokens` tokens (bf16)."""
        if T == 1:
            return 0.0
        ring = 2 * (T - 1) / T * tokens * self.hidden * 2 / (self.gbps * 1e9) * 1e3
        return 2 * self.layers * (self.lat_ms + ring)

    def step_ms(self, one_gpu_ms: float, T: int, tokens: float) -> float:
        return one_gpu_ms * (self.a + (1 - self.a) / T) + self.allreduce_ms(T, tokens)


def fit(published: dict[int, float] = PUBLISHED_TP, layers: int = ARCH["layers"], gbps: float = 150.0) -> GroupModel:
    """`a` and the all-reduce latency that best reproduce the published 1-token speedups:
    1 / speedup(T) = a + (1 - a) / T + 2 * layers * lat / step_1, linear in a and lat."""
    step1 = 1e3 / published[1]
    Ts = [T for T in sorted(published) if T > 1]
    A = np.array([[1 - 1 / T, 2 * layers / step1] for T in Ts])
    b = np.array([published[1] / published[T] - 1 / T for T in Ts])
    (a, lat), *_ = np.linalg.lstsq(A, b, rcond=None)
    return GroupModel(float(a), float(lat), gbps, layers)


def price(rows: list[dict], model: GroupModel, gpus: list[int], allgather_ms: float) -> list[dict]:
    """Every (T, P) with T * P GPUs in `gpus`, T in {1, 2, 4, 8} and P among the rows."""
    by_P = {r["P"]: r for r in rows}
    ar_ms = 1e3 / rows[0]["ar_tok_s"]
    out = []
    for world in gpus:
        for T in (1, 2, 4, 8):
            P = world // T
            if world % T or P not in by_P:
                continue
            r = by_P[P]
            step = model.step_ms(r["slowest_rank_ms_mean"], T, r["slowest_rank_tokens_mean"])
            gather = allgather_ms if P > 1 else 0.0
            ar = model.step_ms(ar_ms, T, 1)
            out.append(
                {
                    "gpus": world,
                    "T": T,
                    "P": P,
                    "W": r["W"],
                    "N": r["N"],
                    "G": r["G"],
                    "S": r["S"],
                    "step_ms": step + gather,
                    "tok_s": r["S"] / (step + gather) * 1e3,
                    "tp_ar_tok_s": 1e3 / ar if P == 1 else None,
                }
            )
    return out


def markdown(priced: list[dict], model: GroupModel, source: dict, allgather_ms: float) -> str:
    lines = [
        f"**{LABEL}.**",
        "",
        f"One GPU's costs and S: {source['path']} ({source.get('device_name')}, {source.get('arch')}, "
        f"{source.get('dataset')}). Fitted to {PUBLISHED_SOURCE}: unsplit share a = {model.a:.3f}, "
        f"all-reduce latency {model.lat_ms * 1e3:.1f} us; assumed all-reduce bandwidth {model.gbps:g} GB/s, "
        f"LP all-gather {allgather_ms:g} ms.",
        "",
        "| GPUs | T (tp) | P (replicas) | W,N,G | S | step ms | tok/s | tp alone, mode=ar tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in priced:
        ar = "" if x["tp_ar_tok_s"] is None else f"{x['tp_ar_tok_s']:.1f}"
        lines.append(
            f"| {x['gpus']} | {x['T']} | {x['P']} | {x['W']},{x['N']},{x['G']} | {x['S']:.2f} | "
            f"{x['step_ms']:.2f} | {x['tok_s']:.1f} | {ar} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--projection", type=Path, default=DEFAULT_PROJECTION, help="a tools.project project.json")
    ap.add_argument("--gpus", default="1,2,4,8", help="GPU counts to price")
    ap.add_argument("--allgather-ms", type=float, default=0.05, help="assumed LP all-gather between replicas")
    ap.add_argument("--allreduce-gbps", type=float, default=150.0, help="assumed all-reduce bus bandwidth")
    ap.add_argument("--out", type=Path, default=None, help="write layouts.json and layouts.md here")
    args = ap.parse_args(argv)
    source = json.loads(args.projection.read_text())
    source["path"] = str(args.projection.relative_to(ROOT) if args.projection.is_relative_to(ROOT) else args.projection)
    model = fit(gbps=args.allreduce_gbps)
    priced = price(source["rows"], model, [int(g) for g in args.gpus.split(",")], args.allgather_ms)
    text = markdown(priced, model, source, args.allgather_ms)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"label": LABEL, "published": PUBLISHED_TP, "published_source": PUBLISHED_SOURCE}
        doc.update(model=model.__dict__, allgather_ms=args.allgather_ms, projection=source["path"], layouts=priced)
        (args.out / "layouts.json").write_text(json.dumps(doc, indent=1))
        (args.out / "layouts.md").write_text(text)


if __name__ == "__main__":
    main()

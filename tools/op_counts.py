"""Dispatched torch ops per generated token, lp `mode=ar` with eager steps against transformers'
eager greedy `generate`, on SmolLM2. Where a step's kernels are short (a small model on a GPU),
an eager decode is bound by the host, which issues every op one by one: this counts them.

A token's count is the difference between decodes of 24 and 16 new tokens, divided by 8, so the
prompt's prefill drops out (both decoders must make all their tokens: `generate` is held to them
with `min_new_tokens`, whose logits processor adds about 5 ops a token to its count). The count
depends on the device and the attention backend: on a CPU, lp's few-token matmuls
(lp/engine/kernels.py) and its CPU attention path (kv heads repeated) issue ops a GPU step does not.

    python -m tools.op_counts [--device cpu|cuda] [--dtype float32|bfloat16] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lp.config import DecodeConfig
from lp.frontend.runtime import LP

SHORT, LONG = 16, 24  # new tokens of the two decodes whose difference is counted


class _Counter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def per_token(decode: Callable[[int], None]) -> dict[str, float]:
    """Ops per generated token of `decode(new_tokens)`, by name (after a warm-up decode)."""
    decode(SHORT)
    counts = []
    for n in (SHORT, LONG):
        with _Counter() as c:
            decode(n)
        counts.append(c.ops)
    return {op: (counts[1][op] - counts[0][op]) / (LONG - SHORT) for op in counts[0] | counts[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", help="also write the counts here (json)")
    args = ap.parse_args()
    lm = LP("smollm2-135m", dtype=args.dtype, device=args.device, graphs=False, compile=False)
    prompt = lm.encode("Explain lookahead decoding in two sentences.", chat=True)
    ids = torch.tensor([prompt], device=lm.model.device)

    def transformers(n: int) -> None:
        with torch.inference_mode():
            lm.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    def lp_ar(n: int) -> None:
        if lm.decoder.generate(prompt, DecodeConfig(mode="ar", max_new_tokens=n)).new_tokens != n:
            raise SystemExit(
                f"lp: error: the prompt's decode ends before {n} tokens: the counts would not be per token"
            )

    counts = {"lp mode=ar": per_token(lp_ar), "transformers generate": per_token(transformers)}
    lp_ops, hf_ops = counts["lp mode=ar"], counts["transformers generate"]
    attention = lm.decoder.worker.attention
    print(
        f"dispatched ops per token, SmolLM2-135M {args.dtype} on {args.device} (lp attention={attention}), eager: "
        f"lp mode=ar {sum(lp_ops.values()):.0f}, transformers generate {sum(hf_ops.values()):.0f}"
    )
    for op in sorted(lp_ops | hf_ops, key=lambda op: hf_ops.get(op, 0) - lp_ops.get(op, 0)):
        if lp_ops.get(op, 0) != hf_ops.get(op, 0):
            print(f"  {op:32s} lp {lp_ops.get(op, 0):7.1f}   transformers {hf_ops.get(op, 0):7.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"device": args.device, "dtype": args.dtype, "lp_attention": attention, **counts},
                f,
                indent=1,
                sort_keys=True,
            )


if __name__ == "__main__":
    main()

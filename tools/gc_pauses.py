"""Python's garbage collector during decoding: how many collections of each generation run, and
how long they take, over a SmolLM2 decode of Spec-Bench prompts, with the collector paused by
`Decoder.generate` (lp's behaviour) and left on (its `_generate`, the loop alone). The loop alone
runs first, as a decode right after loading does: the objects the load made are still pending
for the collector's oldest generation.

    python -m tools.gc_pauses [prompts]
"""

from __future__ import annotations

import gc
import sys
import time

import torch

from lp.bench.datasets import load
from lp.config import DecodeConfig
from lp.frontend.runtime import LP


def main() -> None:
    prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.set_num_threads(2)
    lm = LP("smollm2-135m", device="cpu", graphs=False, compile=False)
    ids = [lm.encode(p.text, chat=True) for p in load("spec_bench", limit=prompts)]
    cfg = DecodeConfig(W=15, N=5, G=15, max_new_tokens=128)
    started: list[float] = []
    events: list[tuple[int, float]] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        else:
            events.append((info["generation"], time.perf_counter() - started.pop()))

    gc.callbacks.append(watch)
    for name, decode in (
        ("collector on (the loop alone)", lambda p: lm.decoder._generate(p, cfg, 0, None, None)),
        ("collector paused (lp)", lambda p: lm.decoder.generate(p, cfg)),
    ):
        events.clear()  # no collection first: the loop alone runs as right after loading
        steps = sum(decode(p).steps for p in ids)
        line = ", ".join(
            f"gen{g} {sum(1 for e in events if e[0] == g)} collections "
            f"{sum(e[1] for e in events if e[0] == g) * 1e3:.1f} ms "
            f"(longest {max((e[1] for e in events if e[0] == g), default=0) * 1e3:.1f} ms)"
            for g in range(3)
        )
        print(f"{name}: {len(ids)} prompts, {steps} steps: {line}")


if __name__ == "__main__":
    main()

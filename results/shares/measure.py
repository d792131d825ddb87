"""Shares of 1,024-token steps over 8 replicas: root subtrees whole against the tree cut in
pre-order and cut to 128-token buckets (lp/decode/shares.py), on real trees.

    python results/shares/measure.py [--decode]     (from the repository root)

With --decode (about 7 minutes on a 2-core CPU) SmolLM2-135M decodes Spec-Bench questions 91 and
201 (chat template, 32 new tokens) at W3N3G15-L1024-R16-D16-F16 on one replica and keeps every
step's tree in trees.json; then each step's tree is split over 8 replicas, each re-feeding the
tokens the last step committed: whole root subtrees (lp/partition.py `search`, what sampled steps
do), and cut in pre-order to the share cap (what greedy steps do). Writes shares.md."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from lp.decode.plan import Split, plan_step
from lp.decode.shares import fitted
from lp.lookahead.tree import DraftTree

HERE = Path(__file__).resolve().parent
CONFIG, PROMPTS, NEW, P, CAP = "W3N3G15-L1024-R16-D16-F16", ("91", "201"), 32, 8, 128


def decode() -> None:
    from lp import LP
    from lp.bench.datasets import load
    from lp.bench.shapes import parse_lookahead
    from lp.decode.loop import StepObserver

    class Trees(StepObserver):
        def __init__(self) -> None:
            self.steps, self._x0 = [], None

        def prefill_done(self) -> None:
            self._x0 = None

        def planned(self, step, position) -> None:
            m = 1 if self._x0 is None else position - self._x0
            self._x0 = position
            self.steps.append({"m": m, "tokens": step.tree.tokens.tolist(), "parents": list(step.tree.parents)})

    lm, watch = LP("smollm2-135m", device="cpu"), Trees()
    prompts = load("spec_bench")
    for i in PROMPTS:
        lm.generate(
            lm.encode(prompts[i].text, chat=True), observer=watch, max_new_tokens=NEW, **parse_lookahead(CONFIG)
        )
    (HERE / "trees.json").write_text(json.dumps(watch.steps))


def main() -> None:
    if "--decode" in sys.argv:
        decode()
    rows = []
    for s in json.loads((HERE / "trees.json").read_text()):
        tree, m = DraftTree(np.array(s["tokens"], np.int64), np.array(s["parents"], np.int64)), s["m"]
        if tree.size < 512:
            continue
        pending = np.zeros(m, np.int64)
        whole = max(plan_step(pending, None, tree, Split(3, 3, P, r)).layout.size for r in range(P))
        n = tree.size
        t, p, _, _ = fitted(Split(3, 3, P, 0, CAP), m, tree.tokens, tree.parent_array, tree.tokens, np.arange(n),
                            np.asarray(tree.groups(), np.int64))  # fmt: skip
        cut = DraftTree(t, p)
        plans = [plan_step(pending, None, cut, Split(3, 3, P, r, CAP)) for r in range(P)]
        rows.append((m, n, whole, cut.size, max(x.layout.size for x in plans), [x.dups for x in plans[1:]]))
    dups = [d for r in rows for d in r[5]]
    lines = [
        f"# Shares of {CONFIG} steps over {P} replicas, Spec-Bench questions {', '.join(PROMPTS)} "
        f"(SmolLM2-135M, {NEW} tokens)",
        "",
        f"Command: `python results/shares/measure.py --decode`. {len(rows)} steps of 512 tree nodes or more.",
        "",
        f"- root subtrees whole: the largest share {statistics.median(r[2] for r in rows):.0f} tokens (median), "
        f"{min(r[2] for r in rows)}-{max(r[2] for r in rows)}",
        f"- cut in pre-order to {CAP}-token shares: the largest share {max(r[4] for r in rows)} tokens at most; "
        f"nodes kept {min(r[3] / r[1] for r in rows):.1%}-{max(r[3] / r[1] for r in rows):.1%} of the tree "
        f"(median {statistics.median(r[3] / r[1] for r in rows):.1%}); ancestors fed again by ranks 1-7: "
        f"{min(dups)}-{max(dups)}, median {statistics.median(dups):.0f}, mean {statistics.mean(dups):.1f}",
        "",
        "| pending | tree nodes | largest share, whole subtrees | nodes kept, cut | largest share, cut | "
        "ancestors, ranks 1-7 |",
        "|---|---|---|---|---|---|",
        *(f"| {m} | {n} | {w} | {k} | {c} | {', '.join(map(str, d))} |" for m, n, w, k, c, d in rows),
    ]
    (HERE / "shares.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:7]))


if __name__ == "__main__":
    main()

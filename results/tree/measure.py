"""S per lookahead config (any lp.bench name, options included: W3N3G15-L128-R16) on the first
`per_group` Spec-Bench prompts of each category group, with each config's largest possible step
(pending + window + tree tokens, as the decode sizes its buffers) and the step tokens it fed.

    PYTHONPATH=. python results/tree/measure.py OUT CONFIGS [per_group=2] [max_new_tokens=64]

Writes OUT/<config>.json (every prompt's S, output ids and step tokens) and prints one JSON line
per config."""

import json
import sys
import time
from pathlib import Path

import torch

from lp import LP
from lp.bench.shapes import parse_lookahead
from lp.config import DecodeConfig
from lp.partition import RankPlan
from tools.exactness import GROUPS, pick_prompts

torch.set_num_threads(1)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
configs = sys.argv[2].split(",")
per = int(sys.argv[3]) if len(sys.argv) > 3 else 2
max_new = int(sys.argv[4]) if len(sys.argv) > 4 else 64
prompts = pick_prompts(per * len(GROUPS))
lm = LP("smollm2-135m")
for p in prompts:
    p["ids"] = lm.encode(p["text"], chat=True)
for name in configs:
    settings = parse_lookahead(name)
    c = DecodeConfig(**settings).validate()
    W, N, G, budget = c.step_shape
    bound = RankPlan(range(W), range(budget)).cost(N, pending=c.max_commit, candidate_tokens=1)
    rows, t0 = [], time.time()
    for p in prompts:
        r = lm.generate(p["ids"], max_new_tokens=max_new, **settings)
        rows.append(dict(q=p["question_id"], group=p["group"], S=r.compression, out=r.output_ids, st=r.step_tokens))
    steps = [t for r in rows for t in r["st"]]
    line = dict(
        config=name,
        S=round(sum(r["S"] for r in rows) / len(rows), 3),
        bound=bound,
        max_tokens=max(steps),
        mean_tokens=round(sum(steps) / len(steps), 1),
        secs=round(time.time() - t0),
        groups={
            g: round(sum(r["S"] for r in rows if r["group"] == g) / max(1, sum(r["group"] == g for r in rows)), 3)
            for g in GROUPS
        },
    )
    print(json.dumps(line), flush=True)
    (out / f"{name}.json").write_text(json.dumps(rows))

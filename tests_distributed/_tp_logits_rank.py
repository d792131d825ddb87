"""One rank of the sharded-forward check: the same prefill and lookahead step through the
whole model and through this rank's tensor-parallel shard (every rank one shard of one
replica); each rank writes the largest difference of their logits as JSON, and the matmul
formulations its shard's worker chose by timing: each rank's fake timer prefers another one,
and the group must choose alike (by their summed timings).

    python _tp_logits_rank.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

import torch

from lp import mesh
from lp.collective import Collective
from lp.engine.tp import ALONE, load_sharded
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def logits(worker: Worker, ids: torch.Tensor) -> torch.Tensor:
    layout = step_layout(2, 4, 3, range(4), 3)  # 2 pending tokens, a window of 4 x 2, 3 n-grams of 2
    kv = worker.sequence(20, layout.size)
    worker.prefill(kv, ids[:20].numpy())
    return worker.step(kv, layout, ids[20 : 20 + layout.size].numpy())  # any tokens: both see the same


def main() -> None:
    path, out = sys.argv[1], Path(sys.argv[2])
    torch.manual_seed(0)
    comm = Collective.from_env("cpu", timeout_s=60)
    _, group = mesh.split(comm, comm.world_size, 60)
    ids = torch.randint(0, 256, (64,))
    full = Worker(load_sharded(path, torch.float32, torch.device("cpu"), ALONE))
    part = Worker(load_sharded(path, torch.float32, torch.device("cpu"), group), tp=group)
    a, b = logits(full, ids), logits(part, ids)
    doc = {"rows": a.shape[0], "max_abs_diff": (a - b).abs().max().item(), "scale": a.abs().max().item()}
    doc["kv_heads"] = part.kv.k[0].shape[0]
    # rank 0 finds `wx` a little faster, rank 1 `linear` much faster: together, `linear`
    costs = ({"wx": 1.0}, {"linear": 0.1})[comm.rank % 2]
    os.environ["LP_CACHE"] = str(out / f"cache{comm.rank}")  # fake timings stay out of the machine's cache
    timed = Worker(part.model, tp=group, kernels="auto", kernel_timer=lambda name, M, run: costs.get(name, 3.0))
    doc["kernels"] = timed.kernels.table
    (out / f"rank{comm.rank}.json").write_text(json.dumps(doc))
    comm.close()


if __name__ == "__main__":
    main()

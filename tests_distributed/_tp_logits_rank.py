"""One rank of the sharded-forward check: the same prefill and lookahead step through the
whole model and through this rank's tensor-parallel shard (every rank one shard of one
replica); each rank writes the largest difference of their logits as JSON.

    python _tp_logits_rank.py MODEL_DIR OUT_DIR
"""

import json
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
    worker.reset(64, layout.size)
    worker.prefill(ids[:20])
    return worker.step(ids[20 : 20 + layout.size], layout, 21)  # any tokens: both see the same


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
    (out / f"rank{comm.rank}.json").write_text(json.dumps(doc))
    comm.close()


if __name__ == "__main__":
    main()

"""One rank of the LP sampling-distribution test: SAMPLES short samples of the peaked tiny
model through lp's decoder under Lookahead Parallelism; rank 0 writes them as JSON.

    python _sampling_rank.py OUT.json SAMPLES [wrong] [recycled] [tp]

`wrong` swaps in an acceptance rule that always accepts the drafts, which the test must catch;
`recycled` takes drafts from the successor table alone and samples 3 tokens (tests/test_sampling_decoder.py);
`tp` makes the ranks one tensor-parallel replica (tp = world size) of the model with 2 KV heads."""

import json
import sys

from helpers import RECYCLED, SAMPLING, follow_first_drafts, peaked_llama  # on the PYTHONPATH _launch.py sets

from lp import mesh
from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder
from lp.engine.tp import shard
from lp.verify.verifier import SamplingVerifier
from lp.worker import Worker


def accept_always(first_token, tree, p_nodes, u, max_commit):
    return follow_first_drafts(first_token, tree, p_nodes, max_commit)


def main() -> None:
    out, samples = sys.argv[1], int(sys.argv[2])
    wrong = "wrong" in sys.argv[3:]
    tp = "tp" in sys.argv[3:]
    model, prompt = peaked_llama(kv_heads=2 if tp else 1)
    comm = Collective.from_env("cpu", timeout_s=60)
    lp, group = mesh.split(comm, comm.world_size if tp else 1, 60)
    dec = Decoder(Worker(shard(model, group), tp=group), lp, set(), 128)
    cfg = DecodeConfig(**{**SAMPLING, **(RECYCLED if "recycled" in sys.argv[3:] else {})})
    rows, multi = [], 0
    for i in range(samples):
        verifier = (
            SamplingVerifier(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, i, accept_always) if wrong else None
        )
        g = dec.generate(prompt, cfg, stream=i, verifier=verifier)
        rows.append(g.output_ids)
        multi += max(g.accepted_per_step) > 1
    if comm.is_main:
        with open(out, "w") as f:
            json.dump({"samples": rows, "multi": multi / samples, "world_size": comm.world_size}, f)
    comm.close()


if __name__ == "__main__":
    main()

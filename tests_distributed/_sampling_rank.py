"""One rank of the LP sampling-distribution test: SAMPLES short samples of the peaked tiny
model through lp's decoder under Lookahead Parallelism; rank 0 writes them as JSON.

    python _sampling_rank.py OUT.json SAMPLES [wrong]

`wrong` swaps in an acceptance rule that always accepts the drafts, which the test must catch."""
import json
import sys


import lp.decoder
from lp.collective import Collective
from lp.config import DecodeConfig
from lp.testing import follow_first_drafts, peaked_llama
from lp.worker import Worker

SETTINGS = dict(W=3, N=3, G=3, max_new_tokens=2, temperature=0.9, top_k=6)


def accept_always(first_token, tree, p_nodes, u, width):
    return follow_first_drafts(first_token, tree, p_nodes, width)


def main() -> None:
    out, samples = sys.argv[1], int(sys.argv[2])
    if sys.argv[3:] == ["wrong"]:
        lp.decoder.sample_continue = accept_always
    model, prompt = peaked_llama()
    comm = Collective.from_env("cpu", timeout_s=60)
    dec = lp.decoder.Decoder(Worker(model), comm, set(), 128)
    cfg = DecodeConfig(**SETTINGS)
    rows, multi = [], 0
    for i in range(samples):
        g = dec.generate(prompt, cfg, stream=i)
        rows.append(g.output_ids)
        multi += g.accepted[0] > 1
    if comm.is_main:
        with open(out, "w") as f:
            json.dump({"samples": rows, "multi": multi / samples, "world_size": comm.world_size}, f)
    comm.close()


if __name__ == "__main__":
    main()

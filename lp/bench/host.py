"""`python -m lp.bench.host`: the host work of a decode step, measured without the model's cost.

The host work is everything a rank does between two forwards: acceptance of the last step and
its message (device ops queued after the forward), then, once the gathered messages are read,
the merge, the window, pool and successor-table updates, and the next step's drafts, tree,
partition, layout, id gather and upload. The tool runs lp's own decode loop (lp/decoder.py) as
rank 0 of P ranks on a one-layer random model and reports, per step, the median and p95 of
  * all of it (the gap between forwards, less the stand-in all-gather below): what a step costs
    on a synchronous device such as this CPU, on top of its forward;
  * the part after the message read: what an asynchronous device (a GPU) waits for, since the
    ops queued after its forward run while it computes.

The other ranks are stood in for by `_Ranks`: the all-gather returns rank 0's message for every
rank (their window tokens made valid, their candidates withdrawn), so rank 0 merges P messages
and updates a P-rank window without P processes competing for this machine's cores. The
all-gather itself is measured apart, between P real gloo processes (`allgather=true`).

    python -m lp.bench.host W=60 N=5 G=60 P=8
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decoder import Decoder, StepObserver
from lp.errors import LPError
from lp.message import HEADER, message_size, step_message_size
from lp.worker import Worker


class _Spans(StepObserver):
    """Records when each forward starts and ends, and when each step's messages are read."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.reads: list[float] = []

    def forward_start(self) -> None:
        self.starts.append(time.perf_counter())

    def forward_done(self) -> None:
        self.ends.append(time.perf_counter())

    def message_read(self) -> None:
        self.reads.append(time.perf_counter())


class _Ranks(Collective):
    """Rank 0 of P, with every other rank's message a copy of rank 0's (see the module doc).
    `successors`: where the messages' successor rows start (they are copied as they are)."""

    def __init__(self, world_size: int, successors: int) -> None:
        super().__init__(0, world_size)
        self.successors = successors
        self.seconds: list[float] = []  # each call's own cost, not host work of lp's

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        others = message.clone()
        others[:self.successors].clamp_(min=0)  # valid token ids in their window slots
        if message.numel() > HEADER:
            others[1] = -1  # no candidate: only rank 0's acceptance counts
        out = torch.cat([message[None], others[None].expand(self.world_size - 1, -1)])
        self.seconds.append(time.perf_counter() - t0)
        return out


def _model(vocab: int, context: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=vocab, max_position_embeddings=context)
    return LlamaForCausalLM(config).eval()


@dataclass(frozen=True)
class HostTimes:
    """Seconds of host work per step (between consecutive forwards): `total`, and `exposed`,
    the part after the step's messages were read; `step_tokens`: rank 0's forward sizes."""

    total: list[float]
    exposed: list[float]
    step_tokens: list[int]


def host_gaps(cfg: DecodeConfig, P: int, vocab: int = 512, prompt_len: int = 400) -> HostTimes:
    """The host work of one `max_new_tokens` decode by rank 0 of P on a random model and a
    repetitive random prompt."""
    rng = np.random.default_rng(0)
    prompt = np.tile(rng.integers(3, vocab, 40), prompt_len // 40).tolist()
    worker = Worker(_model(vocab, prompt_len + cfg.max_new_tokens + 16), graphs=False)
    watch = _Spans()
    ranks = _Ranks(P, message_size(cfg.step_shape[0], cfg.step_width))  # the successor rows follow
    g = Decoder(worker, ranks, set(), prompt_len + cfg.max_new_tokens).generate(prompt, cfg, observer=watch)
    steps = zip(watch.ends, watch.reads, ranks.seconds[1:], watch.starts[1:])  # [0]: the handshake
    total, exposed = zip(*[(start - end - gather, start - read) for end, read, gather, start in steps])
    return HostTimes(list(total), list(exposed), g.step_tokens)


def _gather_rank(rank: int, world: int, port: int, size: int, reps: int, out: "torch.multiprocessing.Queue") -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    comm = Collective(rank, world)
    msg = torch.zeros(size, dtype=torch.long)
    times = []
    for _ in range(reps + 10):
        t0 = time.perf_counter()
        comm.all_gather(msg)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(times[10:])
    dist.destroy_process_group()


def allgather_seconds(P: int, size: int, reps: int = 500) -> list[float]:
    """Durations of `reps` all-gathers of `size` int64 between P gloo processes (rank 0's view)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_gather_rank, args=(r, P, port, size, reps, out)) for r in range(P)]
    for p in procs:
        p.start()
    times = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    return times


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs) * 1e3, float(np.percentile(xs, 95)) * 1e3


DEFAULTS = {"W": 60, "N": 5, "G": 60, "P": 8, "recycle": 8, "tokens": 200, "threads": 1, "allgather": 1}
HELP = {"W": "lookahead columns", "N": "n-gram size", "G": "verification n-grams", "P": "ranks",
        "recycle": "successors kept per token for recycled drafts (0: none)",
        "tokens": "new tokens decoded (one gap per step)", "threads": "torch threads",
        "allgather": "1: also time a gloo all-gather between P processes"}


def main(argv: list[str] | None = None) -> None:
    epilog = "keys:\n" + "\n".join(f"  {k}={v:<6} {HELP[k]}" for k, v in DEFAULTS.items())
    ap = argparse.ArgumentParser(prog="python -m lp.bench.host", description=__doc__.splitlines()[0],
                                 epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("settings", nargs="*", metavar="key=value")
    s = dict(DEFAULTS)
    for item in ap.parse_args(argv).settings:
        key, eq, value = item.partition("=")
        if not eq or key not in DEFAULTS or not value.lstrip("-").isdigit():
            sys.exit(f"lp: error: expected key=INT with a key among {', '.join(DEFAULTS)}, got {item!r}")
        s[key] = int(value)
    torch.set_num_threads(s["threads"])
    try:
        cfg = DecodeConfig(W=s["W"], N=s["N"], G=s["G"], recycle=s["recycle"], max_new_tokens=s["tokens"]).validate()
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    times = host_gaps(cfg, s["P"])
    (med, p95), (after_med, after_p95) = _ms(times.total), _ms(times.exposed)
    print(f"host work per step, rank 0 of P={s['P']} at W={cfg.W} N={cfg.N} G={cfg.G} recycle={cfg.recycle} "
          f"({len(times.total)} steps, {statistics.mean(times.step_tokens):.0f} tokens per rank-0 forward on "
          f"average), {_cpu_name()}: median {med:.3f} ms, p95 {p95:.3f} ms; after the message read "
          f"(what a GPU waits for): median {after_med:.3f} ms, p95 {after_p95:.3f} ms")
    if s["allgather"] and s["P"] > 1:
        size = step_message_size(cfg)
        med, p95 = _ms(allgather_seconds(s["P"], size))
        print(f"all-gather of {size} int64 between {s['P']} gloo processes on this machine: "
              f"median {med:.3f} ms, p95 {p95:.3f} ms")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]} ({os.cpu_count()} cores)" if names else "CPU"
    except OSError:
        return "CPU"


if __name__ == "__main__":
    main()

"""`python -m tools.host`: the host work of a decode step, measured on a real decode.

The host work is everything a rank does between two forwards: acceptance of the last step and
its message (device ops queued after the forward), then, once the gathered messages are read,
the merge, the window, pool and successor-table updates, and the next step's drafts, tree,
partition, layout, id gather and upload. The tool
  1. records a decode by P gloo processes on this machine: `prompts` Spec-Bench prompts on
     `model` (default SmolLM2-135M; `random`: a one-layer random model on a repetitive random
     prompt, seconds instead of minutes), rank 0 keeping every all-gather's result (every rank
     gathers the same);
  2. replays each rank alone, one after another: lp's own decode loop (lp/decode/loop.py), its
     all-gathers answered from the recording, its forwards stood in for by a worker that
     computes nothing. Window, pool, successor table, trees and plans are rebuilt from the
     recorded messages exactly as the real rank built them, so the host work is the real
     decode's, while no real forward evicts the host's caches between steps (a GPU's would not)
     and no other rank competes for this machine's cores. As a GPU's host does, each step's
     plan is rehearsed before the read (`rehearse=1`, lp/decode/plan.py `rehearse`): its cost
     counts in all of the host's work, not in the part after the read.
It reports the median and p95 over steps, for the slowest rank of each step (the all-gather
waits for it) and for rank 0 (each rank's step its fastest of `replays` replays, leaving out
what other processes on a shared machine add to some), of
  * all of it (the gap between forwards, less the replayed all-gather): the host's whole share
    of a step, the dispatch of the acceptance ops included (they compute nothing here);
  * the part after the message read: what an asynchronous device (a GPU) waits for, since the
    ops queued after its forward run while it computes; and, timed apart, the piece of it that a
    GPU does and this replay does not: the step's arrays padded to its fixed-shape bucket.
The all-gather itself is timed apart, between P gloo processes (`allgather=1`). With
`ab=DIR`, it compares the lp of another checkout with this one on a kept recording (`ab`).

    python -m tools.host W=60 N=5 G=60 P=8
    python -m tools.host W=60 N=5 G=60 P=8 recording=FILE ab=../base rounds=8 replays=1
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder, StepObserver
from lp.engine.attention import FLEX_BLOCK
from lp.engine.kernel_choice import cpu_name
from lp.engine.packed import PackedStep, PackedTensors, bucket, exact, flex_blocks, padded
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.message import HEADER, step_message_size
from lp.partition import partition
from lp.worker import Worker

CPU = torch.device("cpu")
RANDOM_VOCAB, RANDOM_PROMPT = 512, 400  # model=random: its vocabulary and its prompt's length


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


class _Recorder(Collective):
    """A rank's collective that keeps every all-gather's result."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[np.ndarray] = []

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        out = super().all_gather(message)
        self.kept.append(out.numpy().copy())
        return out


class _Replay(Collective):
    """Rank `rank` of P whose all-gather answers the recorded results in order (every rank
    gathered the same). The rank's own message must match its recorded one wherever the host's
    state decides it: the handshake (its prompt and world size), then each step's output length
    and checksum, which of its window slots hold a column (`W` slots after the `width` path
    tokens) and the input token of each of its logits rows (rows of `k` successors; none when k
    is 0). So a replay that drifted from the recording, building other trees or plans than the
    recorded rank did, stops."""

    def __init__(self, world_size: int, kept: list[np.ndarray], W: int, max_commit: int, k: int, rank: int = 0) -> None:
        super().__init__(rank, world_size)
        self.kept = iter(kept)
        self.W, self.max_commit, self.k = W, max_commit, k
        self.seconds: list[float] = []  # each call's own cost, not host work of lp's

    def _planned(self, message: np.ndarray) -> list[int]:
        """The parts of a message that the host's state decides (the model's outputs left out)."""
        if len(message) < HEADER:  # the handshake: the prompt's fingerprint and the world size
            # (not the config's: it changes with every new DecodeConfig key, and `replay` checks
            # the recording's settings apart)
            return message[1:].tolist()
        columns = HEADER + self.max_commit
        rows = message[columns + self.W :].reshape(-1, 1 + self.k)[:, 0] if self.k else message[:0]
        return [*message[3:5].tolist(), *(message[columns : columns + self.W] >= 0).tolist(), *rows.tolist()]

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        gathered = next(self.kept, None)
        mine = message.numpy()
        if (
            gathered is None
            or gathered.shape[1] != len(mine)
            or self._planned(mine) != self._planned(gathered[self.rank])
        ):
            raise LPError(
                "the replay drifted from the recorded decode: this lp builds other steps than the recorded one did"
            )
        # into fresh memory, as a real all-gather writes its result (gloo's copies, or the driver's
        # staged copy to the host) just before the read: the read finds it in the cache, not the recording's
        # long-untouched arrays
        out = torch.from_numpy(gathered.copy())
        self.seconds.append(time.perf_counter() - t0)
        return out


def _model(vocab: int, context: int) -> torch.nn.Module:
    """A one-layer Llama with random weights (seeded: every rank builds the same one)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=vocab,
        max_position_embeddings=context,
    )
    return LlamaForCausalLM(config).eval()


class _NoForward(Worker):
    """The replay's worker: lp's page bookkeeping and step arrays, but a step computes nothing,
    its logits zeros over `columns` tokens (the recording replaces the replayed rank's results),
    so no vocabulary-wide tensor passes through this host's caches, as on a GPU."""

    def __init__(self, model: torch.nn.Module, columns: int) -> None:
        super().__init__(model, graphs=False)
        self.columns = columns
        self.packing: list[float] = []  # each step's arrays padded as a GPU's (`HostTimes.packing`)

    def run(self, step: PackedStep) -> tuple[torch.Tensor, PackedTensors]:
        # a GPU's fixed-shape step pads its arrays to the bucket and lists its pages: timed here,
        # apart from the host work between forwards
        t = time.perf_counter()
        B = bucket(max(step.tokens, len(step.rows)))
        padded(step, B)
        flex_blocks(step, B, self.kv.slots // FLEX_BLOCK)
        if len(step.rows):  # a decode step's (a prefill's returns no logits)
            self.packing.append(time.perf_counter() - t)
        on = exact(step, self.kv.pool.owner, self.kv.pool.index, 0)
        return torch.zeros(len(step.rows), self.columns), on


def _settings(cfg: DecodeConfig) -> dict[str, int]:
    """The settings this tool decodes with (the handshake checks every other one)."""
    return {"W": cfg.W, "N": cfg.N, "G": cfg.G, "successors": cfg.successors_sent, "tokens": cfg.max_new_tokens}


def _random_prompt() -> list[int]:
    """model=random's prompt: a random 40-token phrase, repeated (the pool and the text find
    drafts in it)."""
    rng = np.random.default_rng(0)
    return np.tile(rng.integers(3, RANDOM_VOCAB, 40), RANDOM_PROMPT // 40).tolist()


@dataclass(frozen=True)
class Recording:
    """A decode by P ranks of `model` with `settings` (`_settings`): its prompts, the model's
    vocabulary and end-of-sequence ids, and every all-gather result that rank 0 read (`[P, K]`
    each, the handshakes included)."""

    model: str
    settings: dict[str, int]
    world_size: int
    prompts: list[list[int]]
    vocab: int
    eos_ids: set[int]
    gathered: list[np.ndarray]


@dataclass(frozen=True)
class HostTimes:
    """Seconds of host work per step (between consecutive forwards): `total`, and `exposed`,
    the part after the step's messages were read; `step_tokens`: the forward sizes; `packing`:
    the step's per-token arrays padded to its bucket and its key blocks listed, as a GPU's fixed-shape
    steps take them (lp/engine/packed.py `padded`, `flex_blocks`), timed apart on this CPU, without
    the pinned copies and the uploads: host work after the read that the CPU replay does not do."""

    total: list[float]
    exposed: list[float]
    step_tokens: list[int]
    packing: list[float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(kind: type[Collective], rank: int, world: int, port: int, timeout_s: float) -> Collective:
    """This process as rank `rank` of `world` gloo ranks on this machine (the collective
    `Collective.from_env` makes, as under torchrun)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    return kind.from_env("cpu", timeout_s, "gloo")


def _spawn(target, P: int, *args) -> list:
    """P started processes running `target(rank, P, port, *args)`, meeting on a free local port
    (stopped again if one fails to start)."""
    import torch.multiprocessing as mp

    ctx, port = mp.get_context("spawn"), _free_port()
    procs = [ctx.Process(target=target, args=(r, P, port, *args)) for r in range(P)]
    try:
        for p in procs:
            p.start()
    except BaseException:
        _stop(procs)
        raise
    return procs


def _record_rank(rank: int, world: int, port: int, cfg: DecodeConfig, model: str, prompts: int, path: str) -> None:
    """One rank of the recording: decode the prompts; rank 0 saves what it gathered."""
    torch.set_num_threads(1)  # P processes share this machine's cores
    comm = _join(_Recorder, rank, world, port, 900)
    if model == "random":
        ids = [_random_prompt()]
        net, eos = _model(RANDOM_VOCAB, RANDOM_PROMPT + cfg.max_new_tokens + 16), set()
    else:
        from lp.bench.datasets import load
        from lp.frontend.runtime import LP

        lm = LP(model, device="cpu", graphs=False, compile=False, tp=1, draft_memory=0)  # its own collective: unused
        ids = [
            lm.encode(p.text, chat=p.chat and lm.tokenizer.chat_template is not None)
            for p in load("spec_bench", limit=prompts)
        ]
        net, eos = lm.model, set(lm.decoder.eos_ids)
    worker = Worker(net, graphs=False)
    decoder = Decoder(worker, comm, eos, worker.max_seq_len)
    for i, prompt in enumerate(ids):
        decoder.generate(prompt, cfg)
        if rank == 0:
            print(f"tools.host: recorded prompt {i + 1}/{len(ids)} on {world} ranks", file=sys.stderr, flush=True)
    if rank == 0:
        np.savez_compressed(
            path,
            model=model,
            settings=json.dumps(_settings(cfg)),
            vocab=worker.vocab_size,
            eos=np.asarray(sorted(eos), dtype=np.int64),
            lengths=np.asarray([len(p) for p in ids]),
            tokens=np.concatenate([np.asarray(p) for p in ids]),
            gathered=np.asarray(len(comm.kept)),
            **{f"g{i}": g for i, g in enumerate(comm.kept)},
        )
    comm.close()


def record(
    cfg: DecodeConfig, P: int, model: str = "smollm2-135m", prompts: int = 4, path: str | None = None
) -> Recording:
    """Decode with P gloo processes on this machine: the first `prompts` Spec-Bench prompts
    (one per category first) on `model`, or (`model="random"`) one repetitive random prompt on a
    one-layer random model. `path`: also keep the recording there (.npz), to replay later."""
    from multiprocessing.connection import wait

    if path and not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        raise LPError(f"cannot write a recording to {path}: its folder is missing or read-only")
    with tempfile.TemporaryDirectory() as tmp:
        out = _npz(path) if path else os.path.join(tmp, "recording.npz")
        procs = _spawn(_record_rank, P, cfg, model, prompts, out)
        try:
            running = {p.sentinel: p for p in procs}
            while running:  # a rank that fails ends the others at once, not at the gloo timeout
                for sentinel in wait(list(running)):
                    if running.pop(sentinel).exitcode:
                        _stop(procs)
                        raise LPError(f"recording the decode failed: rank exit codes {[p.exitcode for p in procs]}")
        finally:
            _stop(procs)
        return load_recording(out)


def _stop(procs: list) -> None:
    """Kill the processes still running (an error, or Ctrl-C, in this one) and reap them all."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:
            p.join()


def _npz(path: str) -> str:
    return path if path.endswith(".npz") else path + ".npz"  # as numpy.savez_compressed names it


def load_recording(path: str) -> Recording:
    """A recording that `record` kept at `path`."""
    try:
        with np.load(_npz(path)) as f:
            tokens = np.split(f["tokens"], np.cumsum(f["lengths"])[:-1])
            gathered = [f[f"g{i}"] for i in range(int(f["gathered"]))]
            return Recording(
                str(f["model"]),
                json.loads(str(f["settings"])),
                gathered[0].shape[0],
                [t.tolist() for t in tokens],
                int(f["vocab"]),
                set(f["eos"].tolist()),
                gathered,
            )
    except (OSError, KeyError, ValueError, IndexError) as e:
        raise LPError(f"cannot read a recording from {path}: {e}") from None


def replay(cfg: DecodeConfig, rec: Recording, rank: int = 0, rehearse: bool = True) -> HostTimes:
    """Rank `rank`'s host work in the recorded decode: lp's decode loop, its all-gathers
    answered from the recording, its forwards stood in for by `_NoForward`, each step's plan
    rehearsed before the read as on a GPU (`rehearse`)."""
    if not 0 <= rank < rec.world_size:
        raise LPError(f"rank {rank} is not one of the recording's {rec.world_size}")
    context = max(map(len, rec.prompts)) + cfg.max_new_tokens + 16
    for cache in (partition, step_layout):  # cold, as in a fresh process: a replay
        cache.cache_clear()  # after a replay would find every shape cached
    if rec.settings != _settings(cfg):
        raise LPError(f"the recording is of {rec.settings}, not {_settings(cfg)}")
    worker = _NoForward(_model(rec.vocab, context), max(2, cfg.successors_sent + 1))
    ranks = _Replay(rec.world_size, rec.gathered, cfg.W, cfg.max_commit, cfg.successors_sent, rank)
    decoder = Decoder(worker, ranks, rec.eos_ids, context)
    decoder.rehearse = rehearse  # set, not passed: an `ab=` base's lp may predate rehearsals
    times = HostTimes([], [], [], [])
    for prompt in rec.prompts:
        watch = _Spans()
        calls = len(ranks.seconds)
        g = decoder.generate(prompt, cfg, observer=watch)
        gathers = ranks.seconds[calls + 1 :]  # after the handshake: one per step
        for end, read, gather, start in zip(watch.ends, watch.reads, gathers, watch.starts[1:]):
            times.total.append(start - end - gather)
            times.exposed.append(start - read)
        times.step_tokens.extend(g.fed_per_step)
    if next(ranks.kept, None) is not None:
        raise LPError("the replay ended before the recorded decode did")
    times.packing.extend(worker.packing)  # one a forward, as step_tokens
    return times


def _each_step(runs: list[HostTimes], pick) -> HostTimes:
    """`pick` (min or max) of each step's figures over several runs of one decode."""
    return HostTimes(
        *(
            [pick(t) for t in zip(*(getattr(r, f) for r in runs))]
            for f in ("total", "exposed", "step_tokens", "packing")
        )
    )


def fastest(runs: list[HostTimes]) -> HostTimes:
    """Each step's least host work over several replays of one decode: the cost of the work
    itself, less what other processes on a shared machine added to some runs."""
    return _each_step(runs, min)


def slowest(ranks: list[HostTimes]) -> HostTimes:
    """Each step's most host work over the ranks (and largest forward): the all-gather waits for
    the last rank, so, with forwards of about one duration, the step waits for the slowest host."""
    return _each_step(ranks, max)


def _gather_rank(rank: int, world: int, port: int, size: int, reps: int, out: torch.multiprocessing.Queue) -> None:
    comm = _join(Collective, rank, world, port, 60)
    msg = torch.zeros(size, dtype=torch.long)
    times = []
    for _ in range(reps + 10):
        t0 = time.perf_counter()
        comm.all_gather(msg)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(times[10:])
    comm.close()


def allgather_seconds(P: int, size: int, reps: int = 500) -> list[float]:
    """Durations of `reps` all-gathers of `size` int64 between P gloo processes (rank 0's view)."""
    import torch.multiprocessing as mp

    out = mp.get_context("spawn").Queue()
    procs = _spawn(_gather_rank, P, size, reps, out)
    try:
        return out.get(timeout=120)
    except queue.Empty:
        raise LPError(f"timing the all-gather between {P} gloo processes took over 120 s") from None
    finally:
        _stop(procs)


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs) * 1e3, float(np.percentile(xs, 95)) * 1e3


DEFAULTS: dict[str, int | str] = {
    "W": 60,
    "N": 5,
    "G": 60,
    "P": 8,
    "successors": 8,
    "model": "smollm2-135m",
    "prompts": 4,
    "tokens": 128,
    "replays": 5,
    "threads": 1,
    "allgather": 1,
    "recording": "",
    "dump": "",
    "ab": "",
    "ab_recording": "",
    "rounds": 8,
    "rehearse": 1,
}
HELP = {
    "W": "lookahead columns",
    "N": "n-gram size",
    "G": "verification n-grams",
    "P": "ranks",
    "successors": "successors kept per token for recycled drafts (0: none)",
    "model": "the recorded decode's model (random: a one-layer random model)",
    "prompts": "Spec-Bench prompts decoded (model=random: one random prompt)",
    "tokens": "new tokens per prompt",
    "replays": "replays of the decode per rank: each step's fastest counts",
    "threads": "torch threads of the replay",
    "allgather": "1: also time a gloo all-gather between P processes",
    "recording": "a .npz file: replay it if it exists, else record into it (A/B of two lp versions)",
    "dump": "a .npy file: also keep every replay's times after the read, [rank, replay, step]",
    "ab": "another checkout of lp: replay `recording` with its lp and with this one, alternating (ab_report)",
    "ab_recording": "with ab: the base's own recording of the same decodes, where the two versions build other trees",
    "rounds": "with ab: runs of each version",
    "rehearse": "1: rehearse each step's plan before the read, as a GPU's host does (lp/decode/plan.py `rehearse`)",
}


def main(argv: list[str] | None = None) -> None:
    epilog = "keys:\n" + "\n".join(f"  {f'{k}={v}':<20} {HELP[k]}" for k, v in DEFAULTS.items())
    ap = argparse.ArgumentParser(
        prog="python -m tools.host",
        description=__doc__.splitlines()[0],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("settings", nargs="*", metavar="key=value")
    s = dict(DEFAULTS)
    given = set()
    for item in ap.parse_args(argv).settings:
        key, eq, value = item.partition("=")
        text = isinstance(DEFAULTS.get(key), str)
        if not eq or key not in DEFAULTS or not (text or value.lstrip("-").isdigit()):
            sys.exit(
                f"lp: error: expected key=INT (model=NAME, recording=FILE) with a key among "
                f"{', '.join(DEFAULTS)}, got {item!r}"
            )
        s[key] = value if text else int(value)
        given.add(key)
    torch.set_num_threads(s["threads"])
    # a plain `kill` ends this process through its cleanup, which stops the ranks it started
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit("lp: error: terminated"))
    try:
        _run(s, given)
    finally:
        signal.signal(signal.SIGTERM, before)


def _run(s: dict[str, int | str], given: set[str]) -> None:
    """The tool, given its settings `s` (those on the command line: `given`)."""
    if s["ab"]:
        return ab(s, given)
    try:
        cfg = DecodeConfig(
            W=s["W"], N=s["N"], G=s["G"], successors=s["successors"], max_new_tokens=s["tokens"]
        ).validate()
        if min(s["P"], s["prompts"], s["replays"]) < 1:
            raise LPError(
                f"P, prompts and replays must be >= 1, got P={s['P']} prompts={s['prompts']} replays={s['replays']}"
            )
        file = s["recording"]
        if file and os.path.exists(_npz(file)):
            rec = load_recording(file)
            if rec.world_size != s["P"]:
                raise LPError(f"{file} records {rec.world_size} ranks, not P={s['P']}")
            if given & {"model", "prompts"}:
                print(
                    f"tools.host: replaying {file}: its model ({rec.model}) and prompts "
                    f"({len(rec.prompts)}) are the recording's",
                    file=sys.stderr,
                )
        else:
            rec = record(cfg, s["P"], s["model"], s["prompts"], file or None)
        rehearse = bool(s["rehearse"])
        runs = [[replay(cfg, rec, rank, rehearse) for _ in range(s["replays"])] for rank in range(rec.world_size)]
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    if s["dump"]:
        np.save(s["dump"], np.array([[r.exposed for r in rank] for rank in runs]))
    ranks = [fastest(r) for r in runs]
    print(
        f"host work per step at W={cfg.W} N={cfg.N} G={cfg.G} successors={cfg.successors_sent}, P={rec.world_size}, "
        f"replaying a {rec.model} decode of {len(rec.prompts)} prompt(s) ({len(ranks[0].total)} steps; each "
        f"rank replayed alone, each step its fastest of {s['replays']} replays; each step's plan "
        f"{'rehearsed' if s['rehearse'] else 'not rehearsed'} before the read), {cpu_name()} ({os.cpu_count()} cores):"
    )
    # each figure's slowest rank, step by step (all of it and after the read may be two ranks)
    for name, times, tokens in (
        ("the slowest rank of each step", slowest(ranks), "largest forward"),
        ("rank 0", ranks[0], "forward"),
    ):
        (med, p95), (after_med, after_p95) = _ms(times.total), _ms(times.exposed)
        print(
            f"  {name}: median {med:.3f} ms, p95 {p95:.3f} ms; after the message read (what a GPU waits "
            f"for): median {after_med:.3f} ms, p95 {after_p95:.3f} ms "
            f"({statistics.mean(times.step_tokens):.0f} tokens per {tokens} on average)"
        )
    med, p95 = _ms(slowest(ranks).packing)
    print(
        f"  on a GPU (fixed-shape steps), also after the read: the step's arrays padded to its bucket and "
        f"its key blocks listed, slowest rank, timed apart: median {med:.3f} ms, p95 {p95:.3f} ms (the pinned "
        f"copies and uploads not counted)"
    )
    print("  after the read, median per rank: " + ", ".join(f"{_ms(t.exposed)[0]:.3f}" for t in ranks) + " ms")
    # replay i of every rank, then each step's slowest rank: noise and lp's own pauses stay in
    pooled = [t for i in range(s["replays"]) for t in slowest([r[i] for r in runs]).exposed]
    print(
        f"  the slowest rank of each step in all {s['replays']} replays pooled (lp's own pauses and this "
        f"machine's noise included): after the message read median {_ms(pooled)[0]:.3f} ms, "
        f"p95 {_ms(pooled)[1]:.3f} ms"
    )
    if s["allgather"] and s["P"] > 1:
        size = step_message_size(cfg)
        med, p95 = _ms(allgather_seconds(s["P"], size))
        print(
            f"all-gather of {size} int64 between {s['P']} gloo processes on this machine: "
            f"median {med:.3f} ms, p95 {p95:.3f} ms"
        )


def ab(s: dict[str, int | str], given: set[str]) -> None:
    """`ab=DIR`: the recording's host work by the lp of checkout DIR ("base") and by this one
    ("this"), `rounds` runs of each, alternating (base first in odd rounds, this first in even
    ones), each a process of this tool importing its version's lp (its `replays` per rank kept
    with `dump`), then `ab_report`. On a machine whose speed swings between runs, every step's
    least time over all of a version's runs is what its code costs: both versions get the fast
    spells, in turn. Only the time after the message read is compared: work that a change moves
    before the read (while a device computes) is not counted. A change that builds other trees
    cannot replay the other version's recording: with `ab_recording`, the base replays its own
    recording of the same decodes."""
    file, base = str(s["recording"]), os.path.abspath(str(s["ab"]))
    base_file = str(s["ab_recording"]) or file
    for f in (file, base_file):
        if not (f and os.path.exists(_npz(f))):
            sys.exit("lp: error: ab= replays recordings: give recording=FILE (and ab_recording=FILE) that exist")
    if not os.path.isfile(os.path.join(base, "lp", "__init__.py")):
        sys.exit(f"lp: error: ab={s['ab']} is not a checkout of lp (no lp/__init__.py)")
    if s["rounds"] < 1:
        sys.exit(f"lp: error: rounds must be >= 1, got {s['rounds']}")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    keys = set(DEFAULTS) - {"ab", "ab_recording", "rounds", "dump", "allgather", "recording", "model", "prompts"}
    common = [f"{k}={s[k]}" for k in sorted(keys)] + ["allgather=0"]
    dumps: dict[str, list[np.ndarray]] = {"base": [], "this": []}
    versions = (("base", base, base_file), ("this", here, file))
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(int(s["rounds"])):
            for name, root, recording in versions if i % 2 == 0 else versions[::-1]:
                out = os.path.join(tmp, f"{name}{i}.npy")
                args = [*common, f"recording={os.path.abspath(_npz(recording))}", f"dump={out}"]
                run = subprocess.run(  # this file, run as a script: its lp is the first on the path
                    [sys.executable, os.path.abspath(__file__), *args],
                    cwd=root,
                    env={**os.environ, "PYTHONPATH": root},
                    capture_output=True,
                    text=True,
                )
                if run.returncode:
                    last = (run.stderr.strip().splitlines() or ["no message"])[-1]
                    sys.exit(f"lp: error: the {name} run ({root}) failed: {last}")
                dumps[name].append(np.load(out))
                print(f"tools.host: round {i + 1}/{s['rounds']}: {name} done", file=sys.stderr, flush=True)
    names = (base, here) if base_file == file else (f"{base} on {base_file}", f"{here} on {file}")
    print(ab_report(dumps["base"], dumps["this"], *names))


def ab_report(base: list[np.ndarray], this: list[np.ndarray], base_name: str, this_name: str) -> str:
    """Two versions' host work after the message read from their runs' dumps (`[rank, replay,
    step]` seconds each): per version, each rank's least time for each step over all its runs'
    replays, then each step's slowest rank: median and p95 (ms), the ratio of the medians, and
    each run's own median (the same over that run's replays alone: how the machine's speed swung)."""

    def steps(runs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(runs, axis=1).min(axis=1).max(axis=0) * 1e3

    lines, medians = [], []
    for name, runs in ((base_name, base), (this_name, this)):
        worst = steps(runs)
        medians.append(float(np.median(worst)))
        own = " ".join(f"{np.median(steps([r])):.3f}" for r in runs)
        lines.append(
            f"  {name}: median {medians[-1]:.3f} ms, p95 {np.percentile(worst, 95):.3f} ms over {len(worst)} steps "
            f"({len(runs)} runs x {runs[0].shape[1]} replays per rank; each run's own median: {own} ms)"
        )
    head = "host work after the message read, slowest rank of each step, each step's least over all runs:"
    return "\n".join([head, *lines, f"  ratio (this / base): {medians[1] / medians[0]:.2f}"])


if __name__ == "__main__":
    main()

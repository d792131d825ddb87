"""Choosing the matmuls' formulation (lp/engine/kernels.py) by timing them here.

At load, every formulation that runs on this device is timed in whole forwards of the model (its
every matmul by that formulation, after a prefilled context, as a decode step runs) at the step
sizes a decode uses (`SIZES`: plain steps, the few-token steps of W=auto's small shapes, up to
128 tokens; larger steps and prefills take the 128-token choice), and the fastest runs each size;
between two timed sizes, the one whose times, interpolated, are the least. Whole forwards, not
each matmul alone: on a 2-core CPU, matmuls timed alone made `wx` the fastest at 32 rows by 7%,
yet a whole SmolLM2 forward of 32 tokens took 83 ms with it and 77 ms with `onednn` (and 72
against 60 ms at 17 tokens). The sizes and formulations take
turns, so a slow spell of a shared machine touches all of them, and each forward's fastest of
`REPS` passes is kept (other load only adds time). A formulation far behind after two passes
(one may meet a spike of other load) is not timed again at that size. From one size to the
next the choice changes only for a gain above `HYSTERESIS`, so timer noise does not make it
flip back and forth (a switch lands where the gap reaches it, past where the times cross).

The timings are cached per machine (`~/.cache/lp/kernels/`, keyed by the CPU's model, torch's
version and threads, the dtype and the matrices' shapes): a machine measures once per model
shape. Timings taken while other processes kept the CPU busy (`DISTURBED`) are used but not
cached. On CUDA `linear` is the only formulation and nothing is timed. Tensor-parallel ranks
time together (a forward all-reduces inside: all time, or all read their caches, and none drops a
formulation alone) and sum their timings (one all-reduce), so every rank of a group picks alike
and computes the replicated head's logits bit for bit alike.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from lp.engine.kernels import FORMULATIONS, Kernels, Matrix
from lp.errors import LPError
from lp.models import cache_dir

SIZES = (1, 2, 3, 4, 6, 8, 11, 16, 24, 32, 48, 64, 128)
REPS = 3
BEHIND = 1.5  # after two passes, a formulation this much slower than a size's fastest drops out there
HYSTERESIS = 0.05  # the next size keeps the last one's formulation unless another is this much faster
DISTURBED = 0.2  # cores other processes used on average while timing: above this, the timings are not cached
CHOICES = ("auto", *FORMULATIONS)

# timer(formulation, M, run) -> seconds that `run()` took (tests pass a fake one)
Timer = Callable[[str, int, Callable[[], object]], float]
# forward(formulation, M) -> a run of one whole forward of M tokens, every matmul by that formulation
Forwards = Callable[[str, int], Callable[[], object]]


def wall_clock(name: str, M: int, run: Callable[[], object]) -> float:
    """Seconds `run()` takes on the host's clock (CPU formulations: no device to wait for)."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    """The GPU's name, else the CPU's (`cpu_name`)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def requested(choice: str | None) -> str:
    """The `kernels` setting: as given, else `$LP_KERNELS`, else `auto`."""
    return choice if choice is not None else os.environ.get("LP_KERNELS", "auto")


def check_choice(choice: str) -> None:
    """Refuse a `kernels` setting that names no formulation."""
    if choice not in CHOICES:
        raise LPError(f"kernels must be one of {', '.join(CHOICES)}, got {choice!r}")


def measure(
    names: list[str], sizes: tuple[int, ...], forward: Forwards, timer: Timer, reps: int = REPS, drop: bool = True
) -> dict[int, dict[str, float]]:
    """The seconds of a whole forward at each size by each formulation, its fastest over `reps`
    passes; `drop`: a formulation far behind after two passes is not timed again at that size
    (ranks that time together must not drop one alone)."""
    least = {M: dict.fromkeys(names, math.inf) for M in sizes}
    with torch.inference_mode():
        for rep in range(reps):
            for M in sizes:
                fastest = min(least[M].values())
                for name in (n for n in names if not drop or rep < 2 or least[M][n] <= BEHIND * fastest):
                    least[M][name] = min(least[M][name], timer(name, M, forward(name, M)))
    return least


class OtherLoad:
    """The CPU time that other processes took since this was made, in cores on average (from
    `/proc/stat` and this process's own usage; 0 where there is no `/proc/stat`)."""

    def __init__(self) -> None:
        self.start = self._now()

    @staticmethod
    def _now() -> tuple[float, float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
            busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            busy = math.nan
        return time.perf_counter(), busy, own.ru_utime + own.ru_stime

    def cores(self) -> float:
        wall, busy, own = (b - a for a, b in zip(self.start, self._now()))
        return 0.0 if math.isnan(busy) or wall <= 0 else max(0.0, busy - own) / wall


def table(seconds: Mapping[int, Mapping[str, float]], how: str) -> Kernels:
    """The fastest formulation at each size from the first timed to the last (between two timed
    sizes, by their times interpolated; ties: the first named), keeping the last size's unless
    another is more than `HYSTERESIS` faster; runs of one formulation merged."""
    timed = sorted(seconds)
    names = list(seconds[timed[0]])
    grid = np.arange(timed[0], timed[-1] + 1)
    times = np.array([np.interp(grid, timed, [seconds[M][n] for M in timed]) for n in names])  # [name, size]
    pairs: list[tuple[int, int]] = []  # (the last size, the formulation's index)
    for j, M in enumerate(grid.tolist()):
        best = int(times[:, j].argmin())
        if pairs and times[pairs[-1][1], j] <= (1 + HYSTERESIS) * times[best, j]:
            best = pairs[-1][1]
        if pairs and pairs[-1][1] == best:
            pairs[-1] = (M, best)
        else:
            pairs.append((M, best))
    return Kernels(tuple((M, names[i]) for M, i in pairs), how)


def _key(matrices: Mapping[str, list[Matrix]], names: list[str], sizes: tuple[int, ...], context: int) -> dict:
    first = next(iter(matrices.values()))[0].weight
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": str(first.dtype),
        "shapes": {role: [list(mats[0].weight.shape), len(mats)] for role, mats in matrices.items()},
        "formulations": names,
        "sizes": list(sizes),
        "timed": f"whole forwards after {context} tokens",
    }


def _cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{digest}.json"


def _load(path: Path, key: dict) -> dict[int, dict[str, float]] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("key") != key:
        return None
    return {int(M): row for M, row in doc["seconds"].items()}


def _save(path: Path, key: dict, seconds: Mapping) -> None:
    """Written whole or not at all (ranks of one machine may write it at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "seconds": seconds}, indent=1))
    tmp.replace(path)


def choose(
    matrices: Mapping[str, list[Matrix]],
    device: torch.device,
    *,
    forward: Forwards,
    context: int = 0,
    choice: str = "auto",
    compiled: bool = False,
    sizes: tuple[int, ...] = SIZES,
    timer: Timer = wall_clock,
    cache: bool = True,
    agree: Callable[[torch.Tensor], torch.Tensor] | None = None,
    load: Callable[[], OtherLoad] = OtherLoad,
) -> Kernels:
    """The formulations of a forward over `matrices` (role -> its weight matrices) on `device`:
    `choice` names one for every size, or `auto` times every one that runs here (`compiled`:
    under torch.compile) in whole forwards (`forward`, each after `context` committed tokens) and
    takes the fastest at each size.
    `cache`: read and write the machine's cached timings. `agree`: a sum over the ranks that
    must choose alike (and time alike). `load`: starts the watch of other processes' load while
    timing (tests pass a quiet one)."""
    check_choice(choice)
    dtype = next(iter(matrices.values()))[0].weight.dtype
    if choice != "auto":
        if not FORMULATIONS[choice].available(device, dtype, compiled):
            raise LPError(f"kernels={choice} does not run here ({device.type}, {dtype}, compiled={compiled})")
        return Kernels.only(choice, "as set")
    names = [n for n in FORMULATIONS if FORMULATIONS[n].available(device, dtype, compiled)]
    if len(names) == 1:
        return Kernels.only(names[0], f"the one formulation on {device.type}")
    key = _key(matrices, names, sizes, context)
    path = _cache_file(key)
    seconds = _load(path, key) if cache else None
    if agree is not None:  # a forward all-reduces inside: every rank times, or none does
        missing = agree(torch.tensor([float(seconds is None)], dtype=torch.float64, device=device))
        seconds = None if missing.item() else seconds
    how = f"timed on {key['cpu']} once, cached in {path}"
    if seconds is None:
        t0, others = time.perf_counter(), load()
        seconds = measure(names, sizes, forward, timer, drop=agree is None)
        how = f"timed on {key['cpu']} in {time.perf_counter() - t0:.1f} s"
        busy = others.cores()
        if busy > DISTURBED:
            how += f" while other processes kept {busy:.1f} cores busy: not cached"
        elif cache:
            _save(path, key, seconds)
    if agree is not None:  # the same sums on every rank: the same choice
        flat = torch.tensor([seconds[M][n] for M in sizes for n in names], dtype=torch.float64)
        summed = iter(agree(flat.to(device)).cpu().tolist())
        seconds = {M: {n: next(summed) for n in names} for M in sizes}
    return table(seconds, how)


__all__ = [
    "CHOICES",
    "SIZES",
    "OtherLoad",
    "Forwards",
    "Timer",
    "check_choice",
    "choose",
    "cpu_name",
    "measure",
    "requested",
    "table",
    "wall_clock",
]

"""The per-rank program of the distributed tests (started by `_launch.py`, one per rank).

    python _worker.py SPEC.json         run the API tasks of SPEC, write out_dir/rank{R}.json
    python _worker.py --cli KEY=VAL...  run `python -m lp.generate KEY=VAL...` in this process
    python _worker.py --serve KEY=VAL...  run `python -m lp.serve KEY=VAL...` in this process

Before lp is imported, every torch.distributed collective / point-to-point entry point (and
every communication method of the ProcessGroup class) is wrapped with a counter, so a task can
report exactly which communication happened during its `generate`.

Fault injection (every mode), from the environment:
  LP_TEST_FAULT=die|hang  LP_TEST_FAULT_RANK=r  LP_TEST_FAULT_STEP=k  LP_TEST_FAULT_MARK=FILE
On rank r, the k-th call of `Worker.run` (a step's forward) first writes time.time() to FILE, then either
`os._exit(3)` (die) or sleeps forever (hang). With LP_TEST_FAULT_WHEN=FILE2 instead of a step
count, the first call once FILE2 exists (a server's test decides when). LP_TEST_TUNER=ar (--cli
mode) makes the W/N/G auto-tuner choose plain decoding, as it does by timing on a loaded CPU.
LP_TEST_DELAY=FILE (--cli and --serve modes): while FILE exists, every `Worker.run` (a step's
forward) first waits the seconds it holds, or until it is removed (a server's queue fills while a
decode is held).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

torch.set_num_threads(1)

# ---------------------------------------------------------------- counting communication
API_NAMES = (
    "all_gather_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
    "barrier",
    "monitored_barrier",
)
PG_METHODS = (
    "allgather",
    "_allgather_base",
    "all_gather_single",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single_coalesced",
    "allreduce",
    "allreduce_coalesced",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "gather",
    "scatter",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "send",
    "recv",
    "recv_anysource",
)
CALLS: list[dict] = []  # top-level torch.distributed API calls
PG_CALLS: list[str] = []  # ProcessGroup-level operations (what actually reaches the backend)
PATCHED: dict[str, list[str]] = {"api": [], "process_group": []}
_depth = [0]


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


def _describe(name: str, args: tuple, kwargs: dict) -> dict:
    call = {"name": name}
    if name in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"):
        out = args[0] if args else kwargs.get("output_tensor")
        inp = args[1] if len(args) > 1 else kwargs.get("input_tensor")
    elif name == "all_gather":
        out = args[0] if args else kwargs.get("tensor_list")
        inp = args[1] if len(args) > 1 else kwargs.get("tensor")
    else:
        out = inp = None
    if isinstance(inp, torch.Tensor):
        call.update(
            in_numel=inp.numel(),
            in_dtype=str(inp.dtype),
            in_shape=list(inp.shape),
            in_is_floating=inp.is_floating_point() or inp.is_complex(),
            out_numel=sum(t.numel() for t in _tensors(out)),
        )
    else:
        call["tensors"] = [[t.numel(), str(t.dtype)] for t in _tensors(list(args) + list(kwargs.values()))]
    return call


def _counted(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _depth[0]:  # an entry point called by another one: count the outer call only
            return fn(*args, **kwargs)
        _depth[0] += 1
        try:
            CALLS.append(_describe(name, args, kwargs))
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1

    wrapper.__lp_counted__ = True
    return wrapper


def install_counters() -> None:
    """Idempotent: wraps each entry point once."""
    if PATCHED["api"]:
        return
    wrapped: dict[int, object] = {}
    for module in (dist, distributed_c10d):
        for name in API_NAMES:
            fn = getattr(module, name, None)
            if fn is None or getattr(fn, "__lp_counted__", False):
                continue
            if id(fn) not in wrapped:
                wrapped[id(fn)] = _counted(name, fn)
            setattr(module, name, wrapped[id(fn)])
            if name not in PATCHED["api"]:
                PATCHED["api"].append(name)
    pg = distributed_c10d.ProcessGroup
    for name in PG_METHODS:
        method = getattr(pg, name, None)
        if method is None:
            continue

        def make(name=name, method=method):
            def pg_wrapper(self, *args, **kwargs):
                PG_CALLS.append(name)
                return method(self, *args, **kwargs)

            return pg_wrapper

        try:
            setattr(pg, name, make())
            PATCHED["process_group"].append(name)
        except (TypeError, AttributeError):
            pass


# ---------------------------------------------------------------- fault injection
def install_fault() -> None:
    mode = os.environ.get("LP_TEST_FAULT")
    if not mode or int(os.environ.get("RANK", "0")) != int(os.environ.get("LP_TEST_FAULT_RANK", "1")):
        return
    at = int(os.environ.get("LP_TEST_FAULT_STEP", "3"))
    mark = os.environ.get("LP_TEST_FAULT_MARK")
    when = os.environ.get("LP_TEST_FAULT_WHEN")
    from lp.worker import Worker

    original = Worker.run
    seen = [0]

    def step(self, *args, **kwargs):
        seen[0] += 1
        if Path(when).exists() if when else seen[0] == at:
            if mark:
                Path(mark).write_text(repr(time.time()))
            if mode == "die":
                os._exit(3)
            while True:  # hang: never reach this step's all-gather
                time.sleep(1000)
        return original(self, *args, **kwargs)

    Worker.run = step


def install_delay() -> None:
    """LP_TEST_DELAY=FILE: while FILE exists, each step first waits the seconds it holds (or
    until FILE is removed)."""
    held = os.environ.get("LP_TEST_DELAY")
    if not held:
        return
    from lp.worker import Worker

    original = Worker.run

    def step(self, *args, **kwargs):
        start = time.time()
        while True:
            try:
                wait = float(Path(held).read_text() or 0)
            except (OSError, ValueError):
                break
            if time.time() - start >= wait:
                break
            time.sleep(0.01)
        return original(self, *args, **kwargs)

    Worker.run = step


def install_tuner_choice() -> None:
    """LP_TEST_TUNER=ar: the W/N/G auto-tuner decides that plain decoding is fastest (what it
    decides by timing on a loaded CPU), so a test does not depend on the machine's load."""
    if os.environ.get("LP_TEST_TUNER") != "ar":
        return
    from lp.decode.auto import AutoTuner

    AutoTuner.choose = lambda self, **_: (None, "plain decoding (forced by the test)")


# ---------------------------------------------------------------- API tasks
class _Done(Exception):
    """A batch task's results are in."""


def run_spec(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    out_file = Path(spec["out_dir"]) / f"rank{rank}.json"
    doc = {
        "rank": rank,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "patched": PATCHED,
        "results": {},
        "done": False,
    }

    def save() -> None:
        tmp = out_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(out_file)

    from lp import LP, LPError

    if spec.get("budget"):  # every step's budget this policy (W=auto's trees cut by it)
        from lp.decode.budget import Budget

        LP.budget = lambda self: Budget(spec["budget"], P=self.lp.world_size)
    models: dict[str, LP] = {}
    t0 = time.time()
    try:
        options = {**spec.get("lp", {}), **spec.get("lp_per_rank", {}).get(str(rank), {})}  # more LP keys
        for name, path in spec["models"].items():
            models[name] = LP(
                path,
                device=spec.get("device", "cpu"),
                timeout_s=spec.get("timeout_s", 60),
                tp=spec.get("tp", 1),
                **options,
            )
        doc["load_seconds"] = time.time() - t0
        for task in spec["tasks"]:
            mine = dict(task, **task.get("per_rank", {}).get(str(rank), {}))
            lm = models[mine["model"]]
            n_calls, n_pg = len(CALLS), len(PG_CALLS)
            res: dict = {}
            t = time.time()
            try:
                if "prompts" in mine:  # several prompts decoded together (each item: a prompt and its settings)
                    done = lm.generate(mine["prompts"], batch=mine["batch"], **mine.get("settings", {}))
                    res["batch"] = [
                        {"output_ids": r.output_ids, "steps": r.steps, "accepted_per_step": r.accepted_per_step}
                        for r in done
                    ]
                    raise _Done
                r = lm.generate(mine["prompt"], chat=mine.get("chat", False), **mine.get("settings", {}))
                res.update(
                    prompt_ids=r.prompt_ids,
                    output_ids=r.output_ids,
                    steps=r.steps,
                    accepted_per_step=r.accepted_per_step,
                    world_size=r.world_size,
                    new_tokens=r.new_tokens,
                    W=r.W,
                    N=r.N,
                    G=r.G,
                    mode=r.mode,
                    tp=r.tp,
                )
            except _Done:
                pass
            except LPError as e:
                res["error"] = {"type": type(e).__name__, "message": str(e)}
            res.update(calls=CALLS[n_calls:], pg_calls=PG_CALLS[n_pg:], seconds=time.time() - t)
            res["memory"] = [lm.memory.digest, lm.memory.tokens]  # the draft memory after the task
            if mine.get("slope"):  # what W=auto's tuner learned so far, from how many sequences
                res["slope"], res["learned"] = lm.tuner().slope(), lm.tuner().learned
            doc["results"][task["id"]] = res
            save()
        doc["done"] = True
        doc["seconds"] = time.time() - t0
    except BaseException:
        doc["crash"] = traceback.format_exc()
        save()
        raise
    finally:
        save()
    if models:  # every LP shares the one process group: close it once
        next(iter(models.values())).close()
    return 0


def run_cli(argv: list[str], module: str = "lp.generate") -> None:
    import runpy

    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--cli":
        install_fault()
        install_delay()
        install_tuner_choice()
        run_cli(argv[1:])
        return 0
    if argv and argv[0] == "--serve":
        install_fault()
        install_delay()
        run_cli(argv[1:], "lp.serve")
        return 0
    install_counters()
    install_fault()
    return run_spec(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

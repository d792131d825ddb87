"""Launch P ranks for the distributed tests, with a hard time limit on everything.

Two launchers:
- `spawn_ranks`: starts P ranks with the env that torchrun would give them (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), by default forked from one process
  that has already imported torch/transformers/lp (`_zygote.py`, as torch.multiprocessing's
  fork start method does), which saves seconds of CPU per rank. Each rank's exit code, output
  and exit time are observed separately, and no agent kills the survivors when one rank dies,
  so a test sees exactly what lp itself does.
- `torchrun`: the real `torchrun --standalone --nproc_per_node P` (the user-facing launcher),
  with per-rank stdout/stderr files (`--log-dir ... --tee 3`).

Both kill the whole process tree when the time limit passes, so a hang fails the test instead
of blocking the suite. Children run with one thread each (OMP_NUM_THREADS=1) and offline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
WORKER = str(HERE / "_worker.py")
ZYGOTE = str(HERE / "_zygote.py")
_TORCHRUN = Path(PYTHON).with_name("torchrun")
TORCHRUN = [str(_TORCHRUN)] if _TORCHRUN.exists() else [PYTHON, "-m", "torch.distributed.run"]

_DIST_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONWARNINGS="ignore",
    )
    # the checkout, and tests/ for the helper module (`import helpers`)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the session the process leads (it and its children), then reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@dataclass
class RankRun:
    rank: int
    returncode: int | None  # None: still running at the deadline (then killed)
    stdout: str
    stderr: str
    exit_time: float | None  # time.time() when the process was seen to exit

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


@dataclass
class Launch:
    """What one launch observed. For `spawn_ranks`, `ranks` has one entry per rank; for
    `torchrun`, `returncode`/`stdout`/`stderr` are the launcher's and `ranks` holds each rank's
    logged output (returncode None)."""

    returncode: int | None
    start: float
    end: float
    stdout: str = ""
    stderr: str = ""
    ranks: list[RankRun] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.end - self.start

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        parts = [f"returncode={self.returncode} elapsed={self.elapsed:.1f}s"]
        if self.stdout or self.stderr:
            parts.append(f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}")
        for r in self.ranks:
            parts.append(
                f"--- rank {r.rank} rc={r.returncode}\n[stdout]\n{r.stdout[-2000:]}\n[stderr]\n{r.stderr[-4000:]}"
            )
        return "\n".join(parts)


def _ranks(case_dir: Path, nproc: int, exits: dict[int, tuple[int, float]]) -> list[RankRun]:
    read = lambda name: (case_dir / name).read_text(errors="replace") if (case_dir / name).exists() else ""  # noqa: E731
    return [
        RankRun(
            r,
            exits[r][0] if r in exits else None,
            read(f"{r}.out"),
            read(f"{r}.err"),
            exits[r][1] if r in exits else None,
        )
        for r in range(nproc)
    ]


def _launch(ranks: list[RankRun], start: float, stdout: str = "", stderr: str = "") -> Launch:
    done = [r for r in ranks if r.returncode is not None]
    rc = None if len(done) < len(ranks) else next((r.returncode for r in ranks if r.returncode != 0), 0)
    end = max(r.exit_time for r in ranks) if len(done) == len(ranks) else time.time()
    return Launch(rc, start, end, stdout, stderr, ranks=ranks)


def spawn_batch(
    cases: dict[str, list[str]],
    nproc: int,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | Path = ROOT,
) -> dict[str, Launch]:
    """Run several jobs at once, each `python ARGS` as `nproc` ranks forked from one `_zygote.py`
    (so the imports are paid once for all of them); wait at most `timeout` seconds in all."""
    base_env = child_env(env)
    base_env.update(MASTER_ADDR="127.0.0.1")
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="lp-ranks-") as tmp:
        tmp_path = Path(tmp)
        spec = tmp_path / "cases.json"
        spec.write_text(json.dumps({name: {"argv": argv, "port": free_port()} for name, argv in cases.items()}))
        with open(tmp_path / "zygote.out", "w+") as zout, open(tmp_path / "zygote.err", "w+") as zerr:
            proc = subprocess.Popen(
                [PYTHON, ZYGOTE, tmp, str(nproc), "--batch", str(spec)],
                cwd=cwd,
                env=base_env,
                stdout=zout,
                stderr=zerr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _kill_tree(proc)  # the zygote's session: it and the ranks it forked
            zout.seek(0)
            zerr.seek(0)
            zygote_out, zygote_err = zout.read(), zerr.read()
        launches = {}
        for name in cases:
            f = tmp_path / name / "exits.json"
            exits = {int(r): (rc, t) for r, (rc, t) in json.loads(f.read_text()).items()} if f.exists() else {}
            launches[name] = _launch(_ranks(tmp_path / name, nproc, exits), start, zygote_out, zygote_err)
    return launches


def spawn_ranks(
    args: list[str],
    nproc: int,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | Path = ROOT,
    fork: bool = True,
) -> Launch:
    """Run `python ARGS` as `nproc` ranks of one job; wait at most `timeout` seconds.

    fork=True (default): one `_zygote.py` process imports torch/transformers/lp once and forks
    the ranks (saves seconds of CPU per rank); fork=False: one fresh interpreter per rank."""
    if fork:
        return spawn_batch({"job": args}, nproc, timeout=timeout, env=env, cwd=cwd)["job"]
    base_env = child_env(env)
    base_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    start = time.time()
    deadline = start + timeout
    with tempfile.TemporaryDirectory(prefix="lp-ranks-") as tmp:
        tmp_path = Path(tmp)
        exits: dict[int, tuple[int, float]] = {}
        procs = []
        for r in range(nproc):
            rank_env = dict(
                base_env, RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc)
            )
            with open(tmp_path / f"{r}.out", "w") as out, open(tmp_path / f"{r}.err", "w") as err:
                procs.append(
                    subprocess.Popen(
                        [PYTHON, *args],
                        cwd=cwd,
                        env=rank_env,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        try:
            while time.time() < deadline and len(exits) < nproc:
                for r, p in enumerate(procs):
                    if r not in exits and p.poll() is not None:
                        exits[r] = (p.returncode, time.time())
                time.sleep(0.05)
        finally:
            for p in procs:
                _kill_tree(p)  # only our own children; a no-op for those that exited
        return _launch(_ranks(tmp_path, nproc, exits), start)


def torchrun(
    args: list[str],
    nproc: int,
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    module: bool = False,
    cwd: str | Path = ROOT,
) -> Launch:
    """Run `torchrun --standalone --nproc_per_node NPROC [-m] ARGS`; wait at most `timeout` s."""
    with tempfile.TemporaryDirectory(prefix="lp-torchrun-") as logs:
        cmd = [
            *TORCHRUN,
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            "--log-dir",
            logs,
            "--tee",
            "3",
            *(["-m"] if module else []),
            *args,
        ]
        start = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            stdout, stderr = proc.communicate()
            rc = None
        end = time.time()
        ranks = []
        for r in range(nproc):
            found = sorted(Path(logs).glob(f"*/attempt_*/{r}"))

            def read(name: str, found: list[Path] = found) -> str:
                return (found[-1] / name).read_text(errors="replace") if found and (found[-1] / name).exists() else ""

            ranks.append(RankRun(r, None, read("stdout.log"), read("stderr.log"), None))
    return Launch(rc, start, end, stdout, stderr, ranks)


def run_api_worker(
    spec: dict, nproc: int, *, timeout: float, tmp: Path, env: dict[str, str] | None = None
) -> tuple[Launch, list[dict]]:
    """Run `_worker.py` on `nproc` ranks with a task spec; return the launch and each rank's
    result document (an empty dict for a rank that wrote none)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, out_dir=str(tmp))
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    launch = spawn_ranks([WORKER, str(spec_path)], nproc, timeout=timeout, env=env)
    return launch, read_results(tmp, nproc)


def read_results(out_dir: Path, nproc: int) -> list[dict]:
    docs = []
    for r in range(nproc):
        f = Path(out_dir) / f"rank{r}.json"
        docs.append(json.loads(f.read_text()) if f.exists() else {})
    return docs

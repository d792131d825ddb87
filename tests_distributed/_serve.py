"""A real `lp.serve` server for the serving tests: one process (`python _worker.py --serve`, which
runs `python -m lp.serve` with the test faults available) or P ranks under the real torchrun,
bound to 127.0.0.1 on a free port. It waits until /health answers, and `stop` ends it by
SIGTERM (then SIGKILL of every process it started, torchrun's ranks included: they run in
sessions of their own) and reports whether any process outlived the stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from _launch import PYTHON, TORCHRUN, WORKER, child_env, free_port

from tools.serve_load import descendants, running

READY_S = 240  # the most a server may take to load and warm up on a busy 2-core machine


class Server:
    """`lp.serve` with `args` (KEY=VALUE) on `nproc` ranks; `env`: extra environment."""

    def __init__(self, args: list[str], nproc: int = 1, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = Path(tempfile.mkdtemp(prefix="lp-serve-"))
        serve = [WORKER, "--serve", f"port={self.port}", "host=127.0.0.1", *args]
        launcher = [*TORCHRUN, "--standalone", "--nproc_per_node", str(nproc), "--log-dir", str(self.logs / "ranks")]
        cmd = [PYTHON, *serve] if nproc == 1 else [*launcher, "--tee", "3", *serve]
        with open(self.logs / "out", "w") as out, open(self.logs / "err", "w") as err:
            self.proc = subprocess.Popen(
                cmd, env=child_env(env), stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pids: list[int] = [self.proc.pid]

    def wait_ready(self) -> Server:
        deadline = time.time() + READY_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited ({self.proc.returncode}) before serving:\n{self.output()}")
            try:
                status, _ = self.get("/health", timeout=2)
                if status == 200:
                    self.pids += descendants(self.proc.pid)  # torchrun's ranks, once they run
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the server did not answer /health in {READY_S} s:\n{self.output()}")

    def get(self, path: str, timeout: float = 10) -> tuple[int, dict]:
        """GET `path`: (status, JSON body)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def health(self) -> dict:
        return self.get("/health")[1]

    def wait_health(self, ok, timeout: float = 30) -> dict:
        """Poll /health until `ok(health)`; its last answer."""
        deadline = time.time() + timeout
        while not ok(state := self.health()) and time.time() < deadline:
            time.sleep(0.05)
        return state

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` s; the launcher's exit status (None: killed)."""
        self.pids += [p for p in descendants(self.proc.pid) if p not in self.pids]
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # torchrun forwards it to its ranks
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.kill()

    def wait_exit(self, timeout: float) -> int | None:
        """The launcher's exit status once it ends by itself (None: still running after `timeout`)."""
        self.pids += [p for p in descendants(self.proc.pid) if p not in self.pids]
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL every process the server started that still runs."""
        for pid in self.pids:
            if running(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def survivors(self) -> list[int]:
        """The processes the server started that still run."""
        return [pid for pid in self.pids if running(pid)]

    def output(self) -> str:
        parts = [f"--- {name}\n{(self.logs / name).read_text(errors='replace')[-4000:]}" for name in ("out", "err")]
        for log in sorted(self.logs.glob("ranks/**/*.log")):
            parts.append(f"--- {log.relative_to(self.logs)}\n{log.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

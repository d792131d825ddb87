"""`python -m lp.generate` on a terminal prints the text as the steps commit it: run under a
pseudo-terminal with each step held 0.05 s, the text arrives in pieces over the decode, once, as
the JSONL has it, then the summary line."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time

from _launch import PYTHON, ROOT, WORKER, child_env


def test_a_terminal_sees_the_text_as_it_is_committed(tiny_text_model, tmp_path):
    out, held = tmp_path / "out.jsonl", tmp_path / "delay"
    held.write_text("0.05")
    cmd = [PYTHON, WORKER, "--cli", f"model.name={tiny_text_model}", "prompt=The cat sat on the mat. The cat"]
    cmd += ["chat=false", "W=5", "N=3", "G=5", "max_new_tokens=24", f"out={out}"]
    main, terminal = pty.openpty()
    env = child_env({"LP_TEST_DELAY": str(held)})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=terminal, stderr=subprocess.DEVNULL)
    os.close(terminal)
    reads: list[tuple[float, bytes]] = []
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        reads.append((time.time(), chunk))
    proc.wait(10)
    os.close(main)
    shown = b"".join(c for _, c in reads).decode().replace("\r\n", "\n")
    assert proc.returncode == 0, shown
    text = json.loads(out.read_text())["text"]
    assert shown.startswith(text + "\n\n") and shown.count(text) == 1 and "[0] 24 tokens in" in shown, shown
    # the text came in pieces while the steps ran, not in one write at the end
    pieces = [t for t, c in reads if c.strip() and not c.startswith(b"[0]")]
    assert len(pieces) >= 3 and pieces[-1] - pieces[0] > 0.2, [(round(t - reads[0][0], 2), c) for t, c in reads]

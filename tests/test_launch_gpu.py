"""launch/gpu.sh's plan: every part's steps with their time limits, within 40 minutes in all."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_plan_fits_40_minutes():
    out = subprocess.run(
        ["bash", "launch/gpu.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    parts = {p: int(s) for p, s in re.findall(r"^  = (\w+) budget (\d+) s$", out, re.M)}
    limits = [int(s) for s in re.findall(r"^  \S+ +(\d+) s  ", out, re.M)]
    total = int(re.search(r"^total budget (\d+) s", out, re.M).group(1))
    assert list(parts) == ["setup", "tests", "host", "sweep", "steps", "bench", "ranks", "project"]  # priority order
    assert total == sum(parts.values()) == sum(limits) <= 2400
    assert parts["setup"] + max(parts.values()) <= 600  # each part fits a 10-minute command after setup


def test_gpu_plan_refuses_an_unknown_part():
    argv = ["bash", "launch/gpu.sh", "--dry-run", "bench", "nope"]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "PART: setup tests host sweep steps bench ranks project" in run.stderr

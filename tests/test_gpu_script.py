"""launch/gpu.sh plans a GPU session that fits: every part's step limits within the part's
budget, and the parts within 25 minutes (its --dry-run runs nothing)."""

from __future__ import annotations

import re
import subprocess

from helpers import REPO


def test_the_gpu_plan_fits_its_budget():
    out = subprocess.run(
        ["bash", "launch/gpu.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    totals = [(int(a), int(b)) for a, b in re.findall(r"total (\d+) s of (\d+) s", out)]
    assert len(totals) == 4 and all(0 < used <= budget for used, budget in totals), out
    assert "OVER BUDGET" not in out
    steps = re.findall(r"^  (\S+) +(\d+) s  ", out, flags=re.M)
    assert {"pytest-cuda", "steps-llama-7b", "pytest-cuda-real", "bench-float32", "project-spec_bench"} <= {
        name for name, _ in steps
    }
    assert int(re.search(r"all parts: (\d+) s", out)[1]) <= 25 * 60

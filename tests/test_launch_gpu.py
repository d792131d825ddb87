"""launch/gpu.sh's plans: the default plan's steps fit one 10-minute command on a fresh machine
(at most 540 s in all), each optional part fits a command with setup, and `--dry-run` prints
both with a total line each."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(*parts: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "launch/gpu.sh", "--dry-run", *parts], cwd=ROOT, capture_output=True, text=True)


def plans(out: str) -> dict[str, tuple[dict[str, int], int, list[int]]]:
    """Each plan printed: its parts' budgets, its total line and its steps' limits."""
    found = {}
    for title, body, total in re.findall(r"^(.+):\n(.*?)^total \1 (\d+) s$", out, re.M | re.S):
        parts = {p: int(s) for p, s in re.findall(r"^  = (\w+) budget (\d+) s$", body, re.M)}
        found[title] = (parts, int(total), [int(s) for s in re.findall(r"^  \S+ +(\d+) s  ", body, re.M)])
    return found


def test_the_default_plan_fits_one_command_and_the_optional_parts_a_second():
    run = dry_run()
    assert run.returncode == 0, run.stderr
    found = plans(run.stdout)
    (default, total, limits), (optional, rest, more) = found["default plan"], found["optional parts"]
    assert list(default) == ["setup", "replay", "steps", "tests"]  # the parts that matter most first
    assert total == sum(default.values()) == sum(limits) <= 540
    assert set(optional) == {"smollm2", "real", "flex", "batched", "replay2", "host", "sweep", "bench", "ranks"}
    assert rest == sum(optional.values()) == sum(more)
    assert all(default["setup"] + budget <= 600 for budget in optional.values())  # each a command with setup


def test_named_parts_print_their_own_plan():
    run = dry_run("setup", "replay2")
    (parts, total, _), *others = plans(run.stdout).values()
    assert run.returncode == 0 and not others and list(parts) == ["setup", "replay2"] and total == sum(parts.values())


def test_an_unknown_part_is_refused():
    run = dry_run("bench", "nope")
    assert (
        run.returncode == 2
        and "PART: setup replay steps tests smollm2 real flex batched replay2 host sweep bench ranks" in run.stderr
    )


def test_the_replayed_decodes_read_committed_recordings():
    for name in ("smollm2-spec_bench-P1", "smollm2-spec_bench-P2"):
        assert (ROOT / "results" / "replay" / name / "recording.json").is_file(), name

"""Errors end every rank instead of hanging any: bad input, rank mismatch, a rank that dies
mid-generation, a rank that hangs. Every launch has a hard time limit, so a hang fails here."""

from __future__ import annotations

import re
import shlex

import pytest
from _cases import MISMATCH_IDS, WORLD_SIZES, completed
from _launch import ROOT, WORKER, spawn_batch, spawn_ranks, torchrun

FAULT_TIMEOUT_S = 10  # lp's collective timeout in the fault tests
SLACK_S = 30  # scheduling slack on a shared 2-core machine
HARD_LIMIT_S = 120


def _cli(model, *extra: str) -> list[str]:
    return [
        "-m",
        "lp.generate",
        f"model.name={model}",
        "prompt=Hello world hello world hello",
        "chat=false",
        "max_new_tokens=8",
        "timeout_s=30",
        "quiet=true",
        *extra,
    ]


def _one_error_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lp: error:")]


def readme_errors() -> dict[str, tuple[list[str], str]]:
    """docs/cli.md's list of bad inputs: {command: (python args, the error line it shows)}."""
    block = re.search(r"```console\n(.*?)```", (ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), re.S)[1]
    lines = block.splitlines()
    cases = {}
    for cmd, expected in zip(lines[::2], lines[1::2]):
        assert cmd.startswith("$ python ") and expected.startswith("lp: error: "), (cmd, expected)
        cases[cmd[2:]] = (shlex.split(cmd, comments=True)[2:], expected)  # after "$ python"
    return cases


CLI_ERRORS = readme_errors()


@pytest.fixture(scope="module")
def bad_input_runs(tiny_text_model, tmp_path_factory):
    """Every bad input of docs/cli.md, plus a prompt beyond the context (known only after the model and
    tokenizer load), as real CLI runs on 1 and 2 ranks, all at once. The listed files are in
    the working directory; the model cache is empty, so a check after the model would fail."""
    cwd = tmp_path_factory.mktemp("bad_input")
    (cwd / "bad.jsonl").write_text('{"prompt": "ok"}\n{"prompt": "a\tb"}\n')
    cases = {cmd: args for cmd, (args, _) in CLI_ERRORS.items()}
    cases["too long"] = _cli(tiny_text_model, "max_new_tokens=1100")
    env = {"LP_CACHE": str(cwd / "empty-cache"), "CUDA_VISIBLE_DEVICES": ""}
    names = {f"case{i}": cmd for i, cmd in enumerate(cases)}
    runs = {}
    for P in (1, 2):
        launches = spawn_batch({n: cases[cmd] for n, cmd in names.items()}, P, timeout=HARD_LIMIT_S, env=env, cwd=cwd)
        runs.update({(names[n], P): launch for n, launch in launches.items()})
    return runs


@pytest.mark.parametrize("P", [1, 2])
@pytest.mark.parametrize("cmd", [*CLI_ERRORS, "too long"])
def test_bad_input_ends_with_one_line_from_rank_0(bad_input_runs, cmd, P):
    """Each rank exits with code 2, quickly and without a traceback; rank 0 printed exactly the
    documented error line, the other ranks nothing (under torchrun they would repeat it)."""
    launch = bad_input_runs[cmd, P]
    assert not launch.timed_out, f"a rank hung on bad input:\n{launch.describe()}"
    assert launch.elapsed < 60, launch.describe()
    expected = CLI_ERRORS[cmd][1] if cmd in CLI_ERRORS else "lp: error: prompt ("
    for r in launch.ranks:
        assert r.returncode == 2, launch.describe()
        assert "Traceback" not in r.stderr, f"rank {r.rank}:\n{r.stderr}"
        errors = _one_error_line(r.stderr)
        if r.rank == 0:
            assert len(errors) == 1 and errors[0].startswith(expected), f"{errors} != {expected}\n{r.stderr}"
            assert r.stderr.strip().splitlines()[-1] == errors[0], r.stderr
        else:
            assert not errors, f"rank {r.rank}:\n{r.stderr}"


def test_bad_value_after_the_tuner_is_still_an_error(tiny_text_model):
    """`W=0` alone leaves N and G to auto; an explicit bad W is an error whatever the tuner
    would pick (forced to plain decoding here, as it picks by timing on a loaded CPU)."""
    args, env = [WORKER, "--cli", *_cli(tiny_text_model, "W=0")[2:]], {"LP_TEST_TUNER": "ar"}
    launch = spawn_ranks(args, 2, timeout=HARD_LIMIT_S, env=env)
    assert [r.returncode for r in launch.ranks] == [2, 2], launch.describe()
    assert _one_error_line(launch.ranks[0].stderr) == ["lp: error: W must be an integer >= 1, got 0"], launch.describe()
    assert not _one_error_line(launch.ranks[1].stderr), launch.describe()


@pytest.mark.parametrize("world_size", [p for p in WORLD_SIZES if p > 1])
def test_rank_mismatch_raises_on_every_rank(world_size, api_run):
    """Rank 1 given another prompt, or the last rank another W: `LPError("rank mismatch ...")`
    on every rank (from the one handshake all-gather), and the group keeps working after it."""
    docs = completed(*api_run(world_size), world_size)
    for cid in MISMATCH_IDS:
        for doc in docs:
            res = doc["results"][cid]
            assert "error" in res, f"{cid}: rank {doc['rank']} decoded instead of refusing: {res.get('output_ids')}"
            assert res["error"]["type"] == "LPError" and "rank mismatch" in res["error"]["message"], res["error"]
            assert len(res["calls"]) == 1 and "all_gather" in res["calls"][0]["name"], res["calls"]
    outputs = [doc["results"]["mismatch/recovered"] for doc in docs]
    assert all("error" not in r for r in outputs), outputs
    assert all(r["output_ids"] == outputs[0]["output_ids"] and r["new_tokens"] == 8 for r in outputs)


def _fault_env(mode: str, mark) -> dict[str, str]:
    return {
        "LP_TEST_FAULT": mode,
        "LP_TEST_FAULT_RANK": "1",
        "LP_TEST_FAULT_STEP": "3",
        "LP_TEST_FAULT_MARK": str(mark),
    }


def _fault_args(model, tp: int = 1) -> list[str]:
    """A CLI decode long enough to fault in; `tp`: ranks per replica (1: the step's all-gather is
    what fails)."""
    return [
        WORKER,
        "--cli",
        f"model.name={model}",
        "prompt=Hello world hello world hello",
        "chat=false",
        "W=5",
        "N=3",
        "G=5",
        "max_new_tokens=64",
        f"timeout_s={FAULT_TIMEOUT_S}",
        f"tp={tp}",
        "quiet=true",
    ]


def test_dead_rank_fails_the_others(tiny_text_model, tmp_path):
    """Rank 1 of 3 calls os._exit(3) at its third step. With no launcher agent to clean up, ranks 0
    and 2 must exit non-zero on their own within about timeout_s of the death."""
    mark = tmp_path / "died_at"
    launch = spawn_ranks(_fault_args(tiny_text_model), 3, timeout=HARD_LIMIT_S, env=_fault_env("die", mark))
    assert mark.exists(), f"rank 1 never reached step 3:\n{launch.describe()}"
    died = float(mark.read_text())
    assert launch.ranks[1].returncode == 3, launch.describe()
    for r in (launch.ranks[0], launch.ranks[2]):
        assert r.returncode is not None, (
            f"rank {r.rank} still running {HARD_LIMIT_S}s after start:\n{launch.describe()}"
        )
        assert r.returncode != 0, launch.describe()
        assert r.exit_time - died < FAULT_TIMEOUT_S + SLACK_S, (
            f"rank {r.rank} took {r.exit_time - died:.1f}s to fail after rank 1 died"
        )


def test_hung_rank_fails_the_job_within_the_timeout(tiny_text_model, tmp_path):
    """Rank 1 of 2 sleeps forever at its third step, under torchrun. Rank 0's all-gather must time
    out after timeout_s, rank 0 exit non-zero, and torchrun then end the job non-zero."""
    mark = tmp_path / "hung_at"
    launch = torchrun(_fault_args(tiny_text_model), 2, timeout=HARD_LIMIT_S, env=_fault_env("hang", mark))
    assert mark.exists(), f"rank 1 never reached step 3:\n{launch.describe()}"
    hung = float(mark.read_text())
    assert launch.returncode is not None, f"job still running {HARD_LIMIT_S}s after start:\n{launch.describe()}"
    assert launch.returncode != 0, launch.describe()
    waited = launch.end - hung
    assert FAULT_TIMEOUT_S - 1 < waited < FAULT_TIMEOUT_S + SLACK_S, (
        f"the job ended {waited:.1f}s after rank 1 hung (timeout_s={FAULT_TIMEOUT_S})\n{launch.describe()}"
    )


def test_lp_started_ranks_end_with_lps_error_line(tmp_path):
    """`nproc=2`: lp runs torchrun itself, and its one error line comes last, after torchrun's
    report of the failed ranks."""
    import subprocess

    from _launch import PYTHON, child_env

    proc = subprocess.run(
        [PYTHON, "-m", "lp.generate", "nproc=2", "prompt=Hi", "W=0"],
        cwd=tmp_path,
        env=child_env({"CUDA_VISIBLE_DEVICES": ""}),
        capture_output=True,
        text=True,
        timeout=HARD_LIMIT_S,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert _one_error_line(proc.stderr) == ["lp: error: W must be an integer >= 1, got 0"], proc.stderr
    assert lines[-1] == "lp: error: W must be an integer >= 1, got 0", proc.stderr
    assert "Traceback" not in proc.stderr

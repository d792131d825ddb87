"""Errors end every rank instead of hanging any: bad input, rank mismatch, a rank that dies
mid-generation, a rank that hangs. Every launch has a hard time limit, so a hang fails here."""
from __future__ import annotations

import pytest

from _cases import MISMATCH_IDS, WORLD_SIZES, completed
from _launch import WORKER, spawn_ranks, torchrun

FAULT_TIMEOUT_S = 10  # lp's collective timeout in the fault tests
SLACK_S = 30  # scheduling slack on a shared 2-core machine
HARD_LIMIT_S = 120


def _cli(model, *extra: str) -> list[str]:
    return ["-m", "lp.generate", f"model.name={model}", "prompt=Hello world hello world hello",
            "chat=false", "max_new_tokens=8", "timeout_s=30", "quiet=true", *extra]


def _one_error_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lp: error:")]


@pytest.mark.parametrize("overrides,tuner", [(("W=0", "N=3", "G=3"), None), (("W=0",), "ar")],
                         ids=["W=0-N=3-G=3", "W=0-auto-N-G-tuner-picks-ar"])
def test_bad_input_every_rank_exits_with_one_error_line(tiny_text_model, overrides, tuner):
    """W=0 reaches every rank after it joined the process group and loaded the model. Run as 2
    plain ranks (no agent to kill the survivors): each rank must itself exit non-zero, quickly,
    with one `lp: error:` line and no traceback.

    `W=0` alone leaves N and G at their default "auto"; an explicit bad W must still be an
    error whatever the auto-tuner picks. The second case makes the tuner pick plain decoding
    (which it does by timing on a loaded CPU; forced here so the test does not depend on load)."""
    if tuner is None:
        args, env = _cli(tiny_text_model, *overrides), None
    else:
        args, env = [WORKER, "--cli", *_cli(tiny_text_model, *overrides)[2:]], {"LP_TEST_TUNER": tuner}
    launch = spawn_ranks(args, 2, timeout=HARD_LIMIT_S, env=env)
    assert not launch.timed_out, f"a rank hung on bad input:\n{launch.describe()}"
    assert launch.elapsed < 60, launch.describe()
    for r in launch.ranks:
        assert r.returncode not in (0, None), launch.describe()
        errors = _one_error_line(r.stderr)
        assert len(errors) == 1 and "W must be an integer >= 1" in errors[0], f"rank {r.rank}:\n{r.stderr}"
        assert "Traceback" not in r.stderr, f"rank {r.rank}:\n{r.stderr}"


def test_bad_input_under_torchrun_fails_fast(tiny_text_model):
    """A missing prompts file, under torchrun: the job exits non-zero quickly. torchrun terminates
    the other ranks as soon as one fails, so only the first failing rank is sure to have printed
    its error: some rank printed exactly one `lp: error:` line, and no rank a traceback. (W=0 is
    checked rank by rank above, without an agent in the way.)"""
    expect = "prompts file not found"
    args = [a for a in _cli(tiny_text_model, "prompts=/nonexistent/prompts.jsonl")[1:]
            if not a.startswith("prompt=")]
    launch = torchrun(args, 2, module=True, timeout=HARD_LIMIT_S)
    assert launch.returncode not in (0, None), launch.describe()
    assert launch.elapsed < 60, launch.describe()
    printed = [_one_error_line(r.stderr) for r in launch.ranks]
    assert any(len(e) == 1 and expect in e[0] for e in printed), launch.describe()
    assert all(len(e) <= 1 for e in printed), launch.describe()
    assert not any("Traceback" in r.stderr for r in launch.ranks), launch.describe()


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
    return {"LP_TEST_FAULT": mode, "LP_TEST_FAULT_RANK": "1", "LP_TEST_FAULT_STEP": "3",
            "LP_TEST_FAULT_MARK": str(mark)}


def _fault_args(model) -> list[str]:
    return [WORKER, "--cli", f"model.name={model}", "prompt=Hello world hello world hello", "chat=false",
            "W=5", "N=3", "G=5", "max_new_tokens=64", f"timeout_s={FAULT_TIMEOUT_S}", "quiet=true"]


def test_dead_rank_fails_the_others(tiny_text_model, tmp_path):
    """Rank 1 of 3 calls os._exit(3) at its third step. With no launcher agent to clean up, ranks 0
    and 2 must exit non-zero on their own within about timeout_s of the death."""
    mark = tmp_path / "died_at"
    launch = spawn_ranks(_fault_args(tiny_text_model), 3, timeout=HARD_LIMIT_S, env=_fault_env("die", mark))
    assert mark.exists(), f"rank 1 never reached step 3:\n{launch.describe()}"
    died = float(mark.read_text())
    assert launch.ranks[1].returncode == 3, launch.describe()
    for r in (launch.ranks[0], launch.ranks[2]):
        assert r.returncode is not None, f"rank {r.rank} still running {HARD_LIMIT_S}s after start:\n{launch.describe()}"
        assert r.returncode != 0, launch.describe()
        assert r.exit_time - died < FAULT_TIMEOUT_S + SLACK_S, \
            f"rank {r.rank} took {r.exit_time - died:.1f}s to fail after rank 1 died"


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
    assert FAULT_TIMEOUT_S - 1 < waited < FAULT_TIMEOUT_S + SLACK_S, \
        f"the job ended {waited:.1f}s after rank 1 hung (timeout_s={FAULT_TIMEOUT_S})\n{launch.describe()}"

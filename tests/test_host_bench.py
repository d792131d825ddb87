"""The host-work micro-benchmark (lp/bench/host.py): lp's real decode loop as rank 0 of P, one
gap of host work per step, each step's size recorded."""
from lp.bench.host import host_gaps, main
from lp.config import DecodeConfig


def test_host_gaps_one_per_step():
    cfg = DecodeConfig(W=8, N=4, G=8, max_new_tokens=12)
    times = host_gaps(cfg, P=4, prompt_len=80)
    step_tokens = times.step_tokens
    assert len(times.total) == len(times.exposed) == len(step_tokens) - 1
    assert all(0 < e < t for e, t in zip(times.exposed, times.total))
    # rank 0 of 4 runs 2 of the 8 columns: far fewer tokens than the whole step
    whole = 1 + 7 + 8 * 2
    assert max(step_tokens) < whole + cfg.verify_budget


def test_cli_prints_median_and_p95(capsys):
    main(["W=4", "N=3", "G=4", "P=2", "tokens=8", "allgather=0"])
    out = capsys.readouterr().out
    assert "host work per step, rank 0 of P=2 at W=4 N=3 G=4" in out and "median" in out and "p95" in out
    assert "after the message read" in out

"""The host-work benchmark (tools/host.py): a decode recorded by P gloo processes, then
replayed rank by rank, one gap of host work per step."""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.errors import LPError
from tools.host import load_recording, main, record, replay


@pytest.fixture(scope="module")
def recording_file(tmp_path_factory):
    cfg = DecodeConfig(W=8, N=4, G=8, max_new_tokens=24)
    path = tmp_path_factory.mktemp("host") / "rec.npz"
    return cfg, record(cfg, 2, "random", path=str(path)), path


@pytest.fixture(scope="module")
def recorded(recording_file):
    return recording_file[:2]


def test_replay_times_every_step_of_the_recorded_decode(recorded):
    cfg, rec = recorded
    assert rec.world_size == 2 and len(rec.prompts) == 1 and rec.vocab == 512
    steps = len(rec.gathered) - 1  # one handshake, then one all-gather a step
    assert all(g.shape[0] == 2 for g in rec.gathered)
    times = replay(cfg, rec)
    assert len(times.step_tokens) == len(times.packing) == steps and len(times.total) == len(times.exposed) == steps - 1
    assert all(0 < e < t for e, t in zip(times.exposed, times.total))
    assert all(p > 0 for p in times.packing)
    # rank 0 of 2 runs 4 of the 8 columns: fewer tokens than the whole step
    assert max(times.step_tokens) < 1 + 7 + 8 * 2 + cfg.tree_limit


def test_every_rank_replays_and_the_slowest_bounds_each(recorded):
    from tools.host import slowest

    cfg, rec = recorded
    ranks = [replay(cfg, rec, rank) for rank in range(2)]
    worst = slowest(ranks)
    assert len(worst.exposed) == len(ranks[0].exposed) == len(ranks[1].exposed)
    assert all(w == max(a, b) for w, a, b in zip(worst.exposed, ranks[0].exposed, ranks[1].exposed))
    # the ranks split each step: their forwards differ, and together hold the columns and the tree
    assert ranks[0].step_tokens != ranks[1].step_tokens
    with pytest.raises(LPError, match="rank 2 is not one of the recording's 2"):
        replay(cfg, rec, 2)


def test_replay_refuses_a_decode_it_did_not_record(recorded):
    cfg, rec = recorded
    with pytest.raises(LPError, match="drifted"):
        replay(DecodeConfig(W=8, N=4, G=8, max_new_tokens=24, seed=1), rec)
    cut = dataclasses.replace(rec, gathered=rec.gathered[:-1])
    with pytest.raises(LPError, match="drifted"):
        replay(cfg, cut)


def test_cli_records_once_then_replays_the_file(tmp_path, capsys):
    args = [
        "model=random",
        "W=4",
        "N=3",
        "G=4",
        "P=2",
        "tokens=8",
        "replays=2",
        "allgather=0",
        f"recording={tmp_path / 'rec'}",
    ]
    main(args)
    out = capsys.readouterr().out
    assert "host work per step at W=4 N=3 G=4 successors=8, P=2" in out and "fastest of 2" in out
    assert "the slowest rank of each step: median" in out and "rank 0: median" in out
    assert "after the message read" in out and "replaying a random decode" in out
    assert "on a GPU (fixed-shape steps), also after the read: the step's arrays padded to its bucket" in out
    kept = load_recording(str(tmp_path / "rec.npz"))
    assert kept.model == "random" and kept.world_size == 2
    written = (tmp_path / "rec.npz").stat().st_mtime_ns
    main(args)  # the file exists: replayed, not recorded again
    assert "replaying a random decode" in capsys.readouterr().out
    assert (tmp_path / "rec.npz").stat().st_mtime_ns == written
    with pytest.raises(SystemExit, match="records 2 ranks, not P=3"):
        main([a if a != "P=2" else "P=3" for a in args])


def test_cli_refuses_bad_keys():
    with pytest.raises(SystemExit, match="lp: error"):
        main(["W=x"])
    with pytest.raises(SystemExit, match="lp: error"):
        main(["model=random", "P=0"])


@pytest.mark.parametrize("rank", [0, 1])
def test_replay_catches_other_trees_or_plans(recorded, rank):
    """Drift shows in the replayed rank's message where the host decides it (its columns, its
    rows' input tokens), even while the output length and checksum (the recorded tokens') still
    agree."""
    cfg, rec = recorded
    # other trees than the recorded, of steps of the same shape: no text drafts, another pool order
    with pytest.raises(LPError, match="drifted"):
        replay(dataclasses.replace(cfg, text_drafts=0, pool_order="frequent"), rec, rank)


def test_replay_names_other_settings(recorded):
    _, rec = recorded
    with pytest.raises(LPError, match="the recording is of"):
        replay(DecodeConfig(W=8, N=4, G=8, max_new_tokens=25), rec)


def _ranks(pid: int) -> set[int]:
    """The rank processes that process `pid` spawned (from /proc: children running spawn_main)."""
    kids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                spawned = b"spawn_main" in f.read()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and spawned:
            kids.add(int(entry))
    return kids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_terminated_recording_stops_its_ranks():
    """`kill` (SIGTERM) of the tool while it records ends the rank processes it started."""
    tool = subprocess.Popen(
        [sys.executable, "-m", "tools.host", "model=random", "P=2", "tokens=4000", "allgather=0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, ranks = time.monotonic() + 60, set()
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            ranks = _ranks(tool.pid)
        assert len(ranks) == 2, "the ranks did not start"
        tool.send_signal(signal.SIGTERM)
        assert "lp: error: terminated" in tool.communicate(timeout=60)[1]
        deadline, alive = time.monotonic() + 20, ranks
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = {k for k in ranks if os.path.exists(f"/proc/{k}")}
        assert not alive, f"rank processes {alive} outlived the tool"
    finally:
        tool.kill()
        tool.wait()


def test_ab_report_takes_each_steps_least_time_then_the_slowest_rank():
    from tools.host import ab_report

    # [rank, replay, step] seconds: base's steps cost 2 and 4 ms at best (rank 1 the slower);
    # this version's 1 and 2 ms, its second run slower throughout
    base = [np.array([[[0.001, 0.003], [0.002, 0.004]], [[0.002, 0.004], [0.003, 0.005]]])]
    this = [np.full((2, 1, 2), 0.001), np.full((2, 1, 2), 0.009)]
    this[0][1, 0, 1] = 0.002
    out = ab_report(base, this, "old", "new")
    assert "old: median 3.000 ms" in out and "new: median 1.500 ms" in out
    assert "ratio (this / base): 0.50" in out and "each run's own median: 1.500 9.000 ms" in out


def test_cli_compares_two_checkouts_each_on_its_recording(recording_file, tmp_path, capsys):
    """This checkout against itself, each side replaying its own copy of one recording (as a change
    that builds other trees does): one run of each, compared."""
    _, _, rec = recording_file
    args = ["W=8", "N=4", "G=8", "P=2", "tokens=24", "replays=1", "allgather=0"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with pytest.raises(SystemExit, match="is not a checkout of lp"):
        main([*args, f"recording={rec}", f"ab={tmp_path}"])
    with pytest.raises(SystemExit, match="give recording=FILE"):
        main([*args, f"ab={root}"])
    with pytest.raises(SystemExit, match="ab_recording=FILE"):
        main([*args, f"recording={rec}", f"ab={root}", f"ab_recording={tmp_path / 'none.npz'}"])
    shutil.copy(rec, tmp_path / "own.npz")
    main([*args, f"recording={tmp_path / 'own.npz'}", f"ab={root}", f"ab_recording={rec}", "rounds=1"])
    out = capsys.readouterr().out
    assert out.count("median") == 4 and "ratio (this / base)" in out and "1 runs x 1 replays per rank" in out
    base, this = out.find(f"  {root} on {rec}: median"), out.find(f"  {root} on {tmp_path / 'own.npz'}: median")
    assert 0 <= base < this, out  # the base's line (its own recording) first

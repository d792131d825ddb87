"""Replayed decodes (tools/replay.py, lp/verify/replay.py): a random-weight model of another shape
takes a recorded exact decode's steps, one by one, through lp's own decode loop on one rank (two
ranks: tests_distributed/test_replay.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lp.errors import LPError
from lp.verify.replay import ReplayVerifier, choose_node
from tools import replay

PROMPTS = ["w5 w6 w7 w8 w5 w6 w7 w8 w5 w6", "w20 w30 w40 w20 w30 w40 w20"]
# shapes W=auto may choose here (a CPU calibrates steps of up to 128 tokens), and one without a cap
CONFIGS = "W1N2G15-L11-B9-lone,W1N3G15-L16-B14-lone,W3N3G15-L32-B26-lone,W3N3G15-L64,W3N3G15-L128-D14,W5N3G5"


@pytest.fixture(scope="module")
def recording(tiny_model_dir, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("replay")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    out = root / "recording.json"
    assert replay.main(["record", f"model={tiny_model_dir}", "dataset=jsonl", f"prompts={prompts}",
                        "per_category=9", "max_new_tokens=24", f"configs={CONFIGS}", f"out={out}"]) == 0  # fmt: skip
    return str(out)


def test_the_recording_is_each_steps_committed_tokens(recording, tiny_model_dir):
    from lp import LP
    from lp.bench.shapes import parse_lookahead

    doc = replay.read_recording(recording)
    assert doc["world_size"] == 1 and doc["configs"] == CONFIGS.split(",")
    lm = LP(str(tiny_model_dir), device="cpu", draft_memory=0)  # the recording has no memory
    for p in doc["prompts"]:
        for name, d in p["decodes"].items():
            r = lm.generate(p["prompt_ids"], max_new_tokens=24, **parse_lookahead(name))
            assert d["steps"] == replay.split_steps(r.output_ids, r.accepted_per_step)
    assert any(len(s) > 1 for p in doc["prompts"] for d in p["decodes"].values() for s in d["steps"])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_replayed_decode_takes_the_recorded_steps(device, recording, tmp_path):
    """On another shape with random weights, every decoder commits the recorded tokens step by
    step (the same S), `ar` runs the recorded length, `auto` replays the shape it chose (on a GPU:
    captured steps, the kept drafts' KV moved by a captured graph)."""
    out = tmp_path / "out"
    decoders = "ar,W3N3G15-L32-B26-lone,W3N3G15-L128-D14,W5N3G5,auto"
    assert replay.main(["run", "arch=tiny", f"device={device}", f"recording={recording}", f"decoders={decoders}",
                        "warmup_tokens=4", f"out={out}"]) == 0  # fmt: skip
    r = json.loads((out / "replay.json").read_text())
    assert r["arch"] == "tiny" and r["world_size"] == 1 and r["weights"].startswith("random")
    assert len(r["rows"]) == 5 * len(PROMPTS)
    timed = [row for row in r["rows"] if "skipped" not in row]  # W=auto may choose a shape not recorded here
    assert all(row["decoder"] == "auto" for row in r["rows"] if row not in timed)
    for row in timed:
        assert row["same_steps"] and row["identical"] is (None if row["config"] == "ar" else True), row
        assert row["S"] == pytest.approx(row["recorded_S"]) and row["tok_s"] > 0
    kept = [row for row in timed if row["config"] != "ar" and row["S"] > 1]
    assert kept, "no replayed step accepted a draft: a weak test"
    for row in kept:  # every step with accepted drafts found a node to keep them from
        assert sum(row["kinds"].values()) == sum(n > 1 for n in _accepted(r, row))
    assert set(decoders.split(",")) - {"auto"} <= {s["decoder"] for s in r["summary"]}
    assert (out / "replay.md").read_text().startswith("# Replayed decodes: tiny")


def _accepted(r: dict, row: dict) -> list[int]:
    doc = replay.read_recording(r["settings"]["recording"])
    steps = next(p for p in doc["prompts"] if p["id"] == row["id"])["decodes"][row["config"]]["steps"]
    return [len(s) for s in steps]


def test_the_node_kept_is_the_recorded_path_where_the_tree_holds_it():
    tokens = np.array([7, 8, 9, 7, 5, 6], np.int64)
    parents = np.array([-1, 0, 1, -1, 3, 4], np.int64)  # 7-8-9 and 7-5-6 (unshared: two roots of 7)
    assert choose_node(tokens, parents, np.array([1, 7, 5, 6])) == (5, 0)  # the recorded path
    assert choose_node(tokens, parents, np.array([1, 7, 8, 3])) == (2, 1)  # another node of depth 3
    assert choose_node(tokens, parents, np.array([1, 7, 8, 9, 4])) == (2, 2)  # the tree is shallower
    assert choose_node(tokens[:0], parents[:0], np.array([1, 2])) == (-1, 3)


def test_a_recording_of_other_steps_is_refused(tmp_path):
    with pytest.raises(LPError, match="commits more than"):
        ReplayVerifier([[1, 2, 3]], 2, torch.device("cpu"))
    (tmp_path / "x.json").write_text('{"tool": "tools.steps"}')
    with pytest.raises(LPError, match="not a recording"):
        replay.read_recording(str(tmp_path / "x.json"))
    with pytest.raises(SystemExit, match="usage"):
        replay.main(["nope"])


def test_a_shape_w_auto_chose_that_the_recording_lacks_is_not_timed():
    from lp.decode.ladder import LADDER

    class Choosing:
        def choose(self):
            return LADDER[-1], "the largest"

    doc = {"prompts": [{"id": "7", "prompt_ids": [1, 2], "decodes": {"W5N3G5": {"steps": [[3]], "S": 1.0}}}]}
    row = replay.Replay(None, doc, {1: 0, 2: 1, 3: 2}, tuner=Choosing()).decode(doc["prompts"][0], "auto")
    assert row == {"id": "7", "decoder": "auto", "config": LADDER[-1].name, "skipped": "not recorded"}
    summary = replay.summarize([row], ["auto"])
    assert summary == []

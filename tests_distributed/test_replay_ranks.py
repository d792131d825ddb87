"""Replayed decodes on two ranks (tools/replay.py under torchrun, gloo): a recording made on two
ranks replays on a random-weight model of another shape with the recorded steps and acceptances,
each rank's share within the bucket of an even share (lp/decode/shares.py)."""

from __future__ import annotations

import json

from _launch import torchrun
from helpers import save_word_model

P = 2
PROMPTS = ["w5 w6 w7 w8 w5 w6 w7 w8 w5 w6", "w20 w30 w40 w20 w30 w40 w20"]
CONFIGS = "W3N3G15-L64,W5N3G5"  # 64 tokens over 2 ranks: shares cut to 32; no cap at all


def test_a_two_rank_replay_takes_the_recorded_steps(tmp_path):
    model = save_word_model(tmp_path / "model")  # a tiny Llama with a word-level tokenizer
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    recording, out = tmp_path / "recording.json", tmp_path / "out"
    common = ["tools.replay"]
    made = torchrun(
        [*common, "record", f"model={model}", "dataset=jsonl", f"prompts={prompts}", "per_category=9",
         "max_new_tokens=24", f"configs={CONFIGS}", f"out={recording}"],
        P, module=True, timeout=150,
    )  # fmt: skip
    assert made.returncode == 0, made.describe()
    assert json.loads(recording.read_text())["world_size"] == P
    ran = torchrun(
        [*common, "run", "arch=tiny", "device=cpu", f"recording={recording}", f"decoders=ar,{CONFIGS}",
         "warmup_tokens=4", f"out={out}"],
        P, module=True, timeout=150,
    )  # fmt: skip
    assert ran.returncode == 0, ran.describe()
    r = json.loads((out / "replay.json").read_text())
    assert r["world_size"] == P and len(r["rows"]) == 3 * len(PROMPTS)
    for row in r["rows"]:
        assert row["same_steps"] and row["identical"] is (None if row["config"] == "ar" else True), row
        assert row["S"] == row["recorded_S"] or row["config"] == "ar"
        if row["config"] == "W3N3G15-L64":
            assert row["fed_max"] <= 32
    assert any(row["S"] > 1.2 for row in r["rows"]), "no replayed step accepted a draft: a weak test"

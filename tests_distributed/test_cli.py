"""`torchrun --nproc_per_node P -m lp.generate ... out=FILE`: rank 0 alone writes the JSONL,
one line per prompt with the contract fields (docs/design.md section 5), world_size == P, and the
output is transformers' greedy output."""

from __future__ import annotations

import json
import math
import re

from _launch import torchrun
from helpers import OUTPUT_FIELDS as FIELDS
from helpers import load, reference_greedy

P = 2
PROMPTS = [
    {"id": "a", "prompt": "The cat sat on the mat. The cat sat on the mat. The cat"},
    {"question_id": 7, "category": "demo", "turns": ["Count: one two three one two three one two", "unused"]},
]
MAX_NEW = 24


def test_rank0_alone_writes_the_contract_jsonl(tiny_text_model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    # Every rank resolves `out` with its own RANK: a rank other than 0 that wrote would leave a file.
    out_pattern = str(tmp_path / "out_rank${oc.env:RANK}.jsonl")
    launch = torchrun(
        [
            "lp.generate",
            f"model.name={tiny_text_model}",
            f"prompts={prompts}",
            "chat=false",
            "W=5",
            "N=3",
            "G=5",
            f"max_new_tokens={MAX_NEW}",
            f"out={out_pattern}",
            "timeout_s=60",
        ],
        P,
        module=True,
        timeout=120,
    )
    assert launch.returncode == 0, launch.describe()
    written = sorted(p.name for p in tmp_path.glob("out_rank*"))
    assert written == ["out_rank0.jsonl"], f"output files written: {written}"

    lines = (tmp_path / "out_rank0.jsonl").read_text().splitlines()
    assert len(lines) == len(PROMPTS), lines
    rows = [json.loads(line) for line in lines]
    assert [r["id"] for r in rows] == ["a", 7]

    model = load(tiny_text_model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_text_model)
    for row, src in zip(rows, PROMPTS):
        missing = [f for f in FIELDS if f not in row]
        assert not missing, f"missing fields {missing} in {sorted(row)}"
        text = src.get("prompt") or src["turns"][0]
        assert row["prompt_ids"] == tok(text)["input_ids"]
        assert row["world_size"] == P
        assert (row["W"], row["N"], row["G"], row["mode"]) == (5, 3, 5, "lookahead")
        assert all(isinstance(t, int) for t in row["output_ids"])
        assert row["new_tokens"] == len(row["output_ids"]) == MAX_NEW
        assert 1 <= row["steps"] <= row["new_tokens"]
        assert math.isclose(row["S"], row["new_tokens"] / row["steps"], rel_tol=1e-6)
        assert row["seconds"] > 0
        assert math.isclose(row["tokens_per_s"], row["new_tokens"] / row["seconds"], rel_tol=1e-6)
        assert row["text"] == tok.decode(row["output_ids"], skip_special_tokens=True)
        assert row["output_ids"] == reference_greedy(model, row["prompt_ids"], MAX_NEW)

    # Only rank 0 prints results: each generated text, then a `[id] N tokens in ...` summary line
    # (with the layout that tp=auto chose, when it made tensor-parallel replicas).
    summaries = re.findall(
        r"^\[(\w+)\] \d+ tokens in \d+ steps, S=.*; lookahead W=5 N=3 G=5, 2 ranks( \(1 replica x tp=2\))?$",
        launch.ranks[0].stdout,
        re.M,
    )
    assert [s for s, _ in summaries] == ["a", "7"], launch.describe()
    for r in launch.ranks[1:]:
        assert "tokens in" not in r.stdout, f"rank {r.rank} printed results:\n{r.stdout}"
    # No third-party progress bars (transformers' "Loading weights") on any rank.
    assert not any("Loading weights" in r.stderr for r in launch.ranks), launch.describe()

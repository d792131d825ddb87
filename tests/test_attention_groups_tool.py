"""tools.attention_groups: both groupings timed on the same steps, named in its table."""

from __future__ import annotations

from helpers import build_tiny

from lp.worker import Worker
from tools.attention_groups import GROUPINGS, markdown, measure


def test_both_groupings_are_timed_on_the_same_steps():
    worker = Worker(build_tiny("llama"), graphs=False)
    row = measure(worker, [5, 60, 7], 4, reps=1)
    assert row["contexts"] == [5, 60, 7, 5] and worker.kv.pool.lendable == worker.kv.pool.pages - 1  # pages back
    for step in ("plain", "a node on every other"):
        assert set(row[step]) == set(GROUPINGS) and all(ms > 0 for ms in row[step].values())
    doc = {"command": "c", "device": "d", "date": "t", "model": "m", "call_pages": 64, "reps": 1, "mixes": {"x": [row]}}
    text = markdown(doc)
    assert "| x | 4 | plain |" in text and "| x | 4 | a node on every other |" in text

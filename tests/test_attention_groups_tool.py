"""tools.attention_groups: every grouping timed on the same steps, its groups counted, named in
its table."""

from __future__ import annotations

from helpers import build_tiny

from lp.worker import Worker
from tools.attention_groups import GROUPINGS, NEVER, markdown, measure


def test_each_grouping_is_timed_on_the_same_steps():
    worker = Worker(build_tiny("llama"), graphs=False)
    # a group priced at no page splits the long sequence from the short ones; never, one group
    row = measure(worker, [5, 60, 7], 4, reps=1, groupings={"by size and length": 0, "by size alone": NEVER})
    assert row["contexts"] == [5, 60, 7, 5] and worker.kv.pool.lendable == worker.kv.pool.pages - 1  # pages back
    assert row["groups"] == {"by size and length": 2, "by size alone": 1}
    for step in ("plain", "a node on every other"):
        assert set(row[step]) == set(GROUPINGS) and all(ms > 0 for ms in row[step].values())
    doc = {"command": "c", "device": "d", "date": "t", "model": "m", "call_pages": 64, "reps": 1, "mixes": {"x": [row]}}
    text = markdown(doc)
    assert "| x | 4 | plain |" in text and text.count("| 2 / 1 |") == 2

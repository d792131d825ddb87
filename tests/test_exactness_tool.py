"""tools.exactness: a run's results against another run's (`--same-steps`)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.exactness import same_steps


def write_run(d: Path, rows: list[dict]) -> Path:
    (d / "raw").mkdir(parents=True)
    (d / "raw" / "ws1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def row(key: str, accepted: list[int], world_size: int = 1) -> dict:
    out = list(range(sum(accepted)))
    return dict(key=key, config="W3N3G3", question_id=int(key), world_size=world_size, output_ids=out,
                steps=len(accepted), accepted_per_step=accepted)  # fmt: skip


def test_same_steps_finds_a_changed_acceptance_and_a_missing_base(tmp_path):
    base = write_run(tmp_path / "base", [row("1", [2, 1]), row("2", [1, 1, 1])])
    same = write_run(tmp_path / "same", [row("1", [2, 1]), row("2", [1, 1, 1])])
    assert same_steps(same, base) == {"base": str(base), "same": 2, "total": 2, "differ": []}
    # the same output in other steps (3 = 1 + 2 instead of 2 + 1), and a prompt the base lacks
    other = write_run(tmp_path / "other", [row("1", [1, 2]), row("2", [1, 1, 1]), row("3", [1])])
    got = same_steps(other, base)
    assert got["same"] == 1 and got["total"] == 3
    assert got["differ"] == [
        {"question_id": 1, "world_size": 1, "fields": ["accepted_per_step"]},
        {"question_id": 3, "world_size": 1, "fields": ["output_ids", "steps", "accepted_per_step"]},
    ]

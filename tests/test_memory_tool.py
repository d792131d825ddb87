"""tools.memory's warm memory: the requests that teach it are none of the measured ones."""

import pytest

from lp.bench import datasets
from tools.memory import warm_prompts


def test_the_warming_requests_are_none_of_the_measured_prompts():
    if not datasets.SPEC_BENCH.is_file():
        pytest.skip("Spec-Bench not present")
    every = datasets.load("spec_bench")
    measured = {p.text for p in datasets.load("spec_bench", per_category=8)}  # the `spec` workload's
    mt_bench = [p.text for p in every if p.category == "mt_bench"]  # `mt2` takes its first 24
    unmeasured = len(every) - 5 * 8 - 24
    warm = warm_prompts(unmeasured, measured=8, mt=24)
    assert len(set(warm)) == len(warm) == unmeasured
    assert not set(warm) & (measured | set(mt_bench[:24]))
    groups = {p.text: p.category for p in every}
    assert [groups[t] for t in warm[:6]] == list(datasets.SPEC_BENCH_GROUPS)  # round robin: a few cover all
    with pytest.raises(SystemExit, match="no workload measures"):
        warm_prompts(unmeasured + 1, measured=8, mt=24)


def test_a_warm_memory_is_reused_only_when_the_same_requests_taught_it(tmp_path):
    from types import SimpleNamespace

    from tools.memory import warm_memory

    warmed = []

    def stream(prompts, **settings):
        warmed.append(list(prompts))
        return iter(prompts)

    lm = SimpleNamespace(
        clear_memory=lambda: None,
        stream=stream,
        save_memory=lambda path: path.write_bytes(b"memory"),
        load_memory=lambda path: None,
        memory=SimpleNamespace(tokens=0),
    )
    path = tmp_path / "warm_memory.lp"
    warm_memory(lm, ["a", "b"], 8, path)
    warm_memory(lm, ["a", "b"], 8, path)  # the saved one
    warm_memory(lm, ["a", "c"], 8, path)  # other requests: warmed again
    warm_memory(lm, ["a", "c"], 16, path)  # longer answers: again
    assert warmed == [["a", "b"], ["a", "c"], ["a", "c"]]


def _decode(steps: int) -> dict:
    return {"tokens": 100, "steps": steps, "seconds": 1.0, "host_s": [1e-3]}


def test_the_memory_is_judged_against_the_noise_of_neutral_changes(tmp_path):
    from tools.memory import markdown, plot, prompts_detail, summary

    # (steps without, with, and at the two neutral changes) of 20 prompts: 0 slowed by more than
    # any neutral change moved a prompt; 1 as much as its own change moved it (within its noise);
    # 5 and 6 slowed less than the pooled 5th percentile but where their own changes cost nothing
    # (6's sped up: a prompt's own noise is never above 1); 7 faster with the memory, its own
    # changes faster still (not slowed at all)
    rows = [
        {"without": _decode(a), "with": _decode(b), "noise": [_decode(c), _decode(d)], "identical": True}
        for a, b, c, d in [
            (20, 24, 20, 20),
            (20, 21, 21, 20),
            (20, 18, 24, 20),
            (20, 18, 22, 20),
            (20, 18, 21, 19),
            (40, 41, 40, 40),
            (20, 21, 19, 19),
            (20, 19, 18, 18),
        ]
        + [(20, 18, 20, 20)] * 12
    ]
    s = summary(rows)
    assert s["S_neighbours"] == [2000 / 425, 2000 / 416]
    assert s["noise_ratio_min"] == 20 / 24
    assert s["noise_ratio_p5"] == 20 / 21  # the 3rd lowest of 40 ratios: 20/24, 20/22, then 20/21 twice
    assert s["prompts_more_steps_with"] == 4  # 0, 1, 5, 6
    assert s["prompts_slower_beyond_p5"] == 1  # 0 (1 is at it, 5 and 6 above it)
    assert s["prompts_slower_beyond_own"] == 3  # 0, 5, 6
    detail = prompts_detail(rows)
    doc = {"results": [{"shape": "W3N3G15-L128-D14", "workload": "spec", **s, "prompts_detail": detail}]}
    doc |= {"command": "c", "device": "d", "date": "t", "model": "m", "max_new_tokens": 8, "budget_tokens": 64}
    assert (
        "more steps with the memory: 4; below that 5th percentile: 1; below both of their own neutral ratios: 3"
        in markdown(doc)
    )
    plot(doc, tmp_path / "memory.png")
    assert (tmp_path / "memory.png").stat().st_size > 0
    without = summary([{k: v for k, v in r.items() if k != "noise"} for r in rows])  # no --noise
    assert "noise_ratio_p5" not in without and without["ratio"] == s["ratio"]

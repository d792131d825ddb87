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


def test_the_texts_ceiling_is_the_longest_right_continuation_the_memory_holds():
    import numpy as np

    from tools.memory_ceiling import reach, short_steps, steps_with

    empty = np.zeros(0, np.int64)
    # the memory holds one text, 5 6 7 8, then its end (-1); the decode's prompt ends 5 6
    texts = [np.array([5, 6, 7, 8, -1]), empty]
    # after 5 6 the text goes on 7 8 (then its end: not 9); after 6 7, 8; after 7 8 and 8 9, nothing
    assert reach(texts, [1, 5, 6], [7, 8, 9, 7], depth=14) == [2, 1, 0, 0]
    assert reach(texts, [1, 5, 6], [7, 8, 9, 7], depth=1) == [1, 1, 0, 0]  # no further than a draft's depth
    assert reach(texts, [1, 5, 6], [7, 9, 9, 7], depth=14) == [1, 0, 0, 0]  # 7 right, 8 not the output's 9
    assert reach([empty, empty], [5, 6], [7, 8], depth=14) == [0, 0]
    # a text's end stops a continuation where the next text would run on (5 6 7, then 8 9); the
    # newer generation is searched too (7 8 9)
    older, newer = np.array([5, 6, 7, -1]), np.array([8, 9, -1, 7, 8, 9, -1])
    assert reach([older, newer], [5, 6], [7, 8, 9], depth=14) == [1, 0, 1]
    rc = [2, 1, 0, 0]
    assert steps_with([1, 1, 1, 1], rc) == 2  # the first step commits 7 8 9 (7 8 from the texts), the next 7
    assert short_steps([1, 1, 1, 1], rc) == 2  # the steps at 0 and 1 accepted nothing the texts held
    assert steps_with([4], rc) == short_steps([4], rc) + 1 == 1  # the course's own step went further
    assert steps_with([1, 3], rc) == 2  # from position 3 the course's step still accepts nothing more
    assert steps_with([1, 3], [0, 0, 0, 0]) == 2  # with nothing from the texts, the course as it was
    # the texts take the first step to position 2, mid-way through the course's second step, whose
    # last two tokens it is credited
    assert steps_with([1, 3, 1], [1, 0, 0, 0, 0]) == 3


def test_the_ceiling_is_summed_over_the_workload():
    from tools.memory import summary

    rows = [
        {
            "without": _decode(50),
            "with": _decode(40),
            "ceiling": {"without": 45, "with": 38, "short": 3},
            "identical": True,
        },
        {
            "without": _decode(50),
            "with": _decode(50),
            "ceiling": {"without": 50, "with": 50, "short": 0},
            "identical": True,
        },
    ]
    s = summary(rows)
    assert s["texts_ceiling_S"] == {"without": 200 / 95, "with": 200 / 88}
    assert s["texts_ceiling_ratio"]["without"] == 100 / 95
    assert s["texts_ceiling_ratio"]["with"] == 100 / 88
    assert s["texts_short_steps"] == {"steps": 3, "of": 90}

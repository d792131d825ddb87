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

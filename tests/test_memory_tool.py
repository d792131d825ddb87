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

"""Lossless sampling under Lookahead Parallelism: with 2 gloo ranks, lp's lookahead samples
follow the model's exact distribution of the first tokens (false-alarm rate ALPHA), with pool
and text drafts and with recycled ones, and an always-accept rule is caught by the same test."""

import json

import pytest
from _launch import spawn_ranks  # tests_distributed/conftest.py puts this folder on sys.path
from helpers import RECYCLED, SAMPLING, chi_square_pvalue, peaked_llama, settings_distribution

ALPHA = 1e-3
SAMPLES = 1200
RANK_PROGRAM = "tests_distributed/_sampling_rank.py"


@pytest.fixture(scope="module")
def expected():
    model, prompt = peaked_llama()
    return settings_distribution(model, prompt, SAMPLING)


@pytest.fixture(scope="module")
def expected_recycled():
    model, prompt = peaked_llama()
    return settings_distribution(model, prompt, {**SAMPLING, **RECYCLED})


@pytest.fixture(scope="module")
def expected_two_kv_heads():
    model, prompt = peaked_llama(kv_heads=2)
    return settings_distribution(model, prompt, SAMPLING)


def _samples(tmp_path, *extra: str) -> dict:
    out = tmp_path / "samples.json"
    run = spawn_ranks([RANK_PROGRAM, str(out), str(SAMPLES), *extra], 2, timeout=240)
    assert out.exists(), run.describe()
    return json.loads(out.read_text())


def test_lp_sampling_matches_the_model(tmp_path, expected):
    result = _samples(tmp_path)
    assert result["world_size"] == 2
    assert result["multi"] > 0.3, "drafts were rarely accepted: the test would be weak"
    assert chi_square_pvalue([tuple(s) for s in result["samples"]], expected) > ALPHA


def test_lp_sampling_with_recycled_drafts_matches_the_model(tmp_path, expected_recycled):
    """Drafts from the successor table, whose rows both ranks gather from each other."""
    result = _samples(tmp_path, "recycled")
    assert result["multi"] > 0.3, "recycled drafts were rarely accepted: the test would be weak"
    assert chi_square_pvalue([tuple(s) for s in result["samples"]], expected_recycled) > ALPHA


def test_lp_wrong_rule_is_caught(tmp_path, expected):
    result = _samples(tmp_path, "wrong")
    assert chi_square_pvalue([tuple(s) for s in result["samples"]], expected) < ALPHA


def test_tp_sampling_matches_the_model(tmp_path, expected_two_kv_heads):
    """The 2 ranks are one tensor-parallel replica (tp=2), each with half the heads and MLP."""
    result = _samples(tmp_path, "tp")
    assert result["multi"] > 0.3, "drafts were rarely accepted: the test would be weak"
    assert chi_square_pvalue([tuple(s) for s in result["samples"]], expected_two_kv_heads) > ALPHA

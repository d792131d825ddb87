"""Lossless sampling end to end (paper Algorithm 4): lp's lookahead samples, alone and inside a batch
of many sequences, lp's autoregressive samples and transformers' samples all follow the exact
distribution of the first tokens, and a wrong acceptance rule is caught by the same test. Each
test has a false-alarm rate of ALPHA."""

import pytest
import torch
from helpers import RECYCLED, SAMPLING, chi_square_pvalue, follow_first_drafts, peaked_llama, settings_distribution

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.loop import Decoder, Request
from lp.verify.verifier import SamplingVerifier
from lp.worker import Worker

ALPHA = 1e-3
SAMPLES = 1500


@pytest.fixture(scope="module")
def built():
    return peaked_llama()


@pytest.fixture(scope="module")
def model(built):
    return built[0]


@pytest.fixture(scope="module")
def prompt(built):
    return built[1]


@pytest.fixture(scope="module")
def expected(model, prompt):
    return settings_distribution(model, prompt, SAMPLING)


@pytest.fixture(scope="module")
def expected_recycled(model, prompt):
    return settings_distribution(model, prompt, {**SAMPLING, **RECYCLED})


def _lp_samples(model, prompt, rule=None, **overrides) -> tuple[list[tuple[int, ...]], float]:
    """SAMPLES decodes, stream i each (`rule`: a walk below the first token instead of Algorithm 4's),
    and the share of them in which some step accepted a draft."""
    dec = Decoder(Worker(model), Collective(), set(), 128)
    cfg = DecodeConfig(**{**SAMPLING, **overrides})
    samples, multi = [], 0
    for i in range(SAMPLES):
        verifier = SamplingVerifier(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed, i, rule) if rule else None
        g = dec.generate(prompt, cfg, stream=i, verifier=verifier)
        samples.append(tuple(g.output_ids))
        multi += max(g.accepted_per_step) > 1
    return samples, multi / SAMPLES


def test_lookahead_sampling_matches_the_model(model, prompt, expected):
    samples, multi = _lp_samples(model, prompt)
    assert multi > 0.3, f"drafts accepted in only {multi:.0%} of the decodes: the test would be weak"
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_sampling_inside_a_batch_matches_the_model(model, prompt, expected):
    """The same decodes 16 at a time beside greedy ones, each sampled sequence joining as another
    ends (lp/decode/batch.py): each keeps its own stream, and together the model's distribution."""
    dec = Decoder(Worker(model), Collective(), set(), 128)
    cfg = DecodeConfig(**SAMPLING)
    greedy = DecodeConfig(**{**SAMPLING, "temperature": 0.0})
    requests = []
    for i in range(SAMPLES):
        requests.append(Request(prompt, cfg, stream=i, tag=i))
        if i % 8 == 0:  # a greedy sequence among every eight sampled ones
            requests.append(Request(prompt, greedy, tag=-1))
    samples, multi = [], 0
    for seq in dec.run(requests, dec.batch(16)):
        if seq.request.tag >= 0:
            samples.append(tuple(seq.result.output_ids))
            multi += max(seq.result.accepted_per_step) > 1
    assert len(samples) == SAMPLES and multi > 0.3 * SAMPLES
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_sampling_with_recycled_drafts_matches_the_model(model, prompt, expected_recycled):
    samples, multi = _lp_samples(model, prompt, **RECYCLED)
    assert multi > 0.3, f"recycled drafts accepted in only {multi:.0%} of the decodes: the test would be weak"
    assert chi_square_pvalue(samples, expected_recycled) > ALPHA


def test_accepting_recycled_drafts_always_is_caught(model, prompt, expected_recycled):
    samples, _ = _lp_samples(model, prompt, rule=_accept_always, **RECYCLED)
    assert chi_square_pvalue(samples, expected_recycled) < ALPHA


def test_autoregressive_sampling_matches_the_model(model, prompt, expected):
    samples, _ = _lp_samples(model, prompt, mode="ar")
    assert chi_square_pvalue(samples, expected) > ALPHA


def test_transformers_sampling_matches_the_model(model, prompt, expected):
    torch.manual_seed(0)
    out = model.generate(
        torch.tensor([prompt] * SAMPLES),
        do_sample=True,
        max_new_tokens=SAMPLING["max_new_tokens"],
        temperature=SAMPLING["temperature"],
        top_k=SAMPLING["top_k"],
        top_p=1.0,
        attention_mask=torch.ones(SAMPLES, len(prompt), dtype=torch.long),
    )
    samples = [tuple(row) for row in out[:, len(prompt) :].tolist()]
    assert chi_square_pvalue(samples, expected) > ALPHA


def _accept_always(first_token, tree, p_nodes, u, max_commit):
    return follow_first_drafts(first_token, tree, p_nodes, max_commit)


def test_accepting_drafts_always_is_caught(model, prompt, expected):
    samples, _ = _lp_samples(model, prompt, rule=_accept_always)
    assert chi_square_pvalue(samples, expected) < ALPHA


def test_same_seed_same_samples(model, prompt):
    dec = Decoder(Worker(model), Collective(), set(), 128)
    cfg = DecodeConfig(**{**SAMPLING, "max_new_tokens": 12})
    runs = [dec.generate(prompt, cfg, stream=5).output_ids for _ in range(2)]
    other = [dec.generate(prompt, cfg, stream=s).output_ids for s in range(6, 12)]
    assert runs[0] == runs[1]
    assert any(o != runs[0] for o in other)

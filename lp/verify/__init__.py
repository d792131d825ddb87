"""The verification branch: accept pool n-grams that match what the model predicts
(greedy, Algorithm 3) or that it would sample (Algorithm 4)."""

from lp.verify.greedy import Acceptance, greedy_accept
from lp.verify.sampling import sample_continue, sample_first_level
from lp.verify.verifier import GreedyVerifier, SamplingVerifier, StepRows, Verifier, verifier_for

__all__ = [
    "Acceptance",
    "GreedyVerifier",
    "SamplingVerifier",
    "StepRows",
    "Verifier",
    "greedy_accept",
    "sample_continue",
    "sample_first_level",
    "verifier_for",
]

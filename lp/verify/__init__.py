"""The verification branch: accept pool n-grams that match what the model predicts
(greedy, Algorithm 3) or that it would sample (Algorithm 4)."""
from lp.verify.greedy import Acceptance, greedy_accept
from lp.verify.sampling import alive_after, sample_accept, sample_continue, sample_first_level

__all__ = ["Acceptance", "alive_after", "greedy_accept", "sample_accept", "sample_continue", "sample_first_level"]

"""The verification branch: accept pool n-grams that match what the model predicts."""
from lp.verify.greedy import Acceptance, greedy_accept

__all__ = ["Acceptance", "greedy_accept"]

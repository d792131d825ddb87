"""The lookahead branch: the 2D Jacobi window, the n-gram pool and the layout/mask of one step."""

from lp.lookahead.mask import StepLayout, step_layout
from lp.lookahead.pool import NGramPool
from lp.lookahead.window import JacobiWindow

__all__ = ["JacobiWindow", "NGramPool", "StepLayout", "step_layout"]

"""The 2D Jacobi window of the lookahead branch (W columns x N-1 rows of the trajectory)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class JacobiWindow:
    """Guesses anchored at the current input token x0 (at position t).

    `rows[0, j]` (j >= 1) guesses position t+j, `rows[l, j]` (1 <= l <= N-2) guesses position
    t+l+j; `rows[0, 0]` stands for x0 itself and is never read. Column j is the chain
    x0, rows[0, 1..j], rows[1, j], ..., rows[N-2, j]; its last token predicts `new[j]` for
    position t+j+N-1, which closes the n-gram (x0 or rows[0, j], rows[1, j], ..., new[j]).
    """

    def __init__(self, W: int, N: int, prompt: Sequence[int], seed: int) -> None:
        self.W, self.N = W, N
        # Jacobi iteration converges from any start; prompt tokens are a better start than noise.
        rng = np.random.default_rng(seed)
        self.rows = rng.choice(np.asarray(prompt, dtype=np.int64), size=(N - 1, W))
        self.updates = 0

    @property
    def ready(self) -> bool:
        """True once every level above row 0 comes from a Jacobi step, not from the random start
        (N-2 updates): only then are the window's n-grams worth pooling."""
        return self.ready_after(0)

    def ready_after(self, updates: int) -> bool:
        """Whether the window is `ready` once `updates` more updates are made."""
        return self.updates + updates >= self.N - 2

    def update(self, new: np.ndarray) -> None:
        """Advance one Jacobi iteration: drop the oldest level, append `new`, re-anchor at the
        next input token (row 0 takes level 1 shifted by one position)."""
        self.rows[:-1] = self.rows[1:]  # in place: numpy copies overlapping rows correctly
        self.rows[-1] = new
        self.updates += 1

"""The 2D Jacobi window of the lookahead branch (W columns x N-1 rows of the trajectory).

Guesses anchored at the current input token x0 (at position t): `rows[0, j]` (j >= 1) guesses
position t+j, `rows[l, j]` (1 <= l <= N-2) guesses position t+l+j; `rows[0, 0]` stands for x0
itself and is never read. Column j is the chain x0, rows[0, 1..j], rows[1, j], ..., rows[N-2, j];
its last token predicts `new[j]` for position t+j+N-1, which closes the n-gram (x0 or rows[0, j],
rows[1, j], ..., new[j]). A window of W = 0 columns is none (plain decoding, no window)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba.experimental import structref

from lp.jit import State, compiled


@structref.register
class JacobiWindowType(State):
    pass


class JacobiWindow(structref.StructRefProxy):
    """W columns of N - 1 levels, and the Jacobi steps taken (`updates`)."""

    def __new__(cls, W: int, N: int, prompt: Sequence[int], seed: int) -> JacobiWindow:
        # Jacobi iteration converges from any start; prompt tokens are a better start than noise
        rng = np.random.default_rng(seed)
        rows = rng.choice(np.asarray(prompt, dtype=np.int64), size=(N - 1, W)) if W else np.zeros((N - 1, 0), np.int64)
        return _new(rows.astype(np.int64))

    @property
    def rows(self) -> np.ndarray:
        return _rows(self)

    def update(self, new: np.ndarray) -> None:
        update(self, np.asarray(new, dtype=np.int64))

    @property
    def ready(self) -> bool:
        return ready(self, 0)


structref.define_proxy(JacobiWindow, JacobiWindowType, ["rows", "updates"])


@compiled
def _new(rows: np.ndarray) -> JacobiWindow:
    return JacobiWindow(rows, 0)


@compiled
def ready(window: JacobiWindow, more: int) -> bool:
    """Whether every level above row 0 comes from a Jacobi step, not from the random start (N-2
    updates), once `more` more updates are made: only then are the window's n-grams worth
    pooling, and its row 0 worth drafting."""
    return window.updates + more >= window.rows.shape[0] - 1


@compiled
def update(window: JacobiWindow, new: np.ndarray) -> None:
    """Advance one Jacobi iteration: drop the oldest level, append `new`, re-anchor at the next
    input token (row 0 takes level 1 shifted by one position)."""
    rows = window.rows
    levels = rows.shape[0]
    for level in range(levels - 1):
        rows[level, :] = rows[level + 1, :]
    rows[levels - 1, :] = new
    window.updates += 1


@compiled
def _rows(window: JacobiWindow) -> np.ndarray:
    return window.rows.copy()


__all__ = ["JacobiWindow", "ready", "update"]

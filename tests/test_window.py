"""The 2D Jacobi window: seeded start, warm-up and update (the n-grams it closes: tests/test_observe.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lp.lookahead.window import JacobiWindow

PROMPT = [11, 12, 13, 14, 15, 16, 17]


@pytest.mark.parametrize("W,N", [(1, 2), (5, 2), (3, 3), (7, 5), (15, 5), (4, 7)])
def test_init_shape_drawn_from_prompt_and_reproducible(W, N):
    win = JacobiWindow(W, N, PROMPT, seed=3)
    assert win.rows.shape == (N - 1, W)
    assert set(win.rows.ravel().tolist()) <= set(PROMPT)
    again = JacobiWindow(W, N, PROMPT, seed=3)
    assert np.array_equal(win.rows, again.rows)
    assert win.ready == (N == 2)


def test_seed_changes_the_start():
    starts = {JacobiWindow(7, 5, list(range(100)), seed=s).rows.tobytes() for s in range(5)}
    assert len(starts) == 5


def test_single_token_prompt():
    win = JacobiWindow(4, 3, [42], seed=0)
    assert (win.rows == 42).all()


@pytest.mark.parametrize("N", [2, 3, 4, 5, 7])
def test_ready_after_n_minus_2_updates(N):
    W = 4
    win = JacobiWindow(W, N, PROMPT, seed=0)
    for u in range(N + 2):
        assert win.ready == (u >= N - 2), (N, u)
        win.update(np.full(W, 100 + u))


def test_n2_ready_at_once():
    assert JacobiWindow(5, 2, PROMPT, seed=0).ready


@pytest.mark.parametrize("W,N", [(1, 2), (5, 2), (3, 3), (5, 4), (7, 5)])
def test_update_shifts_levels(W, N):
    win = JacobiWindow(W, N, PROMPT, seed=1)
    for step in range(N + 1):
        old = win.rows.copy()
        new = np.arange(W, dtype=np.int64) + 1000 * (step + 1)
        win.update(new)
        assert win.rows.shape == (N - 1, W)
        expect = np.concatenate([old[1:], new[None, :]], axis=0)
        assert np.array_equal(win.rows, expect)
    # after N-1 updates every row comes from `new`s: row l holds the (l+1)-th latest update
    for lvl in range(N - 1):
        assert win.rows[lvl, 0] == 1000 * (N + 1 - (N - 2 - lvl))

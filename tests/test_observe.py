"""The drafter's per-step work (lp/decode/drafter.py: its first plan, then before and after each
read), against the plain reference (tests/reference_observe.py: each source fed by its own call,
each tree grown in Python, each step planned by `plan_step`): random configurations and messages,
every step's tree, plans, layout and ids, committed tokens and the sources' state equal."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from lp.config import DecodeConfig
from lp.decode.drafter import Drafter
from lp.decode.plan import Split, StepPlan, next_pending, plan_step
from lp.errors import LPError
from lp.lookahead.tree import DraftTree
from lp.lookahead.window import JacobiWindow
from lp.message import HEADER, step_message_size
from tests.reference_observe import PlainSources


def random_config(rng: np.random.Generator) -> DecodeConfig:
    W, N = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    fixed = 1 + (W - 1) + (N - 2) * W  # x0 and the window's tokens: a step's size leaves the tree more
    return DecodeConfig(
        mode="ar" if not rng.integers(8) else "lookahead",
        tree=bool(rng.integers(5)),
        W=W,
        N=N,
        G=int(rng.integers(0, 6)),
        tree_tokens=int(rng.integers(0, 30)) if rng.integers(2) else None,
        drafts=str(rng.choice(["pool", "pool+text"])),
        pool_order=str(rng.choice(["recent", "frequent", "context"])),
        draft_len=int(rng.integers(1, 8)),
        text_drafts=int(rng.integers(1, 5)),
        lone_matches=bool(rng.integers(2)),
        successors=int(rng.choice([0, 2, 4])),
        pool_from_output=bool(rng.integers(4)),
        step_tokens=fixed + int(rng.integers(1, 30)) if rng.integers(2) else None,
        continuation_len=int(rng.choice([0, 3])),
        max_new_tokens=200,
    ).validate()


def rank_messages(
    rng: np.random.Generator, cfg: DecodeConfig, step: StepPlan, vocab: int, state: tuple[int, int]
) -> np.ndarray:
    """Every rank's message for `step` (`[P, K]`, its shares the rows of `step.bounds`, counting
    nodes in `step.order` where it has one): one random rank accepts the path to a random one of
    its own nodes (or none does); each sends random new tokens for its columns and random
    successor rows for its x0, columns and own nodes."""
    W, k, tree = cfg.step_shape[0], cfg.successors_sent, step.tree
    order = step.order.tolist() or list(range(tree.size))
    start = HEADER + cfg.max_commit
    out = np.full((len(step.bounds), step_message_size(cfg)), -1, dtype=np.int64)
    out[:, 0], out[:, 3], out[:, 4] = rng.integers(vocab), *state
    winner = int(rng.integers(len(step.bounds)))
    for r, (a, b, c, d) in enumerate(step.bounds.tolist()):
        if r == winner and d > c and rng.integers(4):
            mine = int(rng.integers(c, d))
            path = [order[mine]]  # its ancestors: the rank's, or fed again to it
            while tree.parents[path[-1]] >= 0:
                path.append(tree.parents[path[-1]])
            tokens = [int(tree.tokens[v]) for v in reversed(path)]
            out[r, 1], out[r, 2] = mine, len(tokens)
            out[r, HEADER : HEADER + len(tokens) + 1] = [*tokens, out[r, 0]]
        out[r, start : start + b - a] = rng.integers(0, vocab, b - a)
        if k:
            rows = (1 + (b - a) + (d - c)) * (1 + k)
            out[r, start + W : start + W + rows] = rng.integers(0, vocab, rows)
    return out


def same_sources(drafter: Drafter, plain: PlainSources) -> None:
    """The drafter's sources (after its before_read: rows written, queues flushed) as the plain ones."""
    a, b = drafter, plain
    assert a.text.tokens.tolist() == b.text.tokens.tolist()
    assert a.text.drafts(8, 8) == b.text.drafts(8, 8)
    b.pool.flush()
    assert all(a.pool.lookup(key) == b.pool.lookup(key) for key in range(-1, 16))
    assert np.array_equal(a.window.rows, b.window.rows) and a.window.ready == b.window.ready
    assert np.array_equal(a.rates.hits, b.rates.hits) and np.array_equal(a.rates.offered, b.rates.offered)
    assert np.array_equal(a.rates.chances, b.rates.chances)
    if plain.k:
        ta, tb = a.table, b.table
        assert [ta.row(x, y) for x in range(-1, 16) for y in range(16)] == [
            tb.row(x, y) for x in range(-1, 16) for y in range(16)
        ]
        assert np.array_equal(ta.hits, tb.hits) and ta.n_pairs == tb.n_pairs


def same_step(a: StepPlan, b: StepPlan) -> None:
    assert a.tree.tokens.tolist() == b.tree.tokens.tolist() and a.tree.parents == b.tree.parents
    assert a.plans == b.plans and a.layout.key == b.layout.key and np.array_equal(a.bounds, b.bounds)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.layout.mask, b.layout.mask)
    assert np.array_equal(a.layout.logit_rows, b.layout.logit_rows) and np.array_equal(a.layout.depth, b.layout.depth)
    # a CPU worker's tensors share these arrays' memory
    arrays = (a.ids, a.layout.mask, a.layout.depth, a.layout.logit_rows, a.layout.parents, a.tree.parent_array)
    assert all(x.flags.writeable for x in arrays)


def decode(seed: int, P: int, rank: int, steps: int, rehearse: bool = False) -> int:
    """`steps` steps of a random config and prompt by the drafter and by the plain reference, on
    random messages of P ranks: each plan, outcome and the sources after it equal. The steps that
    ended a decode (the next one planned anew, as the next decode of these sources would)."""
    rng = np.random.default_rng(seed)
    cfg, vocab = random_config(rng), int(rng.integers(4, 16))
    prompt = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
    keep = P == 1 and bool(rng.integers(2))
    drafter, plain = Drafter(cfg, prompt, vocab, P=P, rank=rank, keep=keep), PlainSources(cfg, prompt, vocab)
    split = drafter.shape.split
    eos = {int(rng.integers(vocab))} if rng.integers(3) else set()
    eos_ids = np.array(sorted(eos), dtype=np.int64)
    pending, length, ends = [prompt[-1]], 0, 0
    step = drafter.next_step(pending)
    for _ in range(steps):
        same_step(step, plan_step(pending, plain.window.rows, plain.grow(len(pending), split), split))
        drafter.before_read(rehearse)
        same_sources(drafter, plain)
        gathered = rank_messages(rng, cfg, step, vocab, (length, 7))
        remaining = int(rng.integers(1, 8))
        tokens, stopped = drafter.after_read(gathered, step, remaining, eos_ids)
        assert (tokens, stopped) == plain.observe(gathered, step.plans, step.order, remaining, eos)
        pending, length = next_pending(tokens, keep), length + len(tokens)
        ends += stopped or len(tokens) >= remaining
        step = drafter.next_step(pending)
    return ends


@pytest.mark.parametrize("seed", range(60))
def test_the_drafters_steps_equal_the_reference(seed):
    decode(seed, 1, 0, 25)


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_the_drafters_steps_equal_the_reference_at_several_ranks(P, seed):
    decode(1000 + seed, P, seed % P, 20)


@pytest.mark.parametrize("P", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_rehearsal_changes_nothing(P, seed):
    """A rehearsed plan before each read (as a GPU's host runs it while the device computes) leaves
    the sources, the outcomes and the next steps as the reference's without one."""
    decode(2000 + seed, P, seed % P, 20, rehearse=True)


def test_ranks_that_drift_apart_are_an_error():
    cfg = DecodeConfig(W=2, N=3, G=2)
    drafter = Drafter(cfg, [1, 2, 3], 8, P=2)
    step = drafter.next_step([3])
    drafter.before_read()
    gathered = np.zeros((2, step_message_size(cfg)), dtype=np.int64)
    gathered[1, 3] = 1  # another output length
    with pytest.raises(LPError, match=r"ranks diverged: output lengths \[0, 1\]"):
        drafter.after_read(gathered, step, 8, np.zeros(0, np.int64))


@njit
def _set_window(window: JacobiWindow, rows: np.ndarray, updates: int) -> None:
    window.rows[:] = rows
    window.updates = updates


@pytest.mark.parametrize("W,N", [(1, 2), (5, 2), (3, 3), (5, 4), (7, 5)])
def test_window_ngrams_pooled_by_column(W, N):
    """The n-grams a step pools from the window: column j's x0 (j = 0) or row-0 guess, its
    levels above, then the new level's token; then the window moves up a level."""
    cfg = DecodeConfig(W=W, N=N, G=3, pool_from_output=False, successors=0, drafts="pool")
    drafter = Drafter(cfg, [7], vocab=2000)
    before, level = np.arange((N - 1) * W, dtype=np.int64).reshape(N - 1, W) + 500, np.arange(W, dtype=np.int64) + 900
    _set_window(drafter.window, before, N)  # ready
    step = drafter.next_step([7])
    drafter.before_read()
    gathered = np.full((1, step_message_size(cfg)), -1, dtype=np.int64)
    gathered[0, :5] = [1, -1, 0, 0, 0]
    gathered[0, HEADER + cfg.max_commit : HEADER + cfg.max_commit + W] = level
    assert drafter.after_read(gathered, step, 8, np.zeros(0, np.int64)) == ([1], False)
    for j in range(W):
        first = 7 if j == 0 else before[0, j]
        expect = (*(before[lvl, j] for lvl in range(1, N - 1)), level[j])
        assert expect in drafter.pool.lookup(first), (j, drafter.pool.lookup(first), expect)
    assert np.array_equal(drafter.window.rows, np.concatenate([before[1:], level[None, :]]))


def test_a_share_without_a_window_reads_no_tree_token_for_a_window_one():
    """`plan_step` without a window (tools lay out given trees) gathers zeros for the window's
    tokens and the tree's own tokens for its nodes."""
    tree = DraftTree(np.array([5, 6, 7], dtype=np.int64), (-1, 0, -1))
    step = plan_step([9], None, tree, Split(3, 3, 2, 1))
    nodes = step.plan.candidates
    assert step.ids[step.layout.node_tokens].tolist() == tree.tokens[nodes.start : nodes.stop].tolist()
    assert set(step.ids[: step.layout.node_tokens.start].tolist()) <= {0, 9}
    with pytest.raises(LPError, match="window's rows"):
        plan_step([9], JacobiWindow(2, 3, [1, 2], 0).rows, tree, Split(3, 3, 1, 0))


def test_after_read_needs_before_read_and_a_message_within_the_step():
    cfg = DecodeConfig(W=2, N=3, G=2)
    drafter = Drafter(cfg, [1, 2, 3], 8)
    step = drafter.next_step([3])
    gathered = np.zeros((1, step_message_size(cfg)), dtype=np.int64)
    with pytest.raises(LPError, match="before_read"):
        drafter.after_read(gathered, step, 8, np.zeros(0, np.int64))
    drafter.before_read()
    gathered[0, 2] = cfg.max_commit  # more accepted draft tokens than the step holds
    with pytest.raises(LPError, match="more than the step's"):
        drafter.after_read(gathered, step, 8, np.zeros(0, np.int64))

"""A step's host work after its message is read, compiled (the plan: lp/decode/plan.py
`plan_next`; the merge and the sources' update: lp/decode/policy.py `DraftSources.observe`; both
in one call: `observe_next`), against the plain reference (tests/reference_observe.py,
`DraftSources.tree`, `plan_step`) and against each other: random configurations and messages, two
twin sources fed alike, every step's tree, plans, layout and ids, committed tokens and the
sources' state equal."""

from __future__ import annotations

import numpy as np
import pytest

from lp.config import DecodeConfig
from lp.decode.plan import StepPlan, observe_next, plan_next, plan_step, rehearse
from lp.decode.policy import DraftSources
from lp.errors import LPError
from lp.lookahead import JacobiWindow
from lp.lookahead.tree import DraftTree
from lp.message import HEADER, step_message_size
from tests import reference_observe


def random_config(rng: np.random.Generator) -> DecodeConfig:
    W, N = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    fixed = 1 + (W - 1) + (N - 2) * W  # x0 and the window's tokens: a step limit leaves the tree more
    return DecodeConfig(
        mode="ar" if not rng.integers(8) else "lookahead",
        tree=bool(rng.integers(5)),
        W=W,
        N=N,
        G=int(rng.integers(0, 6)),
        budget=int(rng.integers(0, 30)) if rng.integers(2) else None,
        drafts=str(rng.choice(["pool", "pool+text"])),
        order=str(rng.choice(["recent", "frequent", "context"])),
        draft_len=int(rng.integers(1, 8)),
        text_drafts=int(rng.integers(1, 5)),
        text_match=int(rng.choice([1, 2])),
        recycle=int(rng.choice([0, 2, 4])),
        pool_from_output=bool(rng.integers(4)),
        step_limit=fixed + int(rng.integers(1, 30)) if rng.integers(2) else None,
        follow=int(rng.choice([0, 3])),
        max_new_tokens=200,
    ).validate()


def message(
    rng: np.random.Generator, cfg: DecodeConfig, step: StepPlan, vocab: int, state: tuple[int, int]
) -> np.ndarray:
    """A rank's message for `step` (one rank): a random node's path accepted (or none), random
    new window tokens and successor rows, the output's length and checksum `state`."""
    W, k, tree = cfg.step_shape[0], cfg.successors_sent, step.tree
    out = np.full(step_message_size(cfg), -1, dtype=np.int64)
    out[0], out[3], out[4] = rng.integers(vocab), *state
    if tree.size and rng.integers(4):
        node = int(rng.integers(tree.size))
        path = [node]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        tokens = [int(tree.tokens[v]) for v in reversed(path)]
        out[1], out[2] = node, len(tokens)
        out[HEADER : HEADER + len(tokens) + 1] = [*tokens, rng.integers(vocab)]
    start = HEADER + cfg.max_commit
    out[start : start + W] = rng.integers(0, vocab, W)
    if k:
        rows = 1 + W + tree.size
        out[start + W : start + W + rows * (1 + k)] = rng.integers(0, vocab, rows * (1 + k))
    return out[None, :]


def rank_messages(
    rng: np.random.Generator, cfg: DecodeConfig, step: StepPlan, vocab: int, state: tuple[int, int]
) -> np.ndarray:
    """Every rank's message for `step` (`[P, K]`, its shares the rows of `step.bounds`): one
    random rank accepts a random path of its own nodes (or none does); each sends random new
    tokens for its columns and random successor rows for its x0, columns and nodes."""
    W, k, tree = cfg.step_shape[0], cfg.successors_sent, step.tree
    start = HEADER + cfg.max_commit
    out = np.full((len(step.bounds), step_message_size(cfg)), -1, dtype=np.int64)
    out[:, 0], out[:, 3], out[:, 4] = rng.integers(vocab), *state
    winner = int(rng.integers(len(step.bounds)))
    for r, (a, b, c, d) in enumerate(step.bounds.tolist()):
        if r == winner and d > c and rng.integers(4):
            path = [int(rng.integers(c, d))]  # a rank holds whole root subtrees: the path is its own
            while tree.parents[path[-1]] >= 0:
                path.append(tree.parents[path[-1]])
            tokens = [int(tree.tokens[v]) for v in reversed(path)]
            out[r, 1], out[r, 2] = path[0], len(tokens)
            out[r, HEADER : HEADER + len(tokens) + 1] = [*tokens, out[r, 0]]
        out[r, start : start + b - a] = rng.integers(0, vocab, b - a)
        if k:
            rows = (1 + (b - a) + (d - c)) * (1 + k)
            out[r, start + W : start + W + rows] = rng.integers(0, vocab, rows)
    return out


def same_sources(a: DraftSources, b: DraftSources) -> None:
    assert a.text.tokens.tolist() == b.text.tokens.tolist()
    assert a.text.drafts(8, 8) == b.text.drafts(8, 8)
    a.pool.flush()
    b.pool.flush()
    assert all(a.pool.lookup(key) == b.pool.lookup(key) for key in range(-1, 16))
    if a.window is not None:
        assert np.array_equal(a.window.rows, b.window.rows) and a.window.updates == b.window.updates
    assert np.array_equal(a.rates.hits, b.rates.hits) and np.array_equal(a.rates.offered, b.rates.offered)
    assert np.array_equal(a.rates.chances, b.rates.chances)
    if a.successors is not None:
        ta, tb = a.successors, b.successors
        assert np.array_equal(ta.table, tb.table) and np.array_equal(ta.hits, tb.hits)
        assert ta.n_pairs == tb.n_pairs and np.array_equal(ta.pairs[: ta.n_pairs], tb.pairs[: tb.n_pairs])


@pytest.mark.parametrize("seed", range(60))
def test_compiled_steps_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    cfg, vocab = random_config(rng), int(rng.integers(4, 16))
    prompt = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
    fused, plain = DraftSources(cfg, prompt, vocab), DraftSources(cfg, prompt, vocab)
    eos = {int(rng.integers(vocab))} if rng.integers(3) else set()
    eos_ids = np.array(sorted(eos), dtype=np.int64)
    pending, length = [prompt[-1]], 0
    W, N, _, _ = cfg.step_shape
    for _ in range(25):
        step = plan_next(pending, fused, W=W, N=N, P=1, rank=0)
        want = plan_step(pending, plain.window, plain.tree(len(pending)), W=W, N=N, P=1, rank=0)
        assert step.tree.tokens.tolist() == want.tree.tokens.tolist() and step.tree.parents == want.tree.parents
        assert step.plans == want.plans and step.layout.key == want.layout.key
        assert np.array_equal(step.ids, want.ids) and np.array_equal(step.layout.mask, want.layout.mask)
        fused.prepare()
        plain.prepare()
        gathered = message(rng, cfg, step, vocab, (length, 7))
        remaining = int(rng.integers(1, 8))
        got = fused.observe(gathered, step.bounds, remaining, eos_ids)
        assert got == reference_observe.observe(plain, gathered, want.plans, remaining, eos)
        same_sources(fused, plain)
        pending, length = got[0], length + len(got[0])


def same_step(a: StepPlan, b: StepPlan) -> None:
    assert a.tree.tokens.tolist() == b.tree.tokens.tolist() and a.tree.parents == b.tree.parents
    assert a.plans == b.plans and a.layout.key == b.layout.key and np.array_equal(a.bounds, b.bounds)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.layout.mask, b.layout.mask)
    assert np.array_equal(a.layout.logit_rows, b.layout.logit_rows) and np.array_equal(a.layout.depth, b.layout.depth)
    # a CPU worker's tensors share these arrays' memory
    arrays = (a.ids, a.layout.mask, a.layout.depth, a.layout.logit_rows, a.layout.parents, a.tree.parent_array)
    assert all(x.flags.writeable for x in arrays)


@pytest.mark.parametrize("seed", range(60))
def test_observe_and_plan_in_one_call_equal_the_two_calls(seed):
    """`observe_next` (the outcome fed and the next step planned in one compiled call where the
    sources grow their tree there, else the two calls) against `observe`, then `plan_next`: the same
    tokens, end, sources (once settled) and next step, and no step where the decode ends."""
    rng = np.random.default_rng(1000 + seed)
    cfg, vocab = random_config(rng), int(rng.integers(4, 16))
    prompt = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
    one, two = DraftSources(cfg, prompt, vocab), DraftSources(cfg, prompt, vocab)
    eos_ids = np.array([int(rng.integers(vocab))] if rng.integers(3) else [], dtype=np.int64)
    W, N, _, _ = cfg.step_shape
    step = want = plan_next([prompt[-1]], one, W=W, N=N, P=1, rank=0)
    same_step(step, plan_next([prompt[-1]], two, W=W, N=N, P=1, rank=0))
    length, fused = 0, 0
    for _ in range(25):
        one.prepare()
        two.prepare()
        fused += one.next_growth is not None
        gathered = message(rng, cfg, want, vocab, (length, 7))
        remaining = int(rng.integers(1, 8))
        tokens, stopped, step = observe_next(gathered, want.bounds, remaining, eos_ids, one, W=W, N=N, P=1, rank=0)
        assert (tokens, stopped) == two.observe(gathered, want.bounds, remaining, eos_ids)
        one.settle()  # the counts the one call leaves for after the next forward is queued
        same_sources(one, two)
        assert (step is None) == (stopped or len(tokens) >= remaining)
        if step is None:  # go on as the next decode of these sources would
            step = plan_next(tokens, one, W=W, N=N, P=1, rank=0)
        want = plan_next(tokens, two, W=W, N=N, P=1, rank=0)
        same_step(step, want)
        length += len(tokens)
    assert fused or not (cfg.tree and cfg.step_shape[3] and cfg.step_limit is None)


def twin_sources(seed: int, rank: int, P: int) -> tuple:
    """Two draft sources of one random config (trees grown in the one call) and 30-token prompt,
    for rank `rank` of P, and the first step the first plans (the second's checked equal):
    the generator, the config, the vocabulary, the two sources and that step."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(4, 16))
    cfg = DecodeConfig(
        W=int(rng.integers(1, 6)), N=int(rng.integers(2, 5)), G=int(rng.integers(2, 8)), recycle=int(rng.choice([0, 4]))
    ).validate()
    prompt = rng.integers(0, vocab, 30).tolist()
    a, b = DraftSources(cfg, prompt, vocab), DraftSources(cfg, prompt, vocab)
    W, N, _, _ = cfg.step_shape
    step = plan_next(prompt[-1:], a, W=W, N=N, P=P, rank=rank)
    same_step(step, plan_next(prompt[-1:], b, W=W, N=N, P=P, rank=rank))
    return rng, cfg, vocab, a, b, step


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_observe_and_plan_in_one_call_at_several_ranks(P, seed):
    """`observe_next` against `observe` then `plan_next` on every rank's messages, for one rank of
    P, over the steps of sources that grow their trees in the one call."""
    rank = seed % P
    rng, cfg, vocab, one, two, want = twin_sources(2000 + seed, rank, P)
    W, N, _, _ = cfg.step_shape
    length, none = 0, np.zeros(0, np.int64)
    for _ in range(20):
        one.prepare()  # it settles what the last one call left (no `settle` here)
        two.prepare()
        same_sources(one, two)
        assert one.next_growth is not None
        gathered = rank_messages(rng, cfg, want, vocab, (length, 7))
        tokens, stopped, step = observe_next(gathered, want.bounds, 200, none, one, W=W, N=N, P=P, rank=rank)
        assert (tokens, stopped) == two.observe(gathered, want.bounds, 200, none) and not stopped
        want = plan_next(tokens, two, W=W, N=N, P=P, rank=rank)
        same_step(step, want)
        length += len(tokens)


@pytest.mark.parametrize("P", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_rehearsal_changes_nothing(P, seed):
    """`rehearse` before each read (as a GPU's host runs it while the device computes) leaves the
    sources, the merged outcomes and the next steps as without it."""
    rank = seed % P
    rng, cfg, vocab, rehearsed, plain, want = twin_sources(3000 + seed, rank, P)
    W, N, _, _ = cfg.step_shape
    length, none, rehearsals = 0, np.zeros(0, np.int64), 0
    for _ in range(20):
        rehearsed.prepare()
        plain.prepare()
        gathered = rank_messages(rng, cfg, want, vocab, (length, 7))
        table = rehearsed.successors
        arrays = [a for a in (*rehearsed.arguments(), *(rehearsed.next_growth or ())) if isinstance(a, np.ndarray)]
        arrays += [table.stage, table.staged] if table is not None else []
        kept = [a.copy() for a in arrays]
        rehearse(gathered, none, rehearsed, W=W, N=N, P=P, rank=rank)
        assert all(np.array_equal(a, b) for a, b in zip(arrays, kept))  # the text's, pool's, table's, ...
        rehearsals += rehearsed.next_growth is not None
        same_sources(rehearsed, plain)
        tokens, stopped, step = observe_next(gathered, want.bounds, 200, none, rehearsed, W=W, N=N, P=P, rank=rank)
        *got, want = observe_next(gathered, want.bounds, 200, none, plain, W=W, N=N, P=P, rank=rank)
        assert [tokens, stopped] == got and not stopped
        same_step(step, want)
        length += len(tokens)
    assert rehearsals


@pytest.mark.parametrize("P", [2, 3, 5])
@pytest.mark.parametrize("seed", range(8))
def test_compiled_plans_equal_the_reference_at_several_ranks(P, seed):
    """Each rank's grown plan (`plan_next`) is the plan of the same tree given (`plan_step`)."""
    rng = np.random.default_rng(100 + seed)
    cfg, vocab = random_config(rng), int(rng.integers(4, 16))
    prompt = rng.integers(0, vocab, 40).tolist()
    W, N, _, _ = cfg.step_shape
    for rank in range(P):
        fused, plain = DraftSources(cfg, prompt, vocab), DraftSources(cfg, prompt, vocab)
        step = plan_next(prompt[-2:], fused, W=W, N=N, P=P, rank=rank)
        want = plan_step(prompt[-2:], plain.window, plain.tree(2), W=W, N=N, P=P, rank=rank)
        assert step.plans == want.plans and step.layout.key == want.layout.key
        assert np.array_equal(step.ids, want.ids) and np.array_equal(step.bounds, want.bounds)


def test_ranks_that_drift_apart_are_an_error():
    cfg = DecodeConfig(W=2, N=3, G=2)
    sources = DraftSources(cfg, [1, 2, 3], 8)
    step = plan_next([3], sources, W=2, N=3, P=2, rank=0)
    sources.prepare()
    gathered = np.zeros((2, step_message_size(cfg)), dtype=np.int64)
    gathered[1, 3] = 1  # another output length
    with pytest.raises(LPError, match="ranks diverged"):
        sources.observe(gathered, step.bounds, 8, np.zeros(0, np.int64))


@pytest.mark.parametrize("W,N", [(1, 2), (5, 2), (3, 3), (5, 4), (7, 5)])
def test_window_ngrams_pooled_by_column(W, N):
    """The n-grams a step pools from the window: column j's x0 (j = 0) or row-0 guess, its
    levels above, then the new level's token; then the window moves up a level."""
    cfg = DecodeConfig(W=W, N=N, G=3, pool_from_output=False, recycle=0, drafts="pool")
    sources = DraftSources(cfg, [7], vocab_size=2000)
    window: JacobiWindow = sources.window
    window.rows = np.arange((N - 1) * W, dtype=np.int64).reshape(N - 1, W) + 500
    window.updates = N  # ready
    before, level = window.rows.copy(), np.arange(W, dtype=np.int64) + 900
    step = plan_next([7], sources, W=W, N=N, P=1, rank=0)
    sources.prepare()
    gathered = np.full((1, step_message_size(cfg)), -1, dtype=np.int64)
    gathered[0, :5] = [1, -1, 0, 0, 0]
    gathered[0, HEADER + cfg.max_commit : HEADER + cfg.max_commit + W] = level
    assert sources.observe(gathered, step.bounds, 8, np.zeros(0, np.int64)) == ([1], False)
    for j in range(W):
        first = 7 if j == 0 else before[0, j]
        expect = (*(before[lvl, j] for lvl in range(1, N - 1)), level[j])
        assert expect in sources.pool.lookup(first), (j, sources.pool.lookup(first), expect)
    assert np.array_equal(window.rows, np.concatenate([before[1:], level[None, :]]))


def test_a_share_without_a_window_reads_no_tree_token_for_a_window_one():
    """`rank_share` (no window: tools lay out recorded steps) gathers zeros for the window's
    tokens and the tree's own tokens for its nodes."""
    from lp.decode.plan import rank_share

    tree = DraftTree(np.array([5, 6, 7], dtype=np.int64), (-1, 0, -1))
    step = plan_step([9], None, tree, W=3, N=3, P=2, rank=1)
    plans, layout = rank_share(1, tree, W=3, N=3, P=2, rank=1)
    assert plans == step.plans and layout.key == step.layout.key
    nodes = step.plan.candidates
    assert step.ids[layout.node_tokens].tolist() == tree.tokens[nodes.start : nodes.stop].tolist()
    assert set(step.ids[: layout.node_tokens.start].tolist()) <= {0, 9}
    with pytest.raises(ValueError, match="window's rows"):
        plan_step([9], JacobiWindow(2, 3, [1, 2], 0), tree, W=3, N=3, P=1, rank=0)


def test_observe_needs_prepare_and_a_message_within_the_step():
    cfg = DecodeConfig(W=2, N=3, G=2)
    sources = DraftSources(cfg, [1, 2, 3], 8)
    step = plan_next([3], sources, W=2, N=3, P=1, rank=0)
    gathered = np.zeros((1, step_message_size(cfg)), dtype=np.int64)
    with pytest.raises(LPError, match="prepare"):
        sources.observe(gathered, step.bounds, 8, np.zeros(0, np.int64))
    sources.prepare()
    gathered[0, 2] = cfg.max_commit  # more accepted draft tokens than the step holds
    with pytest.raises(LPError, match="more than the step's"):
        sources.observe(gathered, step.bounds, 8, np.zeros(0, np.int64))

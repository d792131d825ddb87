"""step_layout against an independent brute-force construction from the chain rules of
docs/design.md section 2: every token sees the earlier tokens of the chains it belongs to, nothing else."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lp.lookahead.mask import step_layout
from lp.partition import RankPlan


@pytest.fixture(autouse=True)
def _fresh_layout_cache():
    """step_layout is lru_cached and all empty ranges compare (and hash) equal, so without a
    fresh cache a test could be served a layout built for another test's empty range."""
    step_layout.cache_clear()
    yield


def column_ranges(W: int) -> list[range]:
    """Non-empty contiguous column ranges inside 0..W-1 (all of them for small W), plus the
    empty range at 0 (a rank with no columns that starts at the beginning)."""
    ranges = [range(a, b) for a in range(W) for b in range(a + 1, W + 1)]
    if W > 4:  # keep the sweep fast: whole, prefixes, suffixes, and a few middles
        keep = {(0, W), (0, 1), (0, 2), (W - 1, W), (1, W), (2, 5), (1, 3), (3, W - 1)}
        ranges = [r for r in ranges if (r.start, r.stop) in keep]
    return ranges + [range(0, 0)]


SHAPES = [
    (m, W, N, cols, n_cand)
    for m in (1, 2, 3)
    for W in range(1, 7)
    for N in (2, 3, 4, 5)
    for cols in column_ranges(W)
    for n_cand in (0, 1, 2, 3)
]


def chains(m: int, N: int, columns: range, n_cand: int) -> list[list[tuple]]:
    """Each chain as the ordered token identities it consists of."""
    pending = [("p", i) for i in range(m)]
    out = [list(pending)]
    for j in columns:
        row0 = [("w", 0, i) for i in range(1, j + 1)]
        levels = [("w", lvl, j) for lvl in range(1, N - 1)]
        out.append(pending + row0 + levels)
    for c in range(n_cand):
        out.append(pending + [("g", c * (N - 1) + k - 1) for k in range(1, N)])
    return out


def brute_force_allowed(m, N, columns, n_cand) -> tuple[set, set]:
    """(tokens, allowed pairs (q, k)): q may attend k iff some chain holds k at or before q."""
    tokens, allowed = set(), set()
    for chain in chains(m, N, columns, n_cand):
        tokens.update(chain)
        for qi, q in enumerate(chain):
            for k in chain[: qi + 1]:
                allowed.add((q, k))
    return tokens, allowed


def expected_depth(tok, m: int, N: int) -> int:
    kind = tok[0]
    if kind == "p":
        return tok[1] - (m - 1)
    if kind == "w":
        lvl, j = tok[1], tok[2]
        return j if lvl == 0 else lvl + j
    return tok[1] % (N - 1) + 1  # G chains of N-1 tree nodes


def expected_source(tok, m: int, W: int, N: int) -> int:
    """Index into the flat source [pending m | window rows (N-1)*W row-major | candidates]."""
    kind = tok[0]
    if kind == "p":
        return tok[1]
    if kind == "w":
        return m + tok[1] * W + tok[2]
    return m + (N - 1) * W + tok[1]


def shape_id(shape) -> str:
    m, W, N, cols, n_cand = shape
    return f"m{m}-W{W}-N{N}-c{cols.start}:{cols.stop}-g{n_cand}"


@pytest.mark.parametrize("m,N", [(m, N) for m in (1, 2, 3) for N in (2, 3, 4, 5)])
def test_mask_matches_chain_rules(m, N):
    for shape in (s for s in SHAPES if s[0] == m and s[2] == N):
        _, W, _, cols, n_cand = shape
        layout = step_layout(m, W, N, cols, n_cand)
        tokens, allowed = brute_force_allowed(m, N, cols, n_cand)
        assert len(layout.tokens) == len(set(layout.tokens)), f"{shape_id(shape)}: duplicate tokens"
        assert set(layout.tokens) == tokens, f"{shape_id(shape)}: token set"
        T = len(layout.tokens)
        assert layout.size == T
        assert layout.mask.shape == (T, T) and layout.mask.dtype == bool
        expect = np.array([[(q, k) in allowed for k in layout.tokens] for q in layout.tokens])
        bad = np.argwhere(expect != layout.mask)
        assert bad.size == 0, (
            f"{shape_id(shape)}: mask differs at {[(layout.tokens[q], layout.tokens[k]) for q, k in bad[:5]]}"
        )


@pytest.mark.parametrize("shape", SHAPES[::7], ids=shape_id)
def test_depth_gather_order(shape):
    m, W, N, cols, n_cand = shape
    layout = step_layout(m, W, N, cols, n_cand)
    assert layout.m == m and layout.columns == cols and len(layout.tree) == n_cand * (N - 1)
    assert layout.depth.tolist() == [expected_depth(t, m, N) for t in layout.tokens]
    assert layout.gather.tolist() == [expected_source(t, m, W, N) for t in layout.tokens]
    # Contracts the decoder relies on: the pending tokens come first, in order (commit(m)
    # keeps the first m KV entries), and the candidates come last, candidate-major (the
    # decoder slices them off the end of the input).
    assert list(layout.tokens[:m]) == [("p", i) for i in range(m)]
    n_tail = n_cand * (N - 1)
    tail = list(layout.tokens[len(layout.tokens) - n_tail :]) if n_tail else []
    assert tail == [("g", i) for i in range(n_tail)]


@pytest.mark.parametrize("shape", SHAPES[::5], ids=shape_id)
def test_logit_rows(shape):
    m, W, N, cols, n_cand = shape
    layout = step_layout(m, W, N, cols, n_cand)
    index = {t: i for i, t in enumerate(layout.tokens)}
    x0 = ("p", m - 1)

    def last(j):
        if N == 2:
            return x0 if j == 0 else ("w", 0, j)
        return ("w", N - 2, j)

    expect = [x0] + [last(j) for j in cols] + [("g", i) for i in range(n_cand * (N - 1))]
    assert layout.logit_rows.tolist() == [index[t] for t in expect]
    assert len(layout.logit_rows) == 1 + len(cols) + n_cand * (N - 1)


def test_gather_reads_the_right_ids():
    """Feed a source vector with recognisable values and read the ids back per identity."""
    m, W, N, cols, n_cand = 2, 6, 4, range(2, 5), 3
    layout = step_layout(m, W, N, cols, n_cand)
    pending = [900, 901]
    rows = np.arange(1000, 1000 + (N - 1) * W).reshape(N - 1, W)  # rows[l, j] = 1000 + l*W + j
    cands = np.arange(2000, 2000 + n_cand * (N - 1)).reshape(n_cand, N - 1)  # g_c[k] at [c, k-1]
    source = np.concatenate([pending, rows.ravel(), cands.ravel()])
    ids = source[layout.gather]
    for tok, v in zip(layout.tokens, ids.tolist()):
        if tok[0] == "p":
            assert v == pending[tok[1]]
        elif tok[0] == "w":
            assert v == rows[tok[1], tok[2]]
        else:
            assert v == cands.ravel()[tok[1]]


def test_token_count_formula():
    """docs/design.md section 2: a full step feeds 1 + (W-1) + W(N-2) + G'(N-1) tokens."""
    for W, N, G in itertools.product(range(1, 8), range(2, 7), range(0, 5)):
        assert step_layout(1, W, N, range(W), G).size == 1 + (W - 1) + W * (N - 2) + G * (N - 1)


def test_layout_size_matches_partition_cost():
    """The partitioner balances RankPlan.cost; the layout a rank then feeds must have that size."""
    for m, W, N, G in itertools.product((1, 2), range(1, 6), (2, 3, 5), (0, 2)):
        for cols in column_ranges(W):
            plan = RankPlan(cols, range(G))
            assert step_layout(m, W, N, cols, G).size == plan.cost(N, pending=m), (m, W, N, cols, G)


@pytest.mark.parametrize("start", [1, 3, 5])
def test_empty_column_range_feeds_no_row0_prefix(start):
    """A rank whose column range is empty but does not start at 0 (the partitioner gives
    `range(W, W)` to ranks that hold only candidates) has no column that needs row 0: it
    should feed only its pending tokens and candidates, as RankPlan.cost counts."""
    W, N, n_cand = 5, 3, 2
    layout = step_layout(1, W, N, range(start, start), n_cand)
    assert [t for t in layout.tokens if t[0] == "w"] == []
    assert layout.size == RankPlan(range(start, start), range(n_cand)).cost(N)


def test_empty_column_ranges_do_not_depend_on_cache_history():
    """All empty ranges are equal as lru_cache keys; whichever is asked first must not decide
    what the other gets (e.g. the layout fed by a candidates-only rank with range(W, W))."""
    W, N = 5, 3
    late = step_layout(1, W, N, range(W, W), 2)
    step_layout.cache_clear()
    step_layout(1, W, N, range(0, 0), 2)
    early = step_layout(1, W, N, range(W, W), 2)
    assert late.tokens == early.tokens and late.gather.tolist() == early.gather.tolist()


def test_bad_shapes_raise():
    for args in [
        (0, 5, 3, range(5), 0),
        (1, 5, 1, range(5), 0),
        (1, 5, 3, range(0, 6), 0),
        (1, 5, 3, range(5), -1),
        (1, 5, 3, range(5), (-1, 1)),
        (1, 5, 3, range(5), (0,)),
        (1, 5, 3, range(5), (-2,)),
        (1, 5, 3, range(5), (-1, -1, 3)),
    ]:
        with pytest.raises(ValueError):
            step_layout(*args)


def test_layout_is_cached_per_shape():
    assert step_layout(2, 5, 3, range(1, 4), 2) is step_layout(2, 5, 3, range(1, 4), 2)


def random_tree(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(rng.integers(-1, i)) for i in range(n))


@pytest.mark.parametrize("seed", range(6))
def test_tree_mask_depth_and_rows(seed):
    """A verification tree: each node sees the pending tokens, its ancestors and itself, sits
    one position below its parent, reads its own source slot and has its own logit row."""
    rng = np.random.default_rng(seed)
    m, W, N = 1 + seed % 3, 4, 3
    tree = random_tree(rng, 2 + 3 * seed)
    layout = step_layout(m, W, N, range(W), tree)
    T, n = layout.size, len(tree)
    first = T - n

    def ancestors(i):
        return set() if tree[i] < 0 else {tree[i]} | ancestors(tree[i])

    for i in range(n):
        row = layout.mask[first + i]
        assert set(np.flatnonzero(row).tolist()) == set(range(m)) | {first + a for a in ancestors(i) | {i}}
        assert layout.depth[first + i] == len(ancestors(i)) + 1
        assert layout.gather[first + i] == m + (N - 1) * W + i
    assert layout.logit_rows[-n:].tolist() == list(range(first, T))
    assert step_layout(m, W, N, range(W), tree) is layout


def test_chains_equal_the_classic_branch():
    """An int G is G unshared chains of N-1 nodes: the same layout as their parent pointers."""
    from lp.lookahead.tree import chain_parents

    a, b = step_layout(2, 5, 4, range(5), 3), step_layout(2, 5, 4, range(5), chain_parents(3, 3))
    assert a is b


@pytest.mark.parametrize(
    "m,W,N,cols,tree", [(1, 5, 3, range(5), (-1, 0, -1)), (2, 7, 5, range(2, 5), 3), (1, 0, 2, range(0), ())]
)
def test_named_parts_of_a_step(m, W, N, cols, tree):
    """The row and position slices by name: x0's row, one row per column (its last level), one
    per tree node; the tree nodes are the last input positions."""
    lay = step_layout(m, W, N, cols, tree)
    rows = lay.logit_rows
    assert lay.tokens[rows[lay.X0_ROW]] == ("p", m - 1)
    last_level = [lay.tokens[r] for r in rows[lay.column_rows]]
    assert [t[-1] for t in last_level] == list(cols) and all(t[0] in ("w", "p") for t in last_level)
    nodes = [lay.tokens[r] for r in rows[lay.node_rows]]
    assert nodes == [("g", i) for i in range(len(nodes))] == list(lay.tokens[lay.node_tokens])


@pytest.mark.parametrize("seed", range(4))
def test_layouts_equal_the_reference(seed):
    """Random steps (pending tokens, column ranges, trees up to a hundred nodes) lay out as the
    plain-Python construction does (tests/reference_plan.py), array for array, dtypes included;
    a bad tree raises there and here."""
    import reference_plan

    rng = np.random.default_rng(seed)
    for _ in range(150):
        W, N, m = int(rng.integers(0, 20)), int(rng.integers(2, 7)), int(rng.integers(1, 6))
        a = int(rng.integers(0, W + 1))
        columns = range(a, int(rng.integers(a, W + 1)))
        tree = random_tree(rng, int(rng.integers(0, 100)))
        if rng.random() < 0.1 and tree:  # a parent that does not precede its node, or below -1
            q = int(rng.integers(0, len(tree)))
            tree = tree[:q] + (int(rng.choice([q, q + 1, -2])),) + tree[q + 1 :]
        try:
            want = reference_plan.layout_arrays(m, W, N, columns, tree)
        except ValueError:
            with pytest.raises(ValueError, match="bad tree"):
                step_layout(m, W, N, columns, tree)
            continue
        got = step_layout(m, W, N, columns, tree)
        assert got.prefix == want.pop("prefix") and got.parents.tolist() == list(tree)
        for name, array in want.items():
            mine = getattr(got, name)
            assert mine.dtype == array.dtype and mine.shape == array.shape, name
            assert np.array_equal(mine, array), (name, m, W, N, columns, tree)

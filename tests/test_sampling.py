"""Sampling: warper parity with transformers, validation, the counter-based random stream, and
sampling verification (Algorithm 4): exact agreement with a literal implementation, the greedy
reduction, and a chi-square test of the output distribution that also rejects wrong rules."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from functools import cache

import pytest
import torch
from helpers import alive_after, chain_accept, chain_continue, chain_sample, chains, sample_accept
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from lp.errors import LPError
from lp.lookahead.tree import build_tree
from lp.verify.distribution import uniforms, validate_sampling, warp
from lp.verify.sampling import FirstLevel, Sampled, sample_first_level, uniforms_needed

ALPHA = 1e-3  # false-alarm rate of every statistical test here (seeds are fixed: deterministic)


def _accepted_candidate(drafts: torch.Tensor, result: Sampled) -> int:
    """Lowest candidate index whose drafts are the accepted ones (their KV holds the committed
    tokens but the last), or -1 when no draft was accepted (n == 1)."""
    k = result.n - 1
    if k == 0 or drafts.shape[0] == 0:
        return -1
    match = (drafts[:, :k] == result.tokens[:k].to(drafts.device)).all(dim=1)
    return int(torch.nonzero(match)[0, 0]) if bool(match.any()) else -1


def chi2_sf(x: float, df: int) -> float:
    """Chi-square survival function via the regularized upper incomplete gamma function."""
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64))
    )


def chi2_pvalue(counts: dict, expected: dict, total: int, min_expected: float = 5.0) -> float:
    """Goodness of fit of `counts` to probabilities `expected`; cells expected below
    `min_expected` counts are pooled into one cell."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, p in expected.items():
        e, o = p * total, counts.get(key, 0)
        if e < min_expected:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
        else:
            stat, cells = stat + (o - e) ** 2 / e, cells + 1
    unexpected = sum(o for k, o in counts.items() if k not in expected)
    pooled_obs += unexpected
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, cells + 1
    elif pooled_obs:
        return 0.0  # outcomes of probability zero
    return chi2_sf(stat, cells - 1)


# ----------------------------------------------------------------------------------- warp
def _reference_probs(logits, temperature, top_k, top_p):
    scores = logits.float()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(float(temperature))(None, scores)
    if top_k != 0:
        scores = TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)(None, scores)
    return scores.softmax(dim=-1)


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (1.3, 5, 1.0),
        (1.0, 0, 0.9),
        (0.5, 10, 0.8),
        (2.0, 3, 0.5),
        (1.0, 100, 0.3),
        (1.0, 1, 1.0),
        (0.9, 0, 0.01),
        (1, 7, 1),
        (3.0, 2, 0.999),
    ],
)
def test_warp_matches_transformers(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 60, generator=g) * 3
    logits[:4] = torch.round(logits[:4])  # ties, at the top-k boundary too
    logits[4, :10] = logits[4].max()  # a tied maximum
    probs = warp(logits, temperature, top_k, top_p)
    want = _reference_probs(logits, temperature, top_k, top_p)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    torch.testing.assert_close(probs, want, rtol=0, atol=0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(16), rtol=0, atol=1e-5)
    # lower-precision logits are warped in float32 like transformers does
    half = logits.bfloat16()
    torch.testing.assert_close(
        warp(half, temperature, top_k, top_p), _reference_probs(half, temperature, top_k, top_p), rtol=0, atol=0
    )


def test_warp_temperature_zero_is_argmax_one_hot():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 30, generator=g)
    logits[0, 3] = logits[0, 7] = 10.0  # tie: first maximum, like torch.argmax
    for k, p in ((0, 1.0), (4, 0.5)):
        probs = warp(logits, 0.0, k, p)
        assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 30).float())
    assert warp(logits[0], 0, 0, 1.0)[3] == 1  # 1-D input works too


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-0.1),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature="1"),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_p=-0.2),
        dict(top_p=float("nan")),
        dict(top_k=-1),
        dict(top_k=2.5),
        dict(top_k=True),
    ],
)
def test_validation_errors(bad):
    args = dict(temperature=1.0, top_k=0, top_p=1.0) | bad
    with pytest.raises(LPError) as err:
        validate_sampling(**args)
    assert "\n" not in str(err.value) and next(iter(bad)) in str(err.value)
    with pytest.raises(LPError):
        warp(torch.zeros(1, 4), **args)


@pytest.mark.parametrize("temperature, top_k, top_p", [(0, 0, 1), (0.0, 50, 1e-9), (2.5, 1, 1.0)])
def test_validation_accepts_edges(temperature, top_k, top_p):
    """Each edge passes validation and warps to a distribution: here, each keeps the argmax
    alone (temperature 0, top_p near 0, top_k 1)."""
    assert validate_sampling(temperature, top_k, top_p) is None
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.0]])
    assert torch.equal(warp(logits, temperature, top_k, top_p), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))


# ------------------------------------------------------------------------- random stream
def test_uniforms_reproducible_and_pinned():
    u = uniforms(0, 0, 0, 3)
    assert u.dtype == torch.float64 and u.shape == (3,)
    # pinned: a change of these numbers changes every sampled output ever produced
    assert u.tolist() == [0.8549869870581077, 0.8487389239645067, 0.4220636845939318]
    assert uniforms(2024, 7, 11, 2).tolist() == [0.5863310037694076, 0.5402496128516727]
    assert torch.equal(uniforms(5, 3, 9, 8), uniforms(5, 3, 9, 8))
    assert torch.equal(uniforms(5, 3, 9, 8)[:5], uniforms(5, 3, 9, 5))  # prefix-stable
    assert torch.equal(uniforms(5, 3, 9, 1000)[:8], uniforms(5, 3, 9, 8))  # numpy path = Python path
    assert uniforms(1, 1, 1, 0).numel() == 0
    for args in ((-1, 0, 0), (2**70, 3, 1), (0, -5, 2**63)):  # any integers
        v = uniforms(*args, 4)
        assert ((v > 0) & (v < 1)).all()
    with pytest.raises(TypeError):
        uniforms("1", 0, 0, 2)


def test_uniforms_same_in_another_process_and_ignore_global_rng():
    code = "from lp.verify.distribution import uniforms; print(uniforms(123, 4, 56, 6).tolist())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(uniforms(123, 4, 56, 6).tolist())
    torch.manual_seed(0)
    a = uniforms(1, 2, 3, 6)
    after_a = torch.rand(1)
    torch.manual_seed(99)
    b = uniforms(1, 2, 3, 6)
    torch.manual_seed(0)
    uniforms(1, 2, 3, 6)
    assert torch.equal(a, b) and torch.equal(torch.rand(1), after_a)  # global RNG untouched


def test_uniforms_independent_across_streams_and_steps():
    S, T = 200, 100
    table = torch.stack([torch.stack([uniforms(42, s, t, 2) for t in range(T)]) for s in range(S)])
    first = table[..., 0]
    assert first.unique().numel() == S * T
    # uniform marginal: chi-square over 20 bins
    counts = torch.bincount((first.flatten() * 20).long(), minlength=20).tolist()
    assert chi2_pvalue(dict(enumerate(counts)), {i: 1 / 20 for i in range(20)}, S * T) > ALPHA
    # no linear dependence between neighbouring streams, steps, counters, seeds
    bound = 4 / math.sqrt(S * T)  # 4 sigma

    def corr(x, y):
        x, y = x.flatten() - x.mean(), y.flatten() - y.mean()
        return float((x * y).sum() / (x.norm() * y.norm()))

    assert abs(corr(first[1:], first[:-1])) < bound
    assert abs(corr(first[:, 1:], first[:, :-1])) < bound
    assert abs(corr(table[..., 0], table[..., 1])) < bound
    other_seed = torch.stack([torch.stack([uniforms(43, s, t, 1)[0] for t in range(T)]) for s in range(S)])
    assert abs(corr(first, other_seed)) < bound
    assert not torch.equal(uniforms(1, 2, 3, 4), uniforms(1, 3, 2, 4))  # (stream, step) ordered
    assert not torch.equal(uniforms(1, 2, 3, 4), uniforms(2, 1, 3, 4))


# --------------------------------------------- a literal Algorithm 4 (the paper's pseudocode)
def algorithm4(p_x0, drafts, p_cand, draw, sample, renormalise=True, always_accept=False):
    """Algorithm 4 line by line on Python lists. `draw(level)` gives the r of one acceptance
    test, called again after each rejection with the rejected probability; `sample(level, P)`
    inverse-CDF samples P. The flags give the wrong rules the statistical test must reject."""
    N = len(drafts[0]) + 1 if drafts else 2
    alive, out = list(range(len(drafts))), []
    for i in range(1, N):
        P = list(p_x0) if i == 1 else list(p_cand[alive[0]][i - 2])
        total = sum(P)
        P = [x / total for x in P]
        accepted, last = None, None
        r = draw(i, None)
        for j in alive:
            s = drafts[j][i - 1]
            if always_accept or r <= P[s]:
                accepted = s
                break
            q = P[s]
            last = s if q > 0 else last
            P[s] = 0.0
            if renormalise:
                P = [x / (1 - q) for x in P]
            r = draw(i, q)
        if accepted is None and sum(P) == 0:  # all mass was on the drafts: missed by rounding
            accepted = last
        if accepted is None:
            out.append(sample(i, P))
            return out
        out.append(accepted)
        alive = [k for k in alive if drafts[k][i - 1] == accepted]
    out.append(sample(N, list(p_cand[alive[0]][N - 2])))
    return out


def inverse_cdf(P, u):
    target, cum = u * sum(P), 0.0
    for v, p in enumerate(P):
        cum += p
        if cum >= target and p > 0:
            return v
    return max(v for v, p in enumerate(P) if p > 0)


def recycled(u: list, N: int):
    """Algorithm 4's uniforms as sample_accept consumes them (the documented order): level i's
    tests share u[2(i-1)], rescaled after each rejection; u[2(i-1)+1] samples level i's residual,
    the bonus token included (level N, which has no drafts)."""
    state = {}

    def draw(level, rejected):
        if rejected is None:
            state["r"] = u[2 * (level - 1)]
        else:  # given r > q, (r - q) / (1 - q) is uniform on (0, 1)
            state["r"] = (state["r"] - rejected) / (1 - rejected)
        return state["r"]

    def sample(level, P):
        return inverse_cdf(P, u[2 * (level - 1) + 1])

    return draw, sample


def fresh(rng: random.Random):
    return (lambda level, rejected: rng.random()), (lambda level, P: inverse_cdf(P, rng.random()))


def random_case(g: torch.Generator, V: int, G: int, N: int):
    """Random distributions (with zeros) and drafts with many shared prefixes; half of the
    distributions put most of their mass on a draft token, so long acceptances happen."""
    drafts = torch.randint(0, max(2, V // 2), (G, N - 1), generator=g)

    def dist(boost=None):
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        p[torch.rand(V, generator=g) < 0.3] = 0  # zero-probability tokens
        p[torch.randint(V, (1,), generator=g)] += 0.05
        if boost is not None and torch.rand(1, generator=g) < 0.5:
            p[boost] += 4 * p.sum()
        return p / p.sum()

    p_x0 = dist(int(drafts[0, 0]) if G else None)
    p_cand = (
        torch.stack(
            [torch.stack([dist(int(drafts[c, k + 1]) if k < N - 2 else None) for k in range(N - 1)]) for c in range(G)]
        )
        if G
        else torch.zeros(0, N - 1, V, dtype=torch.float64)
    )
    # candidates sharing a prefix share the distribution after it, as a model would give
    for c in range(G):
        for c2 in range(c):
            for k in range(N - 1):
                if torch.equal(drafts[c, : k + 1], drafts[c2, : k + 1]):
                    p_cand[c, k] = p_cand[c2, k]
    return p_x0, drafts, p_cand


def test_matches_literal_algorithm4_with_documented_uniforms():
    g = torch.Generator().manual_seed(11)
    seen_n = set()
    for trial in range(400):
        V, G, N = 7, trial % 6, 2 + trial % 4
        p_x0, drafts, p_cand = random_case(g, V, G, N)
        u = uniforms(5, trial, 0, 2 * N)
        got = chain_sample(p_x0, drafts, p_cand, u)
        want = algorithm4(p_x0.tolist(), drafts.tolist(), p_cand.tolist(), *recycled(u.tolist(), N))
        assert got.tokens[: got.n].tolist() == want, trial
        assert (got.tokens[got.n :] == -1).all() and got.tokens.shape == (N,)
        seen_n.add((N, got.n))
        # the LP split gives the same answer
        first = sample_first_level(p_x0, drafts[:, 0], u)
        assert first.token == want[0]
        alive = alive_after(drafts[:, 0], first)
        if first.accepted:
            cont = chain_continue(first.token, drafts[alive], p_cand[alive], u)
            assert torch.equal(cont.tokens, got.tokens) and cont.n == got.n
            c = _accepted_candidate(drafts, got)
            assert c >= 0 and drafts[c, : got.n - 1].tolist() == want[: got.n - 1] and alive[c]
        else:
            assert got.n == 1 and not alive.any() and _accepted_candidate(drafts, got) == -1
    assert {(N, N) for N in (3, 4, 5)} <= seen_n and {(N, 1) for N in (2, 3, 4, 5)} <= seen_n


def test_uniforms_needed_and_errors():
    assert uniforms_needed(2) == 6
    p = torch.full((4,), 0.25)
    drafts = torch.tensor([[1, 2], [3, 0]])
    p_cand = torch.full((2, 2, 4), 0.25)
    with pytest.raises(ValueError):
        chain_sample(p, drafts, p_cand, torch.full((5,), 0.5))  # depth 2 needs 6
    with pytest.raises(ValueError):
        sample_accept(p, chains(drafts.numpy()), torch.full((3, 4), 0.25), torch.full((6,), 0.5))  # 4 nodes
    with pytest.raises(LPError):
        chain_sample(torch.zeros(4), drafts, p_cand, torch.full((6,), 0.5))
    with pytest.raises(ValueError):
        chain_continue(7, drafts, p_cand, torch.full((6,), 0.5))  # no candidate starts with 7


def test_edge_cases_zero_mass_and_rounding():
    tiny, top = 2.0**-54, 1 - 2.0**-53
    # a draft with zero probability is never accepted, whatever the uniform
    p = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    res = chain_sample(p, torch.tensor([[0], [3]]), torch.full((2, 1, 4), 0.25), torch.full((4,), tiny))
    assert res.n == 1 and res.tokens[0] == 1
    # a rejected token repeated by a later candidate is not tested again (and not accepted)
    res = sample_first_level(torch.tensor([0.5, 0.5]), torch.tensor([0, 0, 1]), torch.tensor([0.75, 0.3]))
    assert res == FirstLevel(1, True)
    # all mass on the drafts but the walk misses it by rounding: the last draft takes it
    g = torch.Generator().manual_seed(0)
    for _ in range(2000):
        p = torch.rand(6, generator=g, dtype=torch.float64)
        order = torch.randperm(6, generator=g)
        cum = 0.0
        for v in order.tolist():
            cum += p[v].item()
        if cum < p.sum().item():
            break
    else:
        pytest.skip("no rounding case found")
    res = sample_first_level(p, order, torch.tensor([top, 0.5]))
    assert res == FirstLevel(int(order[-1]), True)
    # G = 0 (or no draft accepted) commits one token sampled from p_x0 with u[1]
    res = chain_sample(
        torch.tensor([0.2, 0.3, 0.5]),
        torch.zeros(0, 2, dtype=torch.long),
        torch.zeros(0, 2, 3),
        torch.tensor([0.99, 0.45, 0.5, 0.5, 0.5]),
    )
    assert res.n == 1 and res.tokens.tolist() == [1, -1, -1]


# -------------------------------------------------------------------- greedy reduction
def test_one_hot_reduces_to_greedy_with_bonus():
    V, N, G = 6, 4, 6
    table: dict = {}

    def logits(ctx):
        if ctx not in table:
            gen = torch.Generator().manual_seed(hash_ctx(ctx))
            table[ctx] = torch.randn(V, generator=gen)
        return table[ctx]

    def argmax(ctx):
        return int(logits(ctx).argmax())

    rng = random.Random(1)
    lengths = set()
    for trial in range(300):
        ctx = tuple(rng.randrange(V) for _ in range(3))
        drafts = []
        for _ in range(rng.randrange(G + 1)):
            row, c = [], ctx
            for _ in range(N - 1):  # follow the argmax chain for a while, then deviate
                t = argmax(c) if rng.random() < 0.7 else rng.randrange(V)
                row.append(t)
                c = c + (t,)
            drafts.append(row)
        d = torch.tensor(drafts, dtype=torch.long).reshape(-1, N - 1)
        ctxs = [[ctx + tuple(row[: k + 1]) for k in range(N - 1)] for row in drafts]
        p_x0 = warp(logits(ctx)[None], 0.0)[0]
        p_cand = (
            warp(torch.stack([torch.stack([logits(c) for c in row]) for row in ctxs]), 0.0)
            if drafts
            else torch.zeros(0, N - 1, V)
        )
        preds = torch.tensor([[argmax(c) for c in row] for row in ctxs], dtype=torch.long).reshape(-1, N - 1)
        want = chain_accept(torch.tensor(argmax(ctx)), d, preds)
        got = chain_sample(p_x0, d, p_cand, uniforms(9, trial, 0, 2 * N))
        k = int(want.accepted) + 1
        assert got.n == k and got.tokens[:k].tolist() == want.tokens[:k].tolist(), trial
        if k > 1:
            assert _accepted_candidate(d, got) == int(want.best)
        lengths.add(k)
    assert lengths == set(range(1, N + 1))


def hash_ctx(ctx) -> int:
    h = 1469598103934665603
    for t in (len(ctx),) + tuple(ctx):
        h = ((h ^ (t + 1)) * 1099511628211) % 2**61
    return h


# ----------------------------------------------------------------- statistical exactness
V_STAT, N_STAT, PROMPT, SEED = 6, 3, (0, 1), 2024


@cache
def model(ctx: tuple) -> torch.Tensor:
    """A fixed random next-token model over V_STAT tokens (float64 probabilities), sometimes
    peaked, sometimes flat, sometimes with zero-probability tokens (top-k)."""
    g = torch.Generator().manual_seed(hash_ctx(ctx))
    logits = torch.randn(1, V_STAT, generator=g, dtype=torch.float64) * 1.5
    h = hash_ctx(ctx) % 3
    return warp(logits, 0.8 if h == 0 else 1.0, 3 if h == 1 else 0, 0.9 if h == 2 else 1.0)[0]


def ranked(ctx):
    return torch.argsort(model(ctx), descending=True, stable=True).tolist()


@cache
def step_inputs(ctx: tuple):
    """Adversarial fixed drafts for context ctx: likely and unlikely (even zero-probability)
    first tokens, candidates sharing a first token that diverge at level 2, repeated tokens,
    in an order that depends on the context, sometimes no candidate at all."""
    h = hash_ctx(ctx)
    if h % 7 == 0:
        drafts = []
    else:
        r = ranked(ctx)
        a, b, z = r[0], r[1], r[-1]
        drafts = [
            [z, ranked(ctx + (z,))[0]],
            [b, ranked(ctx + (b,))[0]],
            [a, ranked(ctx + (a,))[0]],
            [a, ranked(ctx + (a,))[-1]],
            [b, ranked(ctx + (b,))[1]],
            [z, ranked(ctx + (z,))[2]],
        ]
        shift = h % len(drafts)
        drafts = drafts[shift:] + drafts[:shift]
        drafts = drafts[: 3 + h % 4]
    d = torch.tensor(drafts, dtype=torch.long).reshape(-1, N_STAT - 1)
    p_cand = (
        torch.stack([torch.stack([model(ctx + tuple(row[: k + 1])) for k in range(N_STAT - 1)]) for row in drafts])
        if drafts
        else torch.zeros(0, N_STAT - 1, V_STAT, dtype=torch.float64)
    )
    return model(ctx), d, p_cand


def exact_first3() -> dict:
    """The plain ancestral-sampling distribution of the first 3 tokens, by enumeration."""
    out = {}
    for y1 in range(V_STAT):
        for y2 in range(V_STAT):
            for y3 in range(V_STAT):
                p = (model(PROMPT)[y1] * model(PROMPT + (y1,))[y2] * model(PROMPT + (y1, y2))[y3]).item()
                if p > 0:
                    out[(y1, y2, y3)] = p
    return out


def first3(step_fn) -> tuple:
    ctx, step = PROMPT, 0
    while len(ctx) < len(PROMPT) + 3:
        ctx = ctx + tuple(step_fn(ctx, step))
        step += 1
    return ctx[len(PROMPT) : len(PROMPT) + 3]


def histogram(samples) -> dict:
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    return counts


def _lookahead_step(k):
    def step_fn(ctx, step):
        res = chain_sample(*step_inputs(ctx), uniforms(SEED, k, step, 2 * N_STAT))
        return res.tokens[: res.n].tolist()

    return step_fn


def tree_inputs(ctx: tuple):
    """The same drafts as one trie, plus a 1-token draft and a 3-token one (mixed lengths)."""
    p_x0, d, _ = step_inputs(ctx)
    drafts = [tuple(r) for r in d.tolist()]
    if drafts:
        drafts = [drafts[0][:1], drafts[-1] + (ranked(ctx + drafts[-1])[0],)] + drafts
    tree = build_tree(drafts, budget=100)
    paths: list[tuple] = []
    for i, p in enumerate(tree.parents):
        paths.append((paths[p] if p >= 0 else ()) + (int(tree.tokens[i]),))
    p_nodes = torch.stack([model(ctx + q) for q in paths]) if paths else torch.zeros(0, V_STAT, dtype=torch.float64)
    return p_x0, tree, p_nodes


def _tree_step(k):
    def step_fn(ctx, step):
        p_x0, tree, p_nodes = tree_inputs(ctx)
        res = sample_accept(p_x0, tree, p_nodes, uniforms(SEED, k, step, uniforms_needed(3)))
        return res.tokens[: res.n].tolist()

    return step_fn


def _literal_step(rng, **wrong):
    draw, sample = fresh(rng)

    def step_fn(ctx, step):
        p_x0, d, p_cand = step_inputs(ctx)
        return algorithm4(p_x0.tolist(), d.tolist(), p_cand.tolist(), draw, sample, **wrong)

    return step_fn


def test_distribution_exact_chi_square():
    """sample_accept steps give the first 3 tokens the ancestral distribution (chi-square,
    false alarm ALPHA), and the same test rejects wrong acceptance rules."""
    expected = exact_first3()
    n = 20000
    # (a) plain ancestral sampling passes (sanity check of the test itself)
    rng = random.Random(1)
    ancestral = histogram(first3(lambda ctx, step: [inverse_cdf(model(ctx).tolist(), rng.random())]) for _ in range(n))
    assert chi2_pvalue(ancestral, expected, n) > ALPHA
    # (b) repeated sample_accept steps with fixed adversarial drafts, stream k per sample
    ours = histogram(first3(_lookahead_step(k)) for k in range(n))
    assert chi2_pvalue(ours, expected, n) > ALPHA
    # the same walk on a trie of drafts of mixed lengths (shared prefixes verified once)
    tree = histogram(first3(_tree_step(k)) for k in range(n))
    assert chi2_pvalue(tree, expected, n) > ALPHA
    # the paper's pseudocode with a fresh uniform per acceptance test passes too
    rng = random.Random(2)
    literal = histogram(first3(_literal_step(rng)) for _ in range(n))
    assert chi2_pvalue(literal, expected, n) > ALPHA
    # wrong rules are rejected by the same test
    for wrong in (dict(always_accept=True), dict(renormalise=False)):
        rng = random.Random(3)
        bad = histogram(first3(_literal_step(rng, **wrong)) for _ in range(n))
        assert chi2_pvalue(bad, expected, n) < ALPHA, wrong
    # the test exercised full matches (bonus token) and multi-candidate walks
    lengths = set()
    for k in range(200):
        ctx, step = PROMPT, 0
        res = chain_sample(*step_inputs(ctx), uniforms(SEED, k, step, 2 * N_STAT))
        lengths.add(res.n)
    assert lengths == {1, 2, 3}

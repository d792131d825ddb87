"""Sampling verification (paper Algorithm 4, proof in Appendix B) with the bonus token.

The drafts are the pool's n-grams, produced greedily (one-hot draft distributions), so a draft
token s is accepted with probability P(s) and on rejection P(s) is zeroed and P renormalised;
each committed token then follows P exactly, whatever the drafts are (Appendix B).

Level i (1 <= i <= N-1) decides the token at position t+i. At level 1 the distribution is P(.|x0)
(`p_x0`); the candidates still alive at level i > 1 are those whose first i-1 drafts equal the
committed tokens, so they share one context and one distribution: `p_cand[c, i-2]` of the first
alive candidate c. The walk visits the alive candidates in index order:
  * accept draft s with probability P(s)/sum(P) (P renormalised by every earlier rejection);
  * on rejection set P(s) = 0 (a second alive candidate with the same token is then rejected
    surely: the walk skips it without testing);
  * when one is accepted keep the alive candidates carrying that token and go to level i+1;
  * when all are rejected sample from the residual P (drafts zeroed), commit it and stop.
After N-1 accepted levels the bonus token is sampled from `p_cand[c, N-2]` of the survivor c.
A step commits 1..N tokens.

Uniforms (a fixed-length vector `u`, e.g. lp.sampling.uniforms(seed, prompt, step, 2 * N)),
indexed by level, never by how many tests ran, so G does not change how many are needed:
  * u[2(i-1)]     level i's acceptance walk;
  * u[2(i-1) + 1] level i's residual sample (read only when every draft is rejected);
  * u[2(N-1)]     the bonus token after a full match.
2N-1 numbers in all. The acceptance tests of one level share u[2(i-1)] by recycling: the k-th
test accepts iff u * sum(P) falls in the k-th draft's slice of the cumulative draft masses,
which is the test `r <= P_k(s_k)` of Algorithm 4 with r = the rescaled leftover of u; given that
the earlier tests rejected, that r is uniform on (0, 1) and independent of them, so the outcome
has exactly the distribution of Algorithm 4 with a fresh uniform per test. Samples are inverse-CDF
on the cumulative sum of the (residual) distribution: the first index whose cumsum >= u * total.
Uniforms in (0, 1) never accept a zero-probability token. With one-hot P (temperature 0) the walk
accepts exactly the drafts equal to the argmax: greedy verification with the bonus token.

Lookahead Parallelism: `sample_accept` = `sample_first_level` then `sample_continue`.
  1. Every rank knows all candidates' first draft tokens (the pool is replicated) and computes
     p_x0 itself, so every rank runs `sample_first_level(p_x0, drafts[:, 0], u)` and gets the
     committed first token y1 and whether it was a draft.
  2. If it was, the alive group is `drafts[:, 0] == y1` (see `alive_after`); the rank that runs
     those candidates calls `sample_continue(y1, drafts[alive], p_cand[alive], u)`, with the
     same u, and publishes the result. Otherwise the step commits y1 alone.
Any subset of the alive group may be passed to `sample_continue` and the output distribution
stays exact (Appendix B holds for any set of drafts), only acceptance drops; but when several
ranks continue with different subsets, the result must be chosen by a rule fixed before the
outcomes are seen (e.g. the rank holding the lowest alive candidate), never by the longest
acceptance, which would bias the distribution. Ranks compute p_x0 in differently shaped
forwards, so its low bits (and, rarely, a level-1 decision) may differ: as in greedy, let rank
0's y1 be authoritative and use a continuation only if its rank found the same y1, else commit
y1 alone (still exact: the next step samples the rest afresh).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from lp.errors import LPError


class FirstLevel(NamedTuple):
    """Level 1's decision: the committed first token, and whether it was a draft (accepted)."""

    token: int
    accepted: bool


class Sampled(NamedTuple):
    """Committed tokens `[N]` (long, padded with -1 after the first n) and their count n."""

    tokens: torch.Tensor
    n: int


def uniforms_needed(N: int) -> int:
    """How many uniforms one step with n-gram size N reads (2N-1)."""
    return 2 * N - 1


def _sample(P: torch.Tensor, u: float, exclude: list[int] | None = None) -> tuple[int, float]:
    """Inverse-CDF sample from P (zeroed at `exclude`): the first index whose cumulative sum
    reaches u * total, and that total (token -1 when the total is zero)."""
    if exclude:
        P = P.index_fill(0, torch.tensor(exclude, device=P.device), 0)
    cdf = torch.cumsum(P, 0, dtype=torch.float64)
    total = cdf[-1:]
    index = torch.searchsorted(cdf, total * u).clamp_(max=P.numel() - 1)
    token, mass = torch.cat([index.to(cdf.dtype), total]).tolist()
    return (int(token), mass) if mass > 0 else (-1, mass)


def _level(P: torch.Tensor, drafts: list[int], u_walk: float, u_residual: float) -> FirstLevel:
    """One level of Algorithm 4 on distribution P (`[V]`, any positive scale; sums in float64)."""
    distinct = list(dict.fromkeys(drafts))  # a repeated token was zeroed by its first rejection
    total = P.sum(dtype=torch.float64).reshape(1)
    if distinct:
        values = torch.cat([P[torch.tensor(distinct, device=P.device)].double(), total]).tolist()
    else:
        values = total.tolist()
    mass, total = values[:-1], values[-1]
    if not (math.isfinite(total) and total > 0) or any(not m >= 0 for m in mass):
        raise LPError(f"sampling verification got an invalid distribution (total mass {total})")
    target, cum, last = u_walk * total, 0.0, -1
    for s, m in zip(distinct, mass):
        if m > 0:
            cum += m
            last = s
            if target <= cum:
                return FirstLevel(s, True)
    token, _ = _sample(P, u_residual, distinct)
    if token < 0:  # all mass on the drafts, missed by rounding: the last draft with mass takes it
        if last < 0:
            raise LPError(f"sampling verification got an invalid distribution (total mass {total})")
        return FirstLevel(last, True)
    return FirstLevel(token, False)


def _uniform_values(u: torch.Tensor, need: int) -> list[float]:
    values = u.reshape(-1).tolist()
    if len(values) < need:
        raise ValueError(f"sampling verification needs {need} uniforms, got {len(values)}")
    return values


def _finish(out: list[int], N: int, device: torch.device) -> Sampled:
    return Sampled(torch.tensor(out + [-1] * (N - len(out)), dtype=torch.long, device=device), len(out))


def _continue(first_token: int, rows: list[list[int]], p_cand: torch.Tensor, alive: list[int],
              values: list[float], device: torch.device) -> Sampled:
    """Levels 2..N-1 and the bonus token; `alive` indexes rows and p_cand (no copy of p_cand)."""
    N = len(rows[alive[0]]) + 1
    out = [first_token]
    for i in range(2, N):  # level i decides rows[c][i-1] with the distribution after level i-1
        level = _level(p_cand[alive[0], i - 2], [rows[c][i - 1] for c in alive],
                       values[2 * (i - 1)], values[2 * (i - 1) + 1])
        out.append(level.token)
        if not level.accepted:
            return _finish(out, N, device)
        alive = [c for c in alive if rows[c][i - 1] == level.token]
    token, _ = _sample(p_cand[alive[0], N - 2], values[2 * (N - 1)])  # full match: the bonus token
    if token < 0:
        raise LPError("sampling verification got a distribution with no mass for the bonus token")
    return _finish(out + [token], N, device)


def sample_first_level(p_x0: torch.Tensor, first_tokens: torch.Tensor, u: torch.Tensor) -> FirstLevel:
    """Level 1: walk the candidates' first draft tokens `[G]` (G may be 0) under p_x0 `[V]`.

    Reads u[0] (walk) and u[1] (residual sample). Every rank can run it: it needs only p_x0 and
    the first draft tokens of all candidates."""
    values = _uniform_values(u, 2)
    return _level(p_x0, first_tokens.reshape(-1).tolist(), values[0], values[1])


def alive_after(first_tokens: torch.Tensor, first: FirstLevel) -> torch.Tensor:
    """Bool `[G]`: the candidates that continue to level 2 (none if no draft was accepted)."""
    if not first.accepted:
        return torch.zeros_like(first_tokens, dtype=torch.bool)
    return first_tokens == first.token


def sample_continue(first_token: int, drafts: torch.Tensor, p_cand: torch.Tensor, u: torch.Tensor) -> Sampled:
    """Levels 2..N-1 and the bonus token, after level 1 accepted `first_token`.

    drafts `[A, N-1]`: alive candidates (all with drafts[:, 0] == first_token, A >= 1, in the
    global candidate order); p_cand `[A, N-1, V]`: the distribution after each of their tokens.
    Reads u[2..2N-2] as documented in the module. Returns all committed tokens, first included."""
    A, n1 = drafts.shape
    if A == 0 or p_cand.shape[:2] != (A, n1):
        raise ValueError(f"sample_continue: drafts {tuple(drafts.shape)} and p_cand {tuple(p_cand.shape)} "
                         f"must be [A>=1, N-1] and [A, N-1, V]")
    values = _uniform_values(u, uniforms_needed(n1 + 1))
    rows = drafts.tolist()
    if any(row[0] != first_token for row in rows):
        raise ValueError("sample_continue: every alive candidate must start with the accepted first token")
    return _continue(first_token, rows, p_cand, list(range(A)), values, drafts.device)


def sample_accept(p_x0: torch.Tensor, drafts: torch.Tensor, p_cand: torch.Tensor, u: torch.Tensor) -> Sampled:
    """One step's sampling verification (Algorithm 4 + bonus token) on one rank.

    p_x0 `[V]`: P(. | x0) (warped probabilities); drafts `[G, N-1]` long: candidates g_c[1..N-1]
    (G may be 0); p_cand `[G, N-1, V]`: P after each candidate token; u: >= 2N-1 uniforms in
    (0, 1). Equal to `sample_first_level` followed, when a draft was accepted, by
    `sample_continue` on the alive candidates (`alive_after`)."""
    G, n1 = drafts.shape
    N = n1 + 1
    if n1 < 1 or p_cand.shape[:2] != (G, n1) or (G and p_cand.shape[2] != p_x0.shape[-1]):
        raise ValueError(f"sample_accept: p_cand {tuple(p_cand.shape)} does not match drafts "
                         f"{tuple(drafts.shape)} (N >= 2) and p_x0 {tuple(p_x0.shape)}")
    values = _uniform_values(u, uniforms_needed(N))
    rows = drafts.tolist()
    first = _level(p_x0, [row[0] for row in rows], values[0], values[1])
    if not first.accepted:
        return _finish([first.token], N, drafts.device)
    alive = [c for c, row in enumerate(rows) if row[0] == first.token]
    return _continue(first.token, rows, p_cand, alive, values, drafts.device)


__all__ = ["FirstLevel", "Sampled", "alive_after", "sample_accept",
           "sample_continue", "sample_first_level", "uniforms_needed"]

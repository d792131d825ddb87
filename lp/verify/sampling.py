"""Sampling verification (paper Algorithm 4, proof in Appendix B) on a token tree, with the
bonus token.

The drafts are produced greedily (one-hot draft distributions: pool n-grams, or text the
sequence already holds), so a draft token s is accepted with probability P(s) and on rejection
P(s) is zeroed and P renormalised; each committed token then follows P exactly, whatever the
drafts are (Appendix B).

The drafts form a tree under x0 (lp/lookahead/tree.py). Level i (i >= 1) decides the token at
position t+i. The walk keeps an alive set of nodes whose paths equal the committed tokens so
far (at level 1: x0); they share one context, so one distribution: P(.|x0) (`p_x0`) at level
1, then `p_nodes[a]` of the first alive node a. The level's candidates are the alive nodes'
children, in index order (in a trie: one node's children, all distinct; G unshared chains that
share a prefix give repeated tokens):
  * accept draft s with probability P(s)/sum(P) (P renormalised by every earlier rejection);
  * on rejection set P(s) = 0 (a second candidate with the same token is then rejected surely:
    the walk skips it without testing);
  * when one is accepted, the children carrying that token become the alive set: next level;
  * when all are rejected, or there are none (the alive nodes are leaves: the bonus token),
    sample from the residual P (drafts zeroed), commit it and stop.
A step commits 1..D+1 tokens for a tree of depth D.

Uniforms (a fixed-length vector `u`, e.g. lp.verify.distribution.uniforms(seed, prompt, step, n)), indexed
by level, never by how many tests ran, so the tree's width does not change how many are needed:
  * u[2(i-1)]     level i's acceptance walk;
  * u[2(i-1) + 1] level i's residual sample (a level without candidates reads only this one).
2(D+1) numbers in all (`uniforms_needed(D)`). The acceptance tests of one level share
u[2(i-1)] by recycling: the k-th test accepts iff u * sum(P) falls in the k-th draft's slice of
the cumulative draft masses, which is the test `r <= P_k(s_k)` of Algorithm 4 with r = the
rescaled leftover of u; given that the earlier tests rejected, that r is uniform on (0, 1) and
independent of them, so the outcome has exactly the distribution of Algorithm 4 with a fresh
uniform per test. Levels read disjoint uniforms, and a level is decided only from its own
context's distribution, so the tree is Algorithm 4 level by level: each committed token follows
P given the tokens before it. Samples are inverse-CDF on the cumulative sum of the (residual)
distribution: the first index whose cumsum >= u * total. Uniforms in (0, 1) never accept a
zero-probability token. With one-hot P (temperature 0) the walk accepts exactly the drafts
equal to the argmax: greedy verification with the bonus token.

Lookahead Parallelism (lp/verify/verifier.py's SamplingVerifier): `sample_first_level`, then
`sample_continue`.
  1. Every rank knows all the tree's root tokens (the drafts are replicated) and computes p_x0
     itself, so every rank runs `sample_first_level(p_x0, root tokens, u)` and gets the
     committed first token y1 and whether it was a draft.
  2. If it was, the alive set is the roots carrying y1 (adjacent); the rank
     holding their subtrees (the partitioner keeps them together) calls
     `sample_continue(y1, subtrees, p_nodes, u)` with the same u and publishes the result.
     Otherwise the step commits y1 alone.
Any part of the alive subtrees may be passed to `sample_continue` and the output distribution
stays exact (Appendix B holds for any set of drafts), only acceptance drops; but when several
ranks continue with different parts, the result must be chosen by a rule fixed before the
outcomes are seen (e.g. the rank holding the lowest alive node), never by the longest
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
from lp.lookahead.tree import DraftTree


class FirstLevel(NamedTuple):
    """Level 1's decision: the committed first token, and whether it was a draft (accepted)."""

    token: int
    accepted: bool


class Sampled(NamedTuple):
    """Committed tokens `[max_commit]` (long, padded with -1 after the first n), their count n,
    and the accepted drafts' nodes (one per level, the first alive one: alive nodes share their
    context, so any one's KV is the token's)."""

    tokens: torch.Tensor
    n: int
    path: list[int]


def uniforms_needed(depth: int) -> int:
    """How many uniforms one step reads with a tree of the given depth (2(depth + 1))."""
    return 2 * (depth + 1)


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


def _finish(out: list[int], path: list[int], max_commit: int, device: torch.device) -> Sampled:
    return Sampled(torch.tensor(out + [-1] * (max_commit - len(out)), dtype=torch.long, device=device), len(out), path)


def sample_first_level(p_x0: torch.Tensor, first_tokens: torch.Tensor, u: torch.Tensor) -> FirstLevel:
    """Level 1: walk the tree's root tokens `[r]` (r may be 0) under p_x0 `[V]`.

    Reads u[0] (walk) and u[1] (residual sample). Every rank can run it: it needs only p_x0 and
    the root tokens of the whole tree."""
    values = _uniform_values(u, 2)
    return _level(p_x0, first_tokens.reshape(-1).tolist(), values[0], values[1])


def sample_continue(
    first_token: int, tree: DraftTree, p_nodes: torch.Tensor, u: torch.Tensor, max_commit: int | None = None
) -> Sampled:
    """Levels 2.. and the bonus token, after level 1 accepted `first_token`.

    tree: the alive roots' subtrees (its roots carrying `first_token` are the alive set; others
    are ignored); p_nodes `[n, V]`: the distribution after each node. Reads u[2..] as
    documented in the module; `max_commit` pads the result (default: the tree's depth + 1). Returns
    all committed tokens, first included."""
    if tree.size == 0 or p_nodes.shape[0] != tree.size:
        raise ValueError(
            f"sample_continue: a tree of {tree.size} nodes needs p_nodes [n>=1, V], got {tuple(p_nodes.shape)}"
        )
    depth = int(tree.depth.max())
    max_commit = max_commit or depth + 1
    values = _uniform_values(u, uniforms_needed(depth))
    tokens = tree.tokens.tolist()
    children: list[list[int]] = [[] for _ in tokens]
    for i, p in enumerate(tree.parents):
        if p >= 0:
            children[p].append(i)
    alive = [int(r) for r in tree.roots if tokens[r] == first_token]
    if not alive:
        raise ValueError("sample_continue: no root of the tree carries the accepted first token")
    out, path = [first_token], [alive[0]]
    while True:  # level len(out) + 1 decides the token after the alive nodes
        i = len(out) + 1
        kids = [c for a in alive for c in children[a]]
        level = _level(p_nodes[alive[0]], [tokens[c] for c in kids], values[2 * (i - 1)], values[2 * (i - 1) + 1])
        out.append(level.token)
        if not level.accepted:
            return _finish(out, path, max_commit, p_nodes.device)
        alive = [c for c in kids if tokens[c] == level.token]
        path.append(alive[0])


__all__ = ["FirstLevel", "Sampled", "sample_continue", "sample_first_level", "uniforms_needed"]

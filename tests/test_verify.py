"""Greedy verification (paper Algorithm 3) with the bonus token."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import chain_accept, tree_accept

from lp.lookahead.tree import build_tree


def run(y1: int, drafts: list[list[int]], preds: list[list[int]], n1: int | None = None):
    n1 = n1 if n1 is not None else (len(drafts[0]) if drafts else 2)
    d = torch.tensor(drafts, dtype=torch.long).reshape(-1, n1)
    p = torch.tensor(preds, dtype=torch.long).reshape(-1, n1)
    acc = chain_accept(torch.tensor(y1), d, p)
    a = int(acc.accepted)
    return int(acc.best), a, acc.tokens.tolist(), acc.tokens[: a + 1].tolist()


def naive_algorithm3(y1: int, drafts: list[list[int]], preds: list[list[int]]):
    """Per candidate: walk its drafts while each equals the token the model predicts there
    (y1 for the first, then the prediction after the previous draft); the committed tokens are
    the matched drafts plus the model's token after them. Longest wins, first on ties; no
    candidate (-1) when none matched."""
    best, best_len, best_commit = -1, -1, [y1]
    for c, (draft, pred) in enumerate(zip(drafts, preds)):
        expect, commit = y1, []
        for k, tok in enumerate(draft):
            if tok != expect:
                break
            commit.append(tok)
            expect = pred[k]
        commit.append(expect)
        if len(commit) - 1 > best_len:
            best, best_len, best_commit = c, len(commit) - 1, commit
    return (best if best_len > 0 else -1), max(best_len, 0), best_commit


def test_no_candidates_commits_y1():
    best, a, tokens, commit = run(9, [], [], n1=3)
    assert best == -1 and a == 0 and commit == [9]
    assert len(tokens) == 4 and tokens[0] == 9


def test_no_match_commits_y1_only():
    best, a, _, commit = run(9, [[1, 2], [3, 4]], [[5, 6], [7, 8]])
    assert a == 0 and commit == [9]


def test_partial_match():
    # candidate 1 matches y1=9 then its prediction after 9 is 4, but its next draft is 5
    best, a, _, commit = run(9, [[1, 2, 3], [9, 5, 6]], [[0, 0, 0], [4, 0, 0]])
    assert best == 1 and a == 1 and commit == [9, 4]


def test_full_match_gives_n_tokens_with_bonus():
    # N = 4: drafts g1..g3 all match, bonus is the prediction after g3
    best, a, tokens, commit = run(9, [[1, 1, 1], [9, 4, 6]], [[0, 0, 0], [4, 6, 8]])
    assert best == 1 and a == 3 and commit == [9, 4, 6, 8]
    assert len(commit) == 4


def test_longest_wins():
    drafts = [[9, 1, 0], [9, 4, 6], [9, 4, 0]]
    preds = [[4, 0, 0], [4, 6, 8], [4, 7, 0]]
    best, a, _, commit = run(9, drafts, preds)
    assert best == 1 and a == 3 and commit == [9, 4, 6, 8]


def test_ties_go_to_lowest_index():
    drafts = [[1, 1], [9, 3], [9, 4], [9, 5]]
    preds = [[0, 0], [7, 0], [8, 0], [7, 0]]  # candidates 1, 2, 3 all accept one draft
    best, a, _, commit = run(9, drafts, preds)
    assert best == 1 and a == 1 and commit == [9, 7]
    # all fully matched: still the first
    drafts = [[9, 7], [9, 7], [9, 7]]
    preds = [[7, 1], [7, 2], [7, 3]]
    best, a, _, commit = run(9, drafts, preds)
    assert best == 0 and commit == [9, 7, 1]


def test_a_mismatch_stops_the_walk_even_if_later_tokens_match():
    best, a, _, commit = run(9, [[9, 0, 6]], [[4, 6, 8]])
    assert a == 1 and commit == [9, 4]


def test_matches_naive_algorithm3_on_random_inputs():
    rng = random.Random(1234)
    for _ in range(2000):
        n1 = rng.randint(1, 4)
        G = rng.randint(1, 5)
        vocab = rng.randint(2, 3)  # tiny vocabulary: many partial and full matches
        y1 = rng.randrange(vocab)
        drafts = [[rng.randrange(vocab) for _ in range(n1)] for _ in range(G)]
        preds = [[rng.randrange(vocab) for _ in range(n1)] for _ in range(G)]
        best, a, tokens, commit = run(y1, drafts, preds)
        nb, na, ncommit = naive_algorithm3(y1, drafts, preds)
        assert (best, a, commit) == (nb, na, ncommit), (y1, drafts, preds)
        assert len(tokens) == n1 + 1 and 1 <= len(commit) <= n1 + 1


def test_result_stays_on_device_dtype():
    acc = chain_accept(torch.tensor(3), torch.tensor([[3, 1]]), torch.tensor([[1, 2]]))
    assert acc.best.dtype == torch.long and acc.accepted.dtype == torch.long
    assert acc.tokens.dtype == torch.long and acc.best.dim() == 0 and acc.accepted.dim() == 0


def naive_tree_walk(y1: int, drafts: list[tuple[int, ...]], model) -> list[int]:
    """Greedy on a tree by hand: follow the draft whose next token is the model's, then the bonus."""
    out, expect = [], y1
    while True:
        out.append(expect)
        if not any(d[: len(out)] == tuple(out) for d in drafts):
            return out
        expect = model(tuple(out))


@pytest.mark.parametrize("share", [True, False])
def test_tree_matches_a_naive_walk(share):
    """On random trees (shared or unshared, drafts of mixed lengths), the committed tokens are
    the longest draft prefix the model would generate, plus its next token."""
    rng = random.Random(7)
    lengths = set()
    for trial in range(500):
        vocab = rng.randint(2, 3)
        table: dict = {}

        def model(ctx, table=table, vocab=vocab):  # a deterministic "argmax" per context
            return table.setdefault(ctx, rng.randrange(vocab))

        y1 = rng.randrange(vocab)
        drafts = [tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(0, 6))]
        tree = build_tree(drafts, budget=rng.randint(0, 20), share=share)
        kept = [tuple(p) for p in paths_of(tree)]
        want = naive_tree_walk(y1, kept, model)
        preds = torch.tensor([model(p) for p in paths_of(tree)], dtype=torch.long)
        acc = tree_accept(torch.tensor(y1), tree, preds, 7)
        a = int(acc.accepted)
        assert acc.tokens[: a + 1].tolist() == want, (trial, drafts, tree)
        assert (acc.tokens[a + 1 :] == -1).all() and acc.tokens.shape == (7,)
        assert (int(acc.best) == -1) == (a == 0)
        lengths.add(a)
    assert lengths >= {0, 1, 2, 3}


def paths_of(tree) -> list[tuple[int, ...]]:
    """Node i's token path from x0, for every node in order."""
    out: list[tuple[int, ...]] = []
    for i, p in enumerate(tree.parents):
        out.append((out[p] if p >= 0 else ()) + (int(tree.tokens[i]),))
    return out


def test_wrong_rule_is_caught_by_the_naive_walk():
    """Control: accepting a node whose parent failed (ignoring ancestors) disagrees with the walk."""
    tree = build_tree([(5, 6), (7, 6)], budget=10)  # y1 = 7: only the second root is right
    preds = torch.tensor([6, 9, 6, 4])  # after 5 the model says 6, so 5-6 "matches" locally
    acc = tree_accept(torch.tensor(7), tree, preds, 3)
    assert acc.tokens.tolist() == [7, 6, 4] and int(acc.best) == 3

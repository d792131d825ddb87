"""The per-step all-gather message: pack on each rank, merge identically everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import chain_accept

from lp.errors import LPError
from lp.message import HEADER, merge, merge_messages, message_size, pack
from lp.partition import RankPlan, partition
from lp.verify import Acceptance

W, N = 5, 3


def t(x):
    return torch.tensor(x, dtype=torch.long)


def acceptance(best: int, accepted: int, tokens: list[int]) -> Acceptance:
    return Acceptance(t(best), t(accepted), t(tokens))


def message(y1, best, accepted, tokens, first_candidate, new, length=10, checksum=77, max_commit=W):
    return pack(t(y1), acceptance(best, accepted, tokens), first_candidate, t(new), length, checksum, max_commit)


def gather(*msgs) -> np.ndarray:
    return torch.stack(list(msgs)).numpy()


def test_pack_layout():
    msg = message(4, 1, 2, [4, 5, 6], first_candidate=3, new=[20, 21])
    assert msg.dtype == torch.long and msg.numel() == message_size(W, N) == HEADER + N + W
    assert msg[:HEADER].tolist() == [4, 1 + 3, 2, 10, 77, 0]  # best is made global; halt 0
    assert msg[HEADER : HEADER + N].tolist() == [4, 5, 6]
    assert msg[HEADER + N :].tolist() == [20, 21, -1, -1, -1]


def test_pack_keeps_no_candidate_marker():
    msg = message(4, -1, 0, [4, -1, -1], first_candidate=3, new=[])
    assert msg[1].item() == -1


def test_round_trip_one_rank():
    plans = partition(W, N, 2, 1)
    msg = message(4, 1, 2, [4, 5, 6], 0, new=[10, 11, 12, 13, 14])
    out = merge(gather(msg), plans, N)
    assert out.tokens == [4, 5, 6] and out.accepted == 2
    assert out.new.tolist() == [10, 11, 12, 13, 14]


def test_round_trip_one_rank_no_candidates():
    plans = partition(W, N, 0, 1)
    msg = message(4, -1, 0, [4, -1, -1], 0, new=[10, 11, 12, 13, 14])
    out = merge(gather(msg), plans, N)
    assert out.tokens == [4] and out.accepted == 0
    assert out.new.tolist() == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("P", [2, 3])
def test_round_trip_from_real_verification(P):
    """Each rank verifies its share with greedy_accept and packs; the merge must give what a
    single rank verifying every candidate gives, and the columns' new tokens in order."""
    G = 6
    rng = np.random.default_rng(P)
    drafts = torch.from_numpy(rng.integers(0, 3, size=(G, N - 1)))
    preds = torch.from_numpy(rng.integers(0, 3, size=(G, N - 1)))
    y1 = t(1)
    drafts[4] = torch.tensor([1, preds[4, 0].item()])  # candidate 4 fully matches
    new_all = torch.arange(100, 100 + W)
    plans = partition(W, N, G, P)
    msgs = []
    for plan in plans:
        cs = plan.candidates
        acc = chain_accept(y1, drafts[cs.start : cs.stop], preds[cs.start : cs.stop])
        msgs.append(pack(y1, acc, cs.start, new_all[plan.columns.start : plan.columns.stop], 10, 77, W))
    out = merge(gather(*msgs), plans, N)
    whole = chain_accept(y1, drafts, preds)
    a = int(whole.accepted)
    assert out.accepted == a == N - 1
    assert out.tokens == whole.tokens[: a + 1].tolist()
    assert out.new.tolist() == new_all.tolist()


def test_new_tokens_concatenated_in_column_order():
    plans = (RankPlan(range(0, 2), range(0, 0)), RankPlan(range(2, 3), range(0, 1)), RankPlan(range(3, 5), range(1, 2)))
    msgs = [
        message(4, -1, 0, [4, -1, -1], 0, new=[10, 11]),
        message(4, 0, 0, [4, 8, 8], 0, new=[12]),
        message(4, 0, 0, [4, 9, 9], 1, new=[13, 14]),
    ]
    out = merge(gather(*msgs), plans, N)
    assert out.new.tolist() == [10, 11, 12, 13, 14]
    assert out.tokens == [4]


def test_rank0_y1_is_authoritative():
    plans = (RankPlan(range(0, 3), range(0, 1)), RankPlan(range(3, 5), range(1, 2)))
    # rank 1 computed a different y1 (numerical near-tie): its full acceptance must not count
    msgs = [message(4, 0, 0, [4, 8, 8], 0, new=[1, 2, 3]), message(6, 0, 2, [6, 7, 8], 1, new=[4, 5])]
    out = merge(gather(*msgs), plans, N)
    assert out.tokens == [4] and out.accepted == 0
    assert out.new.tolist() == [1, 2, 3, 4, 5]


def test_rank0_y1_used_when_rank0_has_no_candidates():
    plans = (RankPlan(range(0, 5), range(0, 0)), RankPlan(range(5, 5), range(0, 2)))
    msgs = [message(4, -1, 0, [4, -1, -1], 0, new=[1, 2, 3, 4, 5]), message(6, 0, 2, [6, 7, 8], 0, new=[])]
    out = merge(gather(*msgs), plans, N)
    assert out.tokens == [4]
    msgs[1] = message(4, 1, 1, [4, 7, 8], 0, new=[])
    out = merge(gather(*msgs), plans, N)
    assert out.tokens == [4, 7] and out.accepted == 1


def test_longest_acceptance_wins():
    plans = (RankPlan(range(0, 2), range(0, 2)), RankPlan(range(2, 4), range(2, 4)), RankPlan(range(4, 5), range(4, 6)))
    msgs = [
        message(4, 1, 1, [4, 5, 0], 0, new=[1, 2]),
        message(4, 0, 2, [4, 6, 7], 2, new=[3, 4]),
        message(4, 0, 1, [4, 9, 0], 4, new=[5]),
    ]
    out = merge(gather(*msgs), plans, N)
    assert out.tokens == [4, 6, 7] and out.accepted == 2


def test_ties_go_to_lowest_global_candidate():
    plans = (RankPlan(range(0, 2), range(0, 2)), RankPlan(range(2, 4), range(2, 4)), RankPlan(range(4, 5), range(4, 6)))
    # ranks 1 and 2 both accept 2 drafts; rank 1's candidate (global 3) beats rank 2's (global 4)
    base = [
        message(4, 0, 1, [4, 5, 0], 0, new=[1, 2]),
        message(4, 1, 2, [4, 6, 7], 2, new=[3, 4]),
        message(4, 0, 2, [4, 6, 9], 4, new=[5]),
    ]
    out = merge(gather(*base), plans, N)
    assert out.tokens == [4, 6, 7]
    # the tie-break is by global candidate index, not by rank order
    plans2 = (
        RankPlan(range(0, 2), range(4, 6)),
        RankPlan(range(2, 4), range(2, 4)),
        RankPlan(range(4, 5), range(0, 2)),
    )
    msgs = [
        message(4, 0, 2, [4, 6, 9], 4, new=[1, 2]),
        message(4, 1, 2, [4, 6, 8], 2, new=[3, 4]),
        message(4, 1, 2, [4, 6, 7], 0, new=[5]),
    ]
    out = merge(gather(*msgs), plans2, N)
    assert out.tokens == [4, 6, 7]


def test_diverged_length_raises():
    plans = partition(W, N, 0, 2)
    msgs = [
        message(4, -1, 0, [4, -1, -1], 0, new=[1, 2, 3], length=10),
        message(4, -1, 0, [4, -1, -1], 0, new=[4, 5], length=11),
    ]
    with pytest.raises(LPError, match="diverged"):
        merge(gather(*msgs), plans, N)


def test_diverged_checksum_raises():
    plans = partition(W, N, 0, 3)
    msgs = [
        message(4, -1, 0, [4, -1, -1], 0, new=[1, 2], checksum=5),
        message(4, -1, 0, [4, -1, -1], 0, new=[3, 4], checksum=5),
        message(4, -1, 0, [4, -1, -1], 0, new=[5], checksum=6),
    ]
    with pytest.raises(LPError):
        merge(gather(*msgs), plans, N)


def test_ar_mode_message():
    """mode=ar: W=0, N=2, no candidates: the message is the header and two token slots."""
    plans = partition(0, 2, 0, 2)
    empty = torch.zeros(0, dtype=torch.long)
    acc = chain_accept(t(7), torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long))
    msgs = [pack(t(7), acc, 0, empty, 3, 9, 0) for _ in plans]
    assert msgs[0].numel() == message_size(0, 2)
    out = merge(gather(*msgs), plans, 2)
    assert out.tokens == [7] and out.new.size == 0


def test_successor_rows_merge_in_one_rank_order():
    """Each rank sends its logits rows (x0, its columns, its nodes) padded to a fixed count; the
    merge lists them in one order whatever the split: x0, every column, then every node from
    the last to the first (applied in that order, the first node's row of a token wins)."""
    k, rows = 2, 6
    plans = (RankPlan(range(0, 2), range(0, 1)), RankPlan(range(2, 3), range(1, 3)))

    def rank_message(plan: RankPlan, tokens: list[int]) -> torch.Tensor:
        succ = t([[tok, tok * 10, tok * 10 + 1] for tok in tokens])
        return pack(
            t(4),
            acceptance(-1, 0, [4, -1, -1]),
            plan.candidates.start,
            t([7] * len(plan.columns)),
            10,
            77,
            3,
            succ,
            rows,
        )

    # rank 0: x0 (token 1), columns 2 3, node 5; rank 1: x0, column 4, nodes 6 8
    msgs = [rank_message(plans[0], [1, 2, 3, 5]), rank_message(plans[1], [1, 4, 6, 8])]
    assert msgs[0].numel() == message_size(3, N, rows, k)
    out = merge(gather(*msgs), plans, N, k)
    assert out.successors[:, 0].tolist() == [1, 2, 3, 4, 8, 6, 5]
    assert out.successors[:, 1:].tolist() == [[t * 10, t * 10 + 1] for t in [1, 2, 3, 4, 8, 6, 5]]


def test_a_step_of_plain_batched_decoding_sends_no_successor_row():
    """x0 alone: its row sent (a step with nodes, or whose tree found nothing to draft) or padding
    (a step of plain batched decoding: the budget gave no node, lp/decode/batch.py), merged as one
    row or none. A step without its window fills none of its W slots, which the merge skips as the
    decode's does (`slots`)."""
    k, rows, window = 2, 4, 3
    bounds = np.array([[0, 0, 0, 0]])

    def merged(successors: list[list[int]]) -> np.ndarray:
        sent = t(successors).view(-1, 1 + k)
        msg = pack(t(4), acceptance(-1, 0, [4, -1, -1]), 0, t([]), 10, 77, window, sent, rows)
        assert msg.numel() == message_size(window, N, rows, k)
        best, _, successors = merge_messages(gather(msg), bounds, HEADER + N, k, np.zeros(0, np.int64), window)
        assert best == -1
        return successors

    assert merged([[4, 40, 41]]).tolist() == [[4, 40, 41]]
    assert merged([]).shape == (0, 1 + k)


def test_no_successor_rows_without_k():
    out = merge(gather(message(4, 1, 2, [4, 5, 6], 0, new=[10, 11, 12, 13, 14])), partition(W, N, 2, 1), N)
    assert len(out.successors) == 0


@pytest.mark.parametrize("k", [0, 3])
def test_merge_equals_the_reference(k):
    """Random messages of random plans merge as the plain-Python merge does
    (tests/reference_plan.py): the winning path, the new tokens and the successor rows."""
    import reference_plan

    rng = np.random.default_rng(k)
    for _ in range(300):
        P, Wr, max_commit = int(rng.integers(1, 9)), int(rng.integers(0, 30)), int(rng.integers(1, 7))
        groups = tuple(int(g) for g in rng.integers(1, 6, size=int(rng.integers(0, 12))))
        plans = partition(Wr, 4, sum(groups), P, groups, 1)
        rows = 1 + Wr + sum(groups)
        gathered = rng.integers(0, 50, size=(P, message_size(Wr, max_commit, rows, k)))
        gathered[:, 3:5] = gathered[0, 3:5]
        gathered[:, 0] = np.where(rng.random(P) < 0.7, gathered[0, 0], gathered[:, 0])
        gathered[:, 1] = np.where(rng.random(P) < 0.2, -1, rng.integers(0, 3, size=P))  # ties, and none
        gathered[:, 2] = rng.integers(0, max_commit, size=P)
        out = merge(gathered, plans, max_commit, k)
        tokens, new, accepted, successors = reference_plan.merge(gathered, plans, max_commit, k)
        assert (out.tokens, out.accepted) == (tokens, accepted)
        assert out.new.dtype == new.dtype and np.array_equal(out.new, new)
        assert out.successors.dtype == successors.dtype and np.array_equal(out.successors, successors)

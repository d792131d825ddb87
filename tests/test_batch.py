"""The batch (lp/decode/batch.py): many sequences decoded together, one packed forward a step, each
joining when there is room and leaving the step it ends, its prompt prefilled in chunks beside the
others' decoding, its KV in pages it gives back; and the step's budget (lp/decode/budget.py) that
shares tree nodes among them. Every greedy output stays transformers' greedy decoding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import build_tiny, make_prompt, reference_greedy
from numba import njit

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.auto import CostCurve
from lp.decode.batch import Batch, StepObserver
from lp.decode.budget import Budget, Claim
from lp.decode.loop import Decoder, Request
from lp.decode.phases import DraftState, first_grown
from lp.decode.sequence import Sequence
from lp.engine.pages import PAGE
from lp.errors import LPError
from lp.worker import Worker

MAX_NEW = 32
STEEP = CostCurve((1, 2, 4, 8, 16, 32, 64), (1.0, 1.05, 1.27, 1.55, 1.82, 2.45, 3.72))  # step costs of a CPU's shape
SHAPES = [
    dict(W=5, N=3, G=5),
    dict(mode="ar"),
    dict(W=7, N=5, G=7),
    dict(W=1, N=2, G=15, step_tokens=11, tree_tokens=9, lone_matches=True),
    dict(W=3, N=3, G=15, step_tokens=64),
    dict(W=5, N=3, G=5, tree=False),
]


def _prompts(n: int) -> list[list[int]]:
    """n prompts of 1 to 150 tokens (a one-token prompt among them)."""
    return [[17]] + [make_prompt(i, 2 + (i * 11) % 50, 2 + i % 2) for i in range(1, n)]


class _Sizes(StepObserver):
    def __init__(self, batch) -> None:
        self.batch, self.running, self.forwards = batch, [], 0

    def forward_start(self) -> None:
        self.running.append(len(self.batch.running))
        self.forwards += 1


@pytest.mark.parametrize("max_batch,prefill_chunk,with_prompt", [(4, 512, False), (6, 7, False), (6, 7, True)])
def test_many_sequences_together_each_greedy(max_batch, prefill_chunk, with_prompt, tiny_models):
    """12 prompts of 6 shapes, `max_batch` at a time, joining as others end, long prompts prefilled
    in chunks beside the others' steps (`with_prompt`: each first step in its last chunk's forward):
    each output is its own decode's and greedy decoding's."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    prompts = _prompts(12)
    cfgs = [DecodeConfig(max_new_tokens=MAX_NEW - i, **SHAPES[i % len(SHAPES)]) for i in range(12)]
    batch = dec.batch(max_batch, prefill_chunk=prefill_chunk, first_step_with_prompt=with_prompt)
    sizes = _Sizes(batch)
    batch.observe = sizes
    done = {
        s.request.tag: s.result
        for s in dec.run([Request(p, c, tag=i) for i, (p, c) in enumerate(zip(prompts, cfgs))], batch)
    }
    for i, (p, cfg) in enumerate(zip(prompts, cfgs)):
        alone = dec.generate(p, cfg)
        assert done[i].output_ids == alone.output_ids == reference_greedy(model, p, cfg.max_new_tokens), i
        assert done[i].accepted_per_step == alone.accepted_per_step, i  # the same steps, whatever shares its forwards
    assert max(sizes.running) == max_batch and sizes.forwards < sum(r.steps for r in done.values())
    pool = dec.worker.kv.pool
    assert pool.free == pool.pages - 1 and pool.promised == 0  # every page given back


@pytest.mark.parametrize("with_prompt,graphs", [(False, False), (True, False), (True, True)])
def test_the_first_step_may_share_the_prompts_last_forward(with_prompt, graphs, tiny_models):
    """With `first_step_with_prompt` (the server's), a sequence's first decode step runs in the
    forward that writes its prompt's last chunk (exact-size steps, or fixed-shape ones: the GPU's):
    its first tokens come a forward sooner, and its steps and output are those of the decode that
    waits for its prompt."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model, graphs=graphs, attention="sdpa"), Collective(), set(), 512)
    prompt, cfg = make_prompt(3, 12, 3), DecodeConfig(W=5, N=3, G=5, max_new_tokens=12)  # 36 tokens
    batch = dec.batch(1, prefill_chunk=10, first_step_with_prompt=with_prompt)
    batch.submit(Request(prompt, cfg))
    steps, ended = 0, []
    while not (batch.running and batch.running[0].state.output):
        ended += batch.step()
        steps += 1
    assert steps == (4 if with_prompt else 5)  # 35 prompt tokens before x0: chunks of 10, 10, 10, 5
    while not batch.idle:
        ended += batch.step()
    alone = dec.generate(prompt, cfg)
    assert ended[0].result.output_ids == alone.output_ids == reference_greedy(model, prompt, 12)
    assert ended[0].result.accepted_per_step == alone.accepted_per_step


def test_prompts_are_prefilled_in_chunks_beside_the_decodes(tiny_models):
    """No step feeds more than `prefill_chunk` prompt tokens, a long prompt's chunks share steps with
    a decoding sequence, and the decoding sequence never waits a step for them."""
    model = tiny_models["qwen2"]
    worker = Worker(model)
    dec = Decoder(worker, Collective(), set(), 512)
    batch = dec.batch(2, prefill_chunk=10)
    short, long_ = make_prompt(1, 4, 2), make_prompt(5, 60, 2)  # 8 and 120 tokens
    fed = []
    run = worker.run

    def counting(step):
        fed.append(
            sum(len(s.rows) == 0 for s in step.segments) and sum(s.size for s in step.segments if not len(s.rows))
        )
        return run(step)

    worker.run = counting
    batch.submit(Request(short, DecodeConfig(mode="ar", max_new_tokens=20), tag="short"))
    batch.step()  # the short prompt's prefill
    batch.submit(Request(long_, DecodeConfig(W=5, N=3, G=5, max_new_tokens=20), tag="long"))
    (short_seq,) = batch.running
    ended = []
    while not batch.idle:
        before = len(short_seq.state.output)
        ended += batch.step()
        if short_seq.result is None and short_seq in batch.running:
            assert len(short_seq.state.output) == before + 1  # it decoded in every step
    assert max(fed) == 10 and sorted(s.request.tag for s in ended) == ["long", "short"]
    for seq, p in zip(sorted(ended, key=lambda s: s.request.tag), (long_, short)):
        assert seq.result.output_ids == reference_greedy(model, p, 20)


def test_pages_grow_with_the_tokens_held_and_come_back(tiny_models):
    """A sequence holds the pages its tokens (and a step's) reach, not its promise; admission waits
    while the cache cannot promise a sequence its worst case, then goes on."""
    model = tiny_models["llama"]
    worker = Worker(model, kv_tokens=256)  # 24 pages of 16: the pad page and 23 lent
    dec = Decoder(worker, Collective(), set(), 512)
    batch = dec.batch(8)
    cfg = DecodeConfig(W=5, N=3, G=5, max_new_tokens=100)
    prompts = [make_prompt(i, 10, 2) for i in range(4)]  # 20 tokens: 20 + 100 + a step in 9 pages each
    for i, p in enumerate(prompts):
        batch.submit(Request(p, cfg, tag=i))
    batch.step()
    pool = worker.kv.pool
    assert len(batch.running) == 2 and len(batch.waiting) == 2  # 2 promises of 9 pages fit in 23, not 3
    held = [len(s.kv.pages) for s in batch.running]
    assert held == [2, 2] and pool.free == pool.pages - 1 - 4  # 20 prompt tokens: 2 pages each
    done = list(batch.drain())
    assert len(done) == 4 and [len(s.kv.pages) for s in done] == [0] * 4
    assert pool.free == pool.pages - 1 and pool.promised == 0
    for s in done:
        assert s.result.output_ids == reference_greedy(model, prompts[s.request.tag], 100)


def test_a_sequence_that_never_fits_is_refused_at_once(tiny_models):
    worker = Worker(tiny_models["llama"], kv_tokens=128)
    batch = Decoder(worker, Collective(), set(), 512).batch()
    with pytest.raises(LPError, match="more than the cache's"):
        batch.submit(Request(make_prompt(1, 40, 2), DecodeConfig(max_new_tokens=200)))
    assert batch.idle


def test_a_cancelled_sequence_leaves_the_others_decode(tiny_models):
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    asked = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) >= 3

    prompts = [make_prompt(2, 8, 2), make_prompt(3, 6, 3)]
    cfg = DecodeConfig(W=5, N=3, G=5, max_new_tokens=MAX_NEW)
    requests = [Request(prompts[0], cfg, cancelled=cancel, tag=0), Request(prompts[1], cfg, tag=1)]
    done = {s.request.tag: s.result for s in dec.run(requests, dec.batch(2))}
    assert done[0].steps == 3 and done[0].output_ids == reference_greedy(model, prompts[0], done[0].new_tokens)
    assert done[1].output_ids == reference_greedy(model, prompts[1], MAX_NEW)


@pytest.mark.parametrize("policy", ["shared", "even", "none", "auto"])
def test_the_steps_budget_keeps_every_output_greedy(policy, tiny_models):
    """Whatever the budget gives each sequence's tree (the step's likeliest nodes, an even split,
    none, the cost model's count), the outputs stay greedy; at a fixed size no step feeds more."""
    model = tiny_models["qwen2"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    cost = CostCurve((1, 16, 64, 256), (1.0, 1.05, 1.2, 2.0))
    budget = Budget(policy, step_tokens=40, cost=(lambda: cost) if policy == "auto" else None)
    prompts = _prompts(6)[1:]
    cfg = DecodeConfig(W=1, N=2, G=15, step_tokens=40, lone_matches=True, max_new_tokens=MAX_NEW)
    batch = dec.batch(5, budget=budget)
    sizes = []
    run = dec.worker.run
    dec.worker.run = lambda step: sizes.append(step.tokens) or run(step)
    done = {
        s.request.tag: s.result
        for s in dec.run([Request(p, cfg, shared=True, tag=i) for i, p in enumerate(prompts)], batch)
    }
    for i, p in enumerate(prompts):
        assert done[i].output_ids == reference_greedy(model, p, MAX_NEW), (policy, i)
    decoding = sizes[-10:]  # late steps: every prompt is in
    if policy in ("shared", "even"):
        assert max(decoding) <= 40
    if policy == "none":
        assert all(r.S == 1.0 for r in done.values())
    else:
        assert sum(r.new_tokens for r in done.values()) > sum(r.steps for r in done.values())


def _grown(claims: list[Claim]) -> list[Claim]:
    return [c if c.chances is not None else replace(c, chances=np.linspace(0.9, 0.1, c.cap)) for c in claims]


def test_the_shared_budget_takes_the_likeliest_nodes_of_all():
    """The step's nodes go best first across sequences, each a prefix of its own growth (its
    chances made non-increasing): the likeliest overall, ties to the sequence with fewer so far."""
    claims = [
        Claim(1, 4, True, chances=np.array([0.9, 0.5, 0.6, 0.1])),  # 0.6 after 0.5: counts as 0.5
        Claim(1, 3, True, chances=np.array([0.8, 0.7, 0.2])),
        Claim(3, 1, False, chances=np.array([0.95])),  # its own tree: all of it
    ]
    b = Budget("shared", step_tokens=1 + 1 + 3 + 1 + 4)  # 5 fixed tokens and the own node: 4 shared
    assert b.total(claims) == 4 and b.split(claims, 4) == [2, 2, 1]  # 0.9, 0.8, 0.7, then 0.5
    alike = [Claim(1, 3, True, chances=np.array([0.5, 0.25, 0.125]))] * 3  # fresh trees: the same prior
    assert b.split(alike, 4) == [2, 1, 1] and b.split(alike, 6) == [2, 2, 2]  # round the sequences, not one deep
    even = Budget("even", step_tokens=11)
    assert even.total(claims) == 5 and even.split(claims, 5) == [3, 2, 1]  # 5 nodes: 3 + 2, then its cap
    assert Budget("none").total(claims) == 0 and Budget("none").split(claims, 0) == [0, 0, 1]


def test_the_cost_model_takes_the_nodes_that_pay():
    """With a flat cost (a GPU's bucket) the step takes every node; with a steep one (a CPU) one
    sequence takes a few and many sequences none: W=auto's S(T) against the measured cost, which
    a steeper slope (more S per doubling) moves to more nodes."""
    one = [Claim(1, 40, True)]
    many = [Claim(1, 40, True) for _ in range(32)]
    flat = Budget("auto", cost=lambda: CostCurve((1, 16, 64, 1024, 2048), (1.0, 1.0, 1.0, 1.0, 1.5)))
    assert flat.total(one) == 40 and flat.total(many) == 1024 - 32  # to the costs' edge
    steep = Budget("auto", cost=lambda: STEEP)
    alone = steep.total(one)
    assert 0 < alone < 40 and steep.total(many) == 0
    eager = Budget("auto", cost=steep.cost, slope=lambda: 0.6)
    assert eager.total(one) > alone
    assert eager.total(one, base=500) == eager.total(one)  # a prompt chunk in the step changes nothing
    assert eager.split(_grown(one + [Claim(3, 1, False)]), eager.total(one))[1] == 1  # its own tree: all


def test_what_drafts_add_to_a_step_is_priced_once():
    """A step with drafts pays their successors' top-k and their own attention group
    (`CostCurve.drafting`): nodes that pay on the curve alone do not where that costs more than
    they make, unless other trees in the step pay it already."""
    few = [Claim(1, 40, True) for _ in range(4)]
    assert Budget("auto", cost=lambda: STEEP).total(few) > 0
    costly = replace(STEEP, drafting=0.5)  # half a plain step
    assert Budget("auto", cost=lambda: costly).total(few) == 0
    assert Budget("auto", cost=lambda: costly).total([*few, Claim(3, 2, False)]) > 0


def test_windows_are_priced_only_with_nodes():
    """A step of no node feeds no window of the sequences sharing the nodes: the cost model prices
    it so (one sequence whose window would cost as much as its nodes buy takes them anyway) and
    a sequence given no node decodes as plain decoding does, one token fed a step."""
    steep = Budget("auto", cost=lambda: STEEP)
    assert steep.total([Claim(6, 40, True, window=5)]) == steep.total([Claim(6, 40, True)]) > 0
    # four such: their windows would cost more than the nodes they come with make
    assert steep.total([Claim(6, 40, True, window=5)] * 4) == 0 < steep.total([Claim(6, 40, True)] * 4)


def test_a_shared_tree_given_no_node_feeds_its_pending_tokens_alone(tiny_models):
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    prompt = make_prompt(2, 20, 3)
    cfg = DecodeConfig(W=3, N=3, G=15, step_tokens=64, max_new_tokens=MAX_NEW)
    plain = dec.generate(prompt, cfg, budget=Budget("none"), shared=True)
    assert plain.output_ids == reference_greedy(model, prompt, MAX_NEW)
    assert set(plain.fed_per_step) == {1} and plain.steps == MAX_NEW
    full = dec.generate(prompt, cfg, budget=Budget("none"), shared=False)  # its own tree: window and all
    assert full.output_ids == plain.output_ids and min(full.fed_per_step) > 1


@pytest.mark.parametrize("budget", ["none", "shared"])
def test_a_step_that_drafts_nothing_teaches_no_successor_table(budget, tiny_models):
    """A step of plain batched decoding computes no top-k and sends no successor row (under load
    lookahead costs what plain decoding does), beside a prompt chunk too (small chunks: the second
    prompt prefills while the first decodes); a step with nodes teaches every sequence's table."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    cfg = DecodeConfig(W=3, N=3, G=15, step_tokens=64, max_new_tokens=MAX_NEW)
    prompts = [make_prompt(2, 20, 3), make_prompt(3, 30, 2)]
    requests = [Request(p, cfg, shared=True) for p in prompts]
    batch = dec.batch(max_batch=2, budget=Budget(budget, step_tokens=24), prefill_chunk=8)
    seqs = list(dec.run(requests, batch))
    for seq in seqs:
        assert seq.result.output_ids == reference_greedy(model, seq.request.prompt, MAX_NEW)
        rows = _successor_rows(seq.drafter.state)
        assert (rows == 0) == (budget == "none"), rows


class _Recording(Collective):
    """One rank that keeps every message it gathers."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[list[int]] = []

    def all_gather(self, message):
        self.sent.append(message.tolist())
        return super().all_gather(message)


@pytest.mark.parametrize("budget,with_prompt", [("none", False), ("shared", False), ("shared", True)])
def test_plain_steps_messages_made_at_once_are_those_made_one_by_one(budget, with_prompt, tiny_models, monkeypatch):
    """The messages of a step's plain sequences (`Sequence.plain`: no window, no node, greedy), made
    for all of them at once, are those each sequence's own decision makes, successor rows included
    (a top-k computed where other trees take nodes, none in a step of plain batched decoding),
    beside sequences of other shapes (sampled, with windows, with nodes) and beside prompt chunks
    (`with_prompt`: a first step in its prompt's last chunk's forward)."""
    model = tiny_models["llama"]
    cfgs = [
        DecodeConfig(mode="ar", max_new_tokens=MAX_NEW),
        DecodeConfig(W=1, N=2, G=15, lone_matches=True, tree_tokens=9, max_new_tokens=MAX_NEW),
        DecodeConfig(W=3, N=3, G=15, step_tokens=64, max_new_tokens=MAX_NEW),
        DecodeConfig(W=5, N=3, G=5, max_new_tokens=MAX_NEW // 2),
        DecodeConfig(mode="ar", temperature=0.8, seed=3, max_new_tokens=MAX_NEW),
    ]
    steps = []  # per step of the first decode: the sequences made at once, prompt chunks, successors
    made = Batch._plain

    def counted(self, decoding, step, first):
        groups = made(self, decoding, step, first)
        steps.append((sorted(decoding[i].request.tag for g in groups for i in g.members), first, self._successors))
        return groups

    monkeypatch.setattr(Batch, "_plain", counted)
    sent = {}
    for at_once in (True, False):
        if not at_once:
            monkeypatch.setattr(Sequence, "plain", property(lambda seq: False))
        comm = _Recording()
        dec = Decoder(Worker(model), comm, set(), 512)
        batch = dec.batch(
            max_batch=5, budget=Budget(budget, step_tokens=12), prefill_chunk=16, first_step_with_prompt=with_prompt
        )
        requests = [Request(make_prompt(i, 10 + 3 * i, 3), c, shared=i in (1, 2), tag=i) for i, c in enumerate(cfgs)]
        for seq in dec.run(requests, batch):
            if seq.cfg.temperature == 0:
                assert seq.result.output_ids == reference_greedy(model, seq.request.prompt, seq.cfg.max_new_tokens)
        sent[at_once] = comm.sent
        if at_once:
            first_decode = list(steps)
    assert sent[True] == sent[False] and len(sent[True]) >= MAX_NEW
    made_at_once = [tags for tags, _, _ in first_decode]
    assert all(3 not in tags and 4 not in tags for tags in made_at_once)  # a window's, a sampled one's: alone
    assert sum(0 in tags for tags in made_at_once) >= MAX_NEW - 1  # mode=ar's: with the others at every step
    assert any(tags and first for tags, first, _ in first_decode)  # beside prompt chunks
    assert any(1 in tags and 2 in tags and top for tags, _, top in first_decode)  # given no node, a top-k computed
    if budget == "none":  # once the windowed one has ended: steps of plain batched decoding, no top-k
        assert any(1 in tags and 2 in tags and not top for tags, _, top in first_decode)
    else:  # and some steps give them nodes
        assert any(not (1 in tags and 2 in tags) for tags in made_at_once if 0 in tags)


def test_a_tree_that_found_nothing_to_draft_still_learns(tiny_models):
    """A step with nodes to give whose one tree is empty (a prompt of distinct tokens: no text
    match, no n-gram, no successor row yet, no window) feeds x0 alone, yet its x0 row teaches the
    table: only a budget that gives no node makes a step teach nothing."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    cfg = DecodeConfig(W=1, N=2, G=15, step_tokens=24, max_new_tokens=MAX_NEW)
    batch = dec.batch(max_batch=1, budget=Budget("shared", step_tokens=24))
    batch.submit(Request(list(range(3, 23)), cfg, shared=True))
    for _ in range(8):  # the prefill, then two decode steps: a step's rows are written in the next
        batch.step()
        if batch.running and len(batch.running[0].state.fed_per_step) == 2:
            break
    (seq,) = batch.running
    assert seq.state.fed_per_step[0] == 1  # x0 alone: the tree found nothing
    assert _successor_rows(seq.drafter.state) >= 1


def test_a_step_whose_nodes_a_prompt_chunk_crowded_out_still_learns(tiny_models):
    """A 24-token step whose prompt chunk takes all 24 tokens gives the decoding sequence no node,
    yet the budget would give some without the chunk: the step still teaches its table."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    cfg = DecodeConfig(W=1, N=2, G=15, step_tokens=24, max_new_tokens=MAX_NEW)
    batch = dec.batch(max_batch=2, budget=Budget("shared", step_tokens=24), prefill_chunk=24)
    batch.submit(Request(list(range(3, 23)), cfg, shared=True))  # 20 tokens: prefilled in step 1
    batch.submit(Request(make_prompt(5, 40, 3), cfg, shared=True))  # 120: 4 tokens in step 1, then 24 a step
    for _ in range(3):  # step 2 crowded out (its chunk fills the step); step 3 writes its rows
        batch.step()
    first = batch.running[0]
    assert first.state.fed_per_step[:2] == [1, 1]  # x0 alone: no node in either step
    assert _successor_rows(first.drafter.state) >= 1


@njit
def _successor_rows(state: DraftState) -> int:
    """The tokens a sequence's successor table holds a row of."""
    held = 0
    for t in range(state.table.table.shape[0]):
        held += state.table.table[t, 0] >= 0
    return held


def test_a_trees_first_grown_nodes_are_a_tree():
    """The budget's cut: the first k nodes of the growth, in subtree order, parents remapped, root
    subtrees recounted."""
    # subtree order: root 0 (grown 0) with children 1 (grown 2) and 2 (grown 4); root 3 (grown 1) with 4 (grown 3)
    tokens = np.array([10, 11, 12, 20, 21])
    parents = np.array([-1, 0, 0, -1, 3])
    labels = np.array([0, 1, 2, 3, 4])
    growth = np.array([0, 2, 4, 1, 3])
    groups = np.array([3, 2])
    for k, want_tokens, want_parents, want_groups in (
        (5, [10, 11, 12, 20, 21], [-1, 0, 0, -1, 3], [3, 2]),
        (4, [10, 11, 20, 21], [-1, 0, -1, 2], [2, 2]),
        (2, [10, 20], [-1, -1], [1, 1]),
        (1, [10], [-1], [1]),
        (0, [], [], []),
    ):
        t, p, lab, g, sizes = first_grown(tokens, parents, labels, growth, groups, k)
        assert (t.tolist(), p.tolist(), sizes.tolist()) == (want_tokens, want_parents, want_groups), k
        assert (g < k).all() and lab.tolist() == [int(x) - 10 if x < 20 else int(x) - 17 for x in t]


@njit
def _kept_tree(state: DraftState) -> tuple:
    return state.grown


def test_a_tree_grown_to_k_nodes_is_the_first_k_of_a_larger_growth():
    """The batch grows no shared tree past the step's nodes: best first, the smaller growth is the
    first nodes of the larger one, so the step's plans are the same."""
    from lp.decode.drafter import Drafter

    cfg = DecodeConfig(W=1, N=2, G=15, lone_matches=True, draft_len=6, tree_tokens=40)
    drafter = Drafter(cfg, make_prompt(2, 12, 4, vocab=40), vocab=64)
    rng = np.random.default_rng(0)  # every token's successors: a tree of successor rows beside the drafts
    drafter.table.update(np.stack([np.r_[t, rng.permutation(64)[: cfg.successors_sent]] for t in range(64)]))
    full = drafter.grow(1)
    whole = _kept_tree(drafter.state)
    assert len(full) == drafter.cap(1) == 40
    for k in (1, 3, 10, 39):
        chances = drafter.grow(1, k)
        assert chances.tolist() == full[:k].tolist()
        cut = first_grown(*whole, k)
        assert all(np.array_equal(a, b) for a, b in zip(_kept_tree(drafter.state), cut)), k
    assert len(drafter.grow(1, 0)) == 0 and len(drafter.grow(1, 100)) == 40


def test_a_batch_grows_no_shared_tree_past_the_steps_nodes(tiny_models):
    """Three sequences sharing 12-token steps: no tree grows past what the step has beyond their
    pending tokens (its cap is 40), and the outputs are plain decoding's."""
    dec = Decoder(Worker(tiny_models["llama"]), Collective(), set(), 512)
    cfg = DecodeConfig(W=1, N=2, G=15, lone_matches=True, draft_len=6, tree_tokens=40, max_new_tokens=24)
    prompts = [make_prompt(seed, 12, 3) for seed in (2, 3, 4)]
    batch = dec.batch(3, Budget("shared", step_tokens=12))
    for i, p in enumerate(prompts):
        batch.submit(Request(p, cfg, shared=True, tag=i))
    sizes, done = [], {}
    while not batch.idle:
        for s in batch.step():
            done[s.request.tag] = s.result.output_ids
        decoding = [s for s in batch.running if s.decoding]
        sizes += [len(_kept_tree(s.drafter.state)[0]) for s in decoding]
    assert 0 < max(sizes) <= 12 - 1 < cfg.tree_budget(1)
    assert [done[i] for i in range(3)] == [reference_greedy(tiny_models["llama"], p, 24) for p in prompts]


def test_one_token_prompts_and_max_batch_one(tiny_models):
    model = tiny_models["mistral"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    cfg = DecodeConfig(W=5, N=3, G=5, max_new_tokens=16)
    prompts = [[5], [9], make_prompt(1, 5, 2)]
    done = sorted(
        dec.run([Request(p, cfg, tag=i) for i, p in enumerate(prompts)], dec.batch(1)), key=lambda s: s.request.tag
    )
    assert [s.result.output_ids for s in done] == [reference_greedy(model, p, 16) for p in prompts]


def test_bad_batch_settings_are_refused(tiny_models):
    dec = Decoder(Worker(build_tiny("llama")), Collective(), set(), 512)
    for kw, fragment in ((dict(max_batch=0), "max_batch"), (dict(prefill_chunk=0), "prefill_chunk")):
        with pytest.raises(LPError, match=fragment):
            dec.batch(**kw)
    with pytest.raises(LPError, match="budget must be one of"):
        Budget("greedy")
    with pytest.raises(LPError, match="W=600 N=3 G=5"):
        dec.batch().submit(Request([1, 2, 3], DecodeConfig(W=600, max_new_tokens=4)))
    assert PAGE == 16

"""Exactness of the decode loop on tiny random Llama, Qwen2 and Mistral models: lookahead
decoding (any W, N, G, any number of ranks) must give exactly plain greedy decoding."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch
from helpers import ARCHS, make_prompt, reference_greedy

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.drafter import NO_MEMORY
from lp.decode.loop import Decoder, Request, StepObserver
from lp.decode.record import collector_paused
from lp.errors import LPError
from lp.lookahead.drafts import step_drafts
from lp.lookahead.pool import NGramPool
from lp.lookahead.text import TextIndex
from lp.lookahead.window import JacobiWindow
from lp.worker import Worker

MAX_NEW = 48
CONFIGS = [(2, 5, 5), (3, 3, 3), (5, 7, 7), (5, 15, 15), (3, 4, 0), (5, 7, 0)]  # (N, W, G)


PROMPT = make_prompt()


@pytest.fixture(scope="module")
def refs(tiny_models):
    return {arch: reference_greedy(m, PROMPT, MAX_NEW) for arch, m in tiny_models.items()}


def decode(model, prompt, eos=(), max_context=512, collective=None, rehearse=None, **cfg):
    dec = Decoder(Worker(model), collective or Collective(), set(eos), max_context, rehearse=rehearse)
    return dec.generate(prompt, DecodeConfig(**cfg))


@pytest.mark.parametrize("arch", ARCHS)
def test_reference_is_not_degenerate(arch, refs):
    """Guard for the fixtures: the reference output must be varied enough to test anything."""
    assert len(refs[arch]) == MAX_NEW
    assert len(set(refs[arch])) >= 5


@pytest.mark.parametrize("N,W,G", CONFIGS)
@pytest.mark.parametrize("arch", ARCHS)
def test_lookahead_equals_greedy(arch, N, W, G, tiny_models, refs):
    col = CountingCollective()
    g = decode(tiny_models[arch], PROMPT, collective=col, W=W, N=N, G=G, max_new_tokens=MAX_NEW)
    assert g.output_ids == refs[arch]
    assert g.new_tokens == MAX_NEW
    assert sum(g.accepted_per_step) == MAX_NEW and len(g.accepted_per_step) == g.steps
    assert all(1 <= a <= DecodeConfig(W=W, N=N, G=G).max_draft + 1 for a in g.accepted_per_step)
    assert col.calls == g.steps  # one all-gather per step (no handshake on one rank)
    assert g.S == pytest.approx(MAX_NEW / g.steps)
    if G == 0:
        assert g.steps == MAX_NEW  # nothing to verify: one token per step


@pytest.mark.parametrize("arch", ARCHS)
def test_verification_accepts_drafts(arch, tiny_models, refs):
    """At least one configuration must accept several tokens in a step (S > 1), and some step
    must accept a fully matched n-gram (N tokens, bonus included), and with text drafts some
    step must commit more than N: otherwise the exactness tests above would not exercise
    verification at all."""
    longest = {}
    for N, W, G in CONFIGS:
        if G:
            g = decode(tiny_models[arch], PROMPT, W=W, N=N, G=G, max_new_tokens=MAX_NEW)
            assert g.output_ids == refs[arch]
            longest[(N, W, G)] = max(g.accepted_per_step)
    assert any(a > 1 for a in longest.values()), longest
    assert any(a > key[0] for key, a in longest.items()), longest
    full = [
        max(decode(tiny_models[arch], PROMPT, W=W, N=N, G=G, max_new_tokens=MAX_NEW, drafts="pool").accepted_per_step)
        == N
        for N, W, G in CONFIGS
        if G
    ]
    assert any(full), "no pool n-gram was ever fully matched"


VARIANTS = [
    dict(drafts="pool", tree=False),
    dict(drafts="pool", tree=True),
    dict(drafts="pool+text", tree=False),
    dict(drafts="pool+text", tree_tokens=7, draft_len=3),
    dict(drafts="pool+text", tree_tokens=40),
    dict(pool_size=30, pool_order="frequent", text_drafts=8),
    dict(pool_order="recent", draft_len=4),
    dict(lone_matches=True, tree_tokens=12, step_tokens=34),
    dict(continuation_len=4, tree_tokens=40),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()))
@pytest.mark.parametrize("N,W,G", [(2, 5, 5), (5, 7, 7)])
def test_draft_and_tree_variants_equal_greedy(N, W, G, variant, tiny_models, refs):
    """Every draft source, with and without shared prefixes, any budget: still greedy."""
    for arch in ("llama", "qwen2"):
        g = decode(tiny_models[arch], PROMPT, W=W, N=N, G=G, max_new_tokens=MAX_NEW, **variant)
        assert g.output_ids == refs[arch], (arch, variant)
        cfg = DecodeConfig(W=W, N=N, G=G, **variant)
        pending = min(cfg.max_draft, cfg.tree_limit) + 1  # the previous step's tokens, x0 last
        assert all(t <= pending + (W - 1) + W * (N - 2) + cfg.tree_limit for t in g.fed_per_step)


def test_step_tokens_cap_steps_and_deepen_trees(tiny_models, refs):
    """`step_tokens`: no step feeds more tokens, the output stays greedy, and a step after a
    one-token commit verifies the tree the size leaves (10 nodes; a fixed tree that fits the
    same size would have 5)."""
    cfg = dict(W=1, N=2, G=5, tree_tokens=10, step_tokens=11)
    assert DecodeConfig(**cfg).largest_step == 11 == DecodeConfig(W=1, N=2, G=5, tree_tokens=5).largest_step
    for arch in ("llama", "qwen2"):
        g = decode(tiny_models[arch], PROMPT, max_new_tokens=MAX_NEW, **cfg)
        assert g.output_ids == refs[arch], arch
        assert max(g.fed_per_step) == 11, arch
        after_one = [t for n, t in zip(g.accepted_per_step, g.fed_per_step[1:]) if n == 1]
        assert 11 in after_one, arch  # the pending token and 10 tree nodes


@pytest.mark.parametrize("arch", ARCHS)
def test_ar_mode(arch, tiny_models, refs):
    col = CountingCollective()
    g = decode(tiny_models[arch], PROMPT, collective=col, mode="ar", max_new_tokens=MAX_NEW)
    assert g.output_ids == refs[arch]
    assert g.steps == MAX_NEW and g.accepted_per_step == [1] * MAX_NEW
    assert col.calls == g.steps


class _Order(StepObserver):
    """The order of a decode's forwards (f) and message reads (r)."""

    def __init__(self) -> None:
        self.events = ""

    def forward_start(self) -> None:
        self.events += "f"

    def message_read(self) -> None:
        self.events += "r"


@pytest.mark.parametrize(
    "arch,engine",
    [(a, {}) for a in ARCHS] + [("llama", dict(graphs=True)), ("qwen2", dict(graphs=True, attention="flex"))],
)
def test_ar_mode_engines(arch, engine, tiny_models, refs):
    """`mode=ar`, eager and at fixed shapes (the step as a GPU captures it, run eagerly): the same
    tokens, one step a token, each step's forward then its message read."""
    col, order = CountingCollective(), _Order()
    dec = Decoder(Worker(tiny_models[arch], **engine), col, set(), 512)
    g = dec.generate(PROMPT, DecodeConfig(mode="ar", max_new_tokens=MAX_NEW), observer=order)
    assert g.output_ids == refs[arch]
    assert g.steps == MAX_NEW and g.accepted_per_step == [1] * MAX_NEW == g.fed_per_step
    assert col.calls == MAX_NEW
    assert order.events == "fr" * MAX_NEW


def test_ar_stops_at_eos_and_max_new_tokens(tiny_models, refs):
    """At an EOS or max_new_tokens plain decoding stops at once; the next sequence on the same
    decoder is exact all the same."""
    ref, model = refs["mistral"], tiny_models["mistral"]
    for n in (1, 2, 5):
        assert decode(model, PROMPT, mode="ar", max_new_tokens=n).output_ids == ref[:n]
    col = CountingCollective()
    dec = Decoder(Worker(model), col, set(), 512)
    tried = 0
    for pos, tok in enumerate(ref):
        if tok in ref[:pos] or pos == 0:
            continue
        dec.eos_ids = frozenset([tok])
        before = col.calls
        g = dec.generate(PROMPT, DecodeConfig(mode="ar", max_new_tokens=MAX_NEW))
        assert g.output_ids == ref[: pos + 1] and g.steps == pos + 1, (tok, pos)
        assert col.calls - before == g.steps
        tried += 1
    assert tried >= 4
    dec.eos_ids = frozenset()
    assert dec.generate(PROMPT, DecodeConfig(mode="ar", max_new_tokens=MAX_NEW)).output_ids == ref


@pytest.mark.parametrize("N,W,G,successors,continuation_len", [(5, 7, 7, None, 0), (3, 4, 6, 0, 0), (2, 5, 5, None, 4)])
def test_rehearsals_change_no_decode(N, W, G, successors, continuation_len, tiny_models, refs):
    """Rehearsing each step's plan while the device computes (on by default on CUDA, asked
    for here) leaves the output, the steps and their acceptances as they are, at one rank and
    at two."""
    model = tiny_models["llama"]
    cfg = dict(W=W, N=N, G=G, successors=successors, continuation_len=continuation_len, max_new_tokens=MAX_NEW)
    plain = decode(model, PROMPT, rehearse=False, **cfg)
    rehearsed = decode(model, PROMPT, rehearse=True, **cfg)
    assert plain.output_ids == rehearsed.output_ids == refs["llama"]
    assert plain.accepted_per_step == rehearsed.accepted_per_step and plain.steps > 0
    assert plain.fed_per_step == rehearsed.fed_per_step
    (a, _), (b, _) = (run_ranks(model, 2, [PROMPT] * 2, DecodeConfig(**cfg), rehearse=r) for r in (False, True))
    assert [g.output_ids for g in a + b] == [refs["llama"]] * 4
    assert [(g.accepted_per_step, g.fed_per_step) for g in a] == [(g.accepted_per_step, g.fed_per_step) for g in b]


def test_each_step_is_one_forward_then_one_read(tiny_models, refs):
    """Lookahead, sampling and plain decoding alike: each step queues its forward, then reads its
    gathered messages once."""
    model = tiny_models["llama"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    for cfg in (
        DecodeConfig(W=5, N=3, G=5, max_new_tokens=MAX_NEW),
        DecodeConfig(mode="ar", temperature=0.8, seed=3, max_new_tokens=24),
    ):
        order = _Order()
        g = dec.generate(PROMPT, cfg, observer=order)
        assert order.events == "fr" * g.steps, cfg
        if not cfg.temperature:
            assert g.output_ids == refs["llama"]


def test_without_pool_from_prompt_and_other_seeds(tiny_models, refs):
    for seed in (0, 1, 7):
        g = decode(
            tiny_models["llama"], PROMPT, W=5, N=4, G=5, max_new_tokens=MAX_NEW, seed=seed, pool_from_prompt=False
        )
        assert g.output_ids == refs["llama"]


def test_single_token_prompt(tiny_models):
    model = tiny_models["qwen2"]
    ref = reference_greedy(model, [17], 24)
    for cfg in (dict(W=5, N=3, G=5), dict(W=7, N=5, G=7), dict(mode="ar")):
        assert decode(model, [17], max_new_tokens=24, **cfg).output_ids == ref


@pytest.mark.parametrize("N,W,G", [(5, 7, 7), (3, 3, 3)])
def test_max_new_tokens_is_never_exceeded(N, W, G, tiny_models, refs):
    for n in range(1, 13):
        g = decode(tiny_models["llama"], PROMPT, W=W, N=N, G=G, max_new_tokens=n)
        assert g.output_ids == refs["llama"][:n], n


@pytest.mark.parametrize("N,W,G", [(5, 7, 7), (3, 3, 3), (2, 5, 5)])
def test_eos_stops_generation(N, W, G, tiny_models, refs):
    ref = refs["mistral"]
    tried = 0
    for pos, tok in enumerate(ref):
        if tok in ref[:pos] or pos == 0:
            continue  # take tokens at their first occurrence, past the first position
        col = CountingCollective()
        g = decode(
            tiny_models["mistral"], PROMPT, eos=[tok, 100_000], collective=col, W=W, N=N, G=G, max_new_tokens=MAX_NEW
        )
        assert g.output_ids == ref[: pos + 1], (tok, pos)
        assert g.output_ids[-1] == tok and g.steps == len(g.accepted_per_step)
        assert col.calls == g.steps
        tried += 1
    assert tried >= 4


def test_eos_in_prompt_does_not_stop(tiny_models, refs):
    eos = PROMPT[-1]  # x0 itself is an EOS id: it was not generated, decoding goes on
    if eos in refs["llama"]:
        pytest.skip("the reference output contains the prompt's last token")
    g = decode(tiny_models["llama"], PROMPT, eos=[eos], W=5, N=3, G=5, max_new_tokens=MAX_NEW)
    assert g.output_ids == refs["llama"]


def test_context_limit(tiny_models):
    model = tiny_models["llama"]
    ctx = len(PROMPT) + 20
    g = decode(model, PROMPT, max_context=ctx, W=15, N=5, G=15, max_new_tokens=20)
    assert g.output_ids == reference_greedy(model, PROMPT, 20)
    with pytest.raises(LPError, match="context"):
        decode(model, PROMPT, max_context=ctx, W=15, N=5, G=15, max_new_tokens=21)


def test_bad_settings_raise(tiny_models):
    model = tiny_models["llama"]
    for cfg in (
        dict(W=0),
        dict(N=1),
        dict(G=-1),
        dict(max_new_tokens=0),
        dict(mode="beam"),
        dict(W=2.5),
        dict(N=True),
        dict(step_tokens=6, W=3, N=3),
        dict(lone_matches=1),
        dict(tree_tokens=-1),
    ):
        with pytest.raises(LPError):
            decode(model, PROMPT, **cfg)
    with pytest.raises(LPError, match="empty"):
        decode(model, [], W=5, N=3, G=5)


def test_decoder_is_reusable(tiny_models):
    """Several sequences on one Decoder (KV reset, capacity growth) give fresh results."""
    model = tiny_models["qwen2"]
    dec = Decoder(Worker(model), Collective(), set(), 512)
    short, long_ = make_prompt(5, 4, 2), make_prompt(6, 20, 3)
    cfg = DecodeConfig(W=7, N=5, G=7, max_new_tokens=30)
    a = dec.generate(short, cfg).output_ids
    b = dec.generate(long_, cfg).output_ids
    c = dec.generate(short, cfg).output_ids
    assert a == c == reference_greedy(model, short, 30)
    assert b == reference_greedy(model, long_, 30)


class _Collecting(StepObserver):
    """Whether Python's garbage collector was on at each step."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def forward_start(self) -> None:
        self.seen.append(gc.isenabled())


@pytest.mark.parametrize("on", [True, False])
def test_garbage_collection_pauses_while_decoding(tiny_models, on):
    """No collection can stall a step; afterwards the collector is as the caller left it."""
    dec = Decoder(Worker(tiny_models["llama"]), Collective(), set(), 512)
    watch = _Collecting()
    gc.enable() if on else gc.disable()
    try:
        dec.generate(PROMPT, DecodeConfig(W=5, N=3, G=5, max_new_tokens=8), observer=watch)
        assert watch.seen and not any(watch.seen)
        assert gc.isenabled() == on
    finally:
        gc.enable()


def test_collector_pause_nests_and_survives_errors():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner block leaves it as it found it: off
            raise RuntimeError
    assert gc.isenabled()


# ---------------------------------------------------------------------------------------------
# Lookahead Parallelism simulated in one process: P decoders (each with its own Worker and KV
# over the same weights) in P threads, joined by an in-memory all-gather.


class _Hub:
    def __init__(self, P: int) -> None:
        self.barrier = threading.Barrier(P, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * P


class CountingCollective(Collective):
    """A collective that counts its all-gathers (`calls`) and keeps their sizes (`sizes`)."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(rank, world_size)
        self.calls = 0
        self.sizes: list[int] = []

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.sizes.append(message.numel())
        return super().all_gather(message)


class ThreadCollective(CountingCollective):
    def __init__(self, hub: _Hub, rank: int, P: int) -> None:
        super().__init__(rank, P)
        self.hub = hub

    def all_gather(self, message: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.hub.slots[self.rank] = message.clone()
        self.hub.barrier.wait()
        out = torch.stack(self.hub.slots)
        self.hub.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out


def run_ranks(model, P: int, prompts: list[list[int]], cfg: DecodeConfig, eos=(), verifiers=None, rehearse=None):
    """Decode on P ranks as threads (`verifiers`: one per rank, default the decoder's own)."""
    hub = _Hub(P)
    cols = [ThreadCollective(hub, r, P) for r in range(P)]
    results: list = [None] * P

    def body(r: int) -> None:
        try:
            verifier = verifiers[r] if verifiers else None
            dec = Decoder(Worker(model), cols[r], set(eos), 512, rehearse=rehearse)
            results[r] = dec.generate(prompts[r], cfg, verifier=verifier)
        except LPError as e:  # raised symmetrically by every rank (e.g. at the handshake)
            results[r] = e
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            results[r] = e
            hub.barrier.abort()  # do not leave the other ranks waiting

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}") for r in range(P)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    return results, cols


PARALLEL = [(5, 7, 7), (3, 3, 3), (2, 5, 5), (3, 3, 7)]


@pytest.mark.parametrize("graphs,temperature", [(False, 0.0), (True, 0.0), (False, 0.7)])
def test_one_replica_keeps_the_accepted_drafts_kv(graphs, temperature, tiny_models, refs):
    """One replica keeps each step's accepted drafts' KV (lp/engine/kv.py `move`) and feeds only
    x0 before the window and tree: the sequence's pages then hold exactly the KV a causal prefill
    of its text gives, slot by slot, and a greedy output stays greedy. The engines: exact sizes
    and fixed shapes; the verifiers: greedy and sampling (its path: the first alive node of each
    level)."""
    model = tiny_models["llama"]
    cfg = DecodeConfig(W=3, N=3, G=5, tree_tokens=12, max_new_tokens=MAX_NEW, temperature=temperature)
    worker = Worker(model, graphs=graphs, compile=False)
    batch = Decoder(worker, Collective(), set(), 512).batch()
    batch.submit(Request(PROMPT, cfg))
    batch.step()
    (seq,) = batch.running
    while len(seq.state.output) < MAX_NEW - cfg.max_commit:
        batch.step()
    g = seq.state
    assert g.output == refs["llama"][: len(g.output)] or temperature > 0
    assert max(g.accepted) > 1  # drafts were kept, not only bonus tokens
    window = (cfg.W - 1) + cfg.W * (cfg.N - 2)
    assert all(t <= 1 + window + 12 for t in g.fed_per_step)  # x0, the window and the tree, no re-fed tokens
    kept = seq.kv.length
    assert kept == len(PROMPT) + len(g.output) - 1  # all but x0, the last token
    fresh = Worker(model)
    other = fresh.sequence(kept, 1)
    fresh.prefill(other, (PROMPT + g.output)[:kept])
    mine, theirs = seq.kv.slots(0, kept), other.slots(0, kept)
    for a, b in zip(worker.kv.k + worker.kv.v, fresh.kv.k + fresh.kv.v):
        torch.testing.assert_close(a[:, mine], b[:, theirs], atol=1e-5, rtol=1e-4)


def test_step_tokens_with_kept_drafts_feed_the_whole_step(tiny_models, refs):
    """With its drafts' KV kept, a step's tree gets what x0 and the window leave of `step_tokens`
    whatever the last step committed: over P ranks, where the drafts are re-fed, a step after a
    long commit gets less, so one replica takes no more steps."""
    cfg = dict(W=1, N=2, G=5, tree_tokens=10, step_tokens=11, max_new_tokens=MAX_NEW)
    one = decode(tiny_models["llama"], PROMPT, **cfg)
    two, _ = run_ranks(tiny_models["llama"], 2, [PROMPT] * 2, DecodeConfig(**cfg))
    assert one.output_ids == two[0].output_ids == refs["llama"]
    assert one.steps <= two[0].steps
    assert max(one.fed_per_step) == 11 and max(two[0].fed_per_step) == 11


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("N,W,G", PARALLEL)
def test_parallel_ranks_equal_greedy(P, N, W, G, tiny_models, refs):
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=MAX_NEW)
    results, cols = run_ranks(tiny_models["llama"], P, [PROMPT] * P, cfg)
    for r, g in enumerate(results):
        assert not isinstance(g, BaseException), g
        assert g.output_ids == refs["llama"], r
        assert g.accepted_per_step == results[0].accepted_per_step, r
        assert cols[r].calls == g.steps + 1


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("N,W,G", PARALLEL)
def test_parallel_split_does_not_change_acceptance(P, N, W, G, tiny_models):
    """The ranks together verify exactly the candidates one rank would verify, and the
    columns' new tokens are the same, so every step accepts what it accepts with P=1."""
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=MAX_NEW)
    one = decode(tiny_models["llama"], PROMPT, W=W, N=N, G=G, max_new_tokens=MAX_NEW)
    results, _ = run_ranks(tiny_models["llama"], P, [PROMPT] * P, cfg)
    assert results[0].accepted_per_step == one.accepted_per_step


@pytest.mark.parametrize("P,W,N,G,temperature", [(2, 3, 3, 7, 0.0), (3, 7, 5, 7, 0.0), (2, 3, 3, 7, 0.7)])
def test_each_rank_verifies_its_own_candidates(P, W, N, G, temperature, tiny_models):
    """Rank r must verify its own nodes with their parents: at greedy steps its run of the tree in
    pre-order (tests/reference_plan.py), after its first node's ancestors, which it feeds again but
    does not own (lp/decode/shares.py); when sampling, the whole root subtrees
    `partition(...)[r].candidates`."""
    import reference_plan

    from lp.decode.shares import share_cap
    from lp.partition import partition
    from lp.verify.verifier import GreedyVerifier, SamplingVerifier

    checked, wrong = [], []
    cfg = DecodeConfig(W=W, N=N, G=G, max_new_tokens=24, temperature=temperature)

    def own_nodes(s, rank: int) -> tuple[list[int], tuple[int, ...], int]:
        """The tokens and parents a rank verifies, and how many of them are another rank's."""
        parents = s.tree.parents
        if temperature:
            plan = partition(W, N, s.tree.size, P, s.tree.groups(), candidate_tokens=1)[rank]
            want = s.tree.slice(plan.candidates.start, plan.candidates.stop)
            return want.tokens.tolist(), want.parents, 0
        order = reference_plan.preorder(parents)
        ordered, depth = reference_plan.in_order(parents, order)
        cap = share_cap(cfg, P) - (s.layout.m - 1)
        fills = [reference_plan.split_fill(W, N, depth, P, limit) for limit in range(1, 1000)]
        shares = next(f for f in fills if f is not None)  # the least limit that fills
        _, _, c, d = shares[rank]
        assert max(reference_plan.split_cost(W, N, depth, x) for x in shares) <= cap
        ancestors = []
        up = ordered[c] if d > c else -1
        while up >= 0:
            ancestors.insert(0, up)
            up = ordered[up]
        nodes = ancestors + list(range(c, d))
        local = {q: i for i, q in enumerate(nodes)}
        tokens = [int(s.tree.tokens[order[q]]) for q in nodes]
        return tokens, tuple(local.get(ordered[q], -1) for q in nodes), len(ancestors)

    def checking(rank: int):
        base = SamplingVerifier(temperature, 0, 1.0, 0, 0) if temperature else GreedyVerifier()

        def verify(s):
            tokens, parents, owned = own_nodes(s, rank)
            checked.append(len(tokens) - owned)
            if s.nodes.tolist() != tokens or tuple(s.parents.tolist()) != parents or s.owned != owned:
                wrong.append((rank, s.nodes.tolist(), tokens, s.owned, owned))
            return base(s)

        return verify

    results, _ = run_ranks(tiny_models["llama"], P, [PROMPT] * P, cfg, verifiers=[checking(r) for r in range(P)])
    assert not any(isinstance(g, BaseException) for g in results), results
    assert sum(checked) > 0
    assert not wrong, f"{len(wrong)} rank-steps verified other candidates, first: {wrong[0]}"


@pytest.mark.parametrize("P,step_tokens", [(2, 256), (3, 384)])
def test_greedy_shares_fill_their_buckets(P, step_tokens, tiny_models, refs):
    """Over P ranks a greedy step's tree is cut anywhere and each rank's share is cut to the
    bucket of an even share (lp/decode/shares.py): no rank feeds more, some step fills it, and
    the output is greedy decoding's."""
    from lp.decode.shares import share_cap

    cfg = DecodeConfig(W=3, N=3, G=15, step_tokens=step_tokens, max_new_tokens=MAX_NEW)
    results, _ = run_ranks(tiny_models["llama"], P, [PROMPT] * P, cfg)
    cap = share_cap(cfg, P)
    for g in results:
        assert not isinstance(g, BaseException), g
        assert g.output_ids == refs["llama"] and g.accepted_per_step == results[0].accepted_per_step
        assert max(g.fed_per_step) <= cap
    assert max(max(g.fed_per_step) for g in results) == cap


@pytest.mark.parametrize("P", [2, 3])
def test_parallel_ranks_ar(P, tiny_models, refs):
    cfg = DecodeConfig(mode="ar", max_new_tokens=MAX_NEW)
    results, cols = run_ranks(tiny_models["llama"], P, [PROMPT] * P, cfg)
    for r, g in enumerate(results):
        assert not isinstance(g, BaseException), g
        assert g.output_ids == refs["llama"], r
        assert cols[r].calls == MAX_NEW + 1  # the handshake, then one all-gather a step


def test_parallel_ranks_eos(tiny_models, refs):
    ref = refs["llama"]
    pos = next(i for i, tok in enumerate(ref) if i > 10 and tok not in ref[:i])
    cfg = DecodeConfig(W=7, N=5, G=7, max_new_tokens=MAX_NEW)
    results, _ = run_ranks(tiny_models["llama"], 2, [PROMPT] * 2, cfg, eos=[ref[pos]])
    assert [g.output_ids for g in results] == [ref[: pos + 1]] * 2


def test_parallel_rank_mismatch_is_an_error(tiny_models):
    cfg = DecodeConfig(W=5, N=3, G=5, max_new_tokens=8)
    other = PROMPT[:-1] + [PROMPT[-1] + 1]
    results, cols = run_ranks(tiny_models["llama"], 2, [PROMPT, other], cfg)
    assert all(isinstance(g, LPError) and "mismatch" in str(g) for g in results), results
    assert [c.calls for c in cols] == [1, 1]  # refused at the handshake, before any step


def test_draft_ranking():
    """Text drafts first; then the pool: newest, most frequent, or two-token matches first."""
    pool = NGramPool(4, 8)
    for gram in ((5, 1, 1, 1), (5, 2, 2, 2), (5, 2, 2, 2), (5, 3, 3, 3), (4, 5, 3, 9)):
        pool.add(gram[0], gram[1:])
    out, window = TextIndex([4, 5, 6, 4, 5]), JacobiWindow(0, 4, [0], 0)  # "4 5" occurred before, then 6 4 5

    def drafts(text_drafts: int = 0, draft_len: int = 10, context: bool = True, frequent: bool = False) -> list:
        return step_drafts(out, pool, window, NO_MEMORY, draft_len, text_drafts, context, frequent, 0, 0, 0).drafts

    assert drafts(context=False) == [(3, 3, 3), (2, 2, 2), (1, 1, 1)]
    assert drafts(context=False, frequent=True) == [(2, 2, 2), (3, 3, 3), (1, 1, 1)]
    assert drafts() == [(3, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1)]
    assert drafts(text_drafts=4, draft_len=2)[0] == (6, 4)


@pytest.mark.parametrize("arch", ARCHS)
def test_recycled_drafts_keep_the_output_and_raise_acceptance(arch, tiny_models, refs):
    """With the successor table off (successors=0) and on, the output is greedy's; on, the tree
    takes more of the budget and commits at least as many tokens over the decode."""
    off = decode(tiny_models[arch], PROMPT, W=5, N=3, G=5, max_new_tokens=MAX_NEW, successors=0)
    on = decode(tiny_models[arch], PROMPT, W=5, N=3, G=5, max_new_tokens=MAX_NEW)
    assert off.output_ids == on.output_ids == refs[arch]
    assert np.mean(on.fed_per_step) > np.mean(off.fed_per_step)
    assert on.steps <= off.steps


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(successors=0),
        dict(G=0),
        dict(G=0, tree_tokens=8),
        dict(mode="ar"),
        dict(N=2, tree=False, successors=3, tree_tokens=30),
    ],
)
def test_message_size_is_what_steps_send(settings, tiny_models):
    """lp.bench's all-gather timings use step_message_size: it must be the real message."""
    from lp.message import step_message_size

    cfg = {**dict(W=5, N=3, G=5, max_new_tokens=12), **settings}
    col = CountingCollective()
    decode(tiny_models["llama"], PROMPT, collective=col, **cfg)
    assert set(col.sizes) == {step_message_size(DecodeConfig(**cfg))}

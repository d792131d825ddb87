"""Attention over the paged cache (lp/engine/attention.py): the visibility rule of a packed step,
its three applications (grouped sdpa, a dense mask, FlexAttention's block mask) agreeing, and the
backend choice with its one-line errors."""

import itertools

import numpy as np
import pytest
import torch
from helpers import build_tiny, make_prompt

from lp.engine import attention
from lp.engine.attention import FLEX_BLOCK, Dense, FlexMask
from lp.engine.packed import PackedStep, by_length, exact, flex_blocks, padded, prompt_chunk, step_segment
from lp.engine.pages import PAGE
from lp.errors import LPError
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def _interleaved(worker: Worker, lengths: list[int]):
    """Sequences of `lengths` committed tokens whose pages interleave (each grown a page at a
    time in turn), and a packed step: a lookahead layout for the first, chunks for the others."""
    kvs = [worker.sequence(n + 40, 40) for n in lengths]
    for upto in range(PAGE, max(lengths) + 40 + PAGE, PAGE):  # one page each, in turn
        for kv, n in zip(kvs, lengths):
            kv.reserve(min(upto, n + 40))
    for kv, n in zip(kvs, lengths):
        kv.length = n
    layout = step_layout(1, 3, 3, range(3), (-1, 0, 0, -1, 3))
    rng = np.random.default_rng(0)
    segs = [step_segment(kvs[0].owner, layout, rng.integers(3, 200, layout.size), lengths[0], lengths[0], kvs[0].table)]
    for kv, n in zip(kvs[1:], (1, 7, 20)):
        segs.append(prompt_chunk(kv.owner, rng.integers(3, 200, n), kv.length, kv.table, logits=True))
    return PackedStep(segs), kvs


def test_visibility_is_each_sequence_and_its_chain():
    """A token sees its own sequence's committed slots and its chain among its segment's; nothing
    of another sequence, nothing speculative past its segment, no free or pad slot."""
    worker = Worker(build_tiny("llama"), graphs=False)
    step, kvs = _interleaved(worker, [30, 17, 50, 5])
    on = exact(step, worker.kv.pool.owner, worker.kv.pool.index, 1)
    mask = Dense(on.visible, worker.kv.slots).refresh().mask[0, 0]
    for i, (seg, kv) in enumerate(zip(step.segments, kvs)):
        a = step.starts[i]
        committed, own = kv.slots(0, kv.length), kv.slots(kv.length, seg.size)
        for q in range(seg.size):
            want = torch.zeros(worker.kv.slots, dtype=torch.bool)
            want[committed] = True
            want[own[seg.block[q]]] = True
            assert torch.equal(mask[a + q], want), (i, q)
    assert (np.diff(kvs[0].table) != 1).any()  # the pages did interleave


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("call_pages", [64, 0])
def test_grouped_attention_equals_the_whole_cache(arch, call_pages):
    """Segments of different sizes over interleaved pages, attended by groups of gathered pages
    (the eager way), give the logits of one dense mask over the whole cache, whether a size
    bucket's sequences of unlike lengths share a group or not (a group's cost `call_pages`)."""
    from lp.engine.forward import StepInputs

    model = build_tiny(arch)
    worker = Worker(model, graphs=False)
    for kv, n in zip([worker.sequence(200, 40) for _ in range(4)], (30, 17, 50, 5)):
        worker.prefill(kv, make_prompt(n % 7, n, 2)[:n])
    step, _ = _interleaved(worker, [30, 17, 50, 5])
    worker.call_pages = call_pages
    grouped, on = worker.run(step)
    groups = len(on.attend.groups)
    on.attend = Dense(on.visible, worker.kv.slots).refresh()
    with torch.inference_mode():  # as the step's tensors were made
        dense = worker.forward(StepInputs(on.ids, on.positions, on.slots, on.rows, on.attend))
    torch.testing.assert_close(grouped, dense, rtol=1e-5, atol=1e-5)
    # sizes 7 and 11 share a bucket, 1 and 20 have one each: 3 buckets; where a group costs
    # nothing, the shared bucket's sequences (4 pages and 3) split by length
    assert groups == (3 if call_pages == 64 else 4)


def test_a_bucket_splits_into_groups_of_like_lengths():
    """The split gathers the fewest pages, each group counted `call_pages` more: the best of all
    the ways to cut the members sorted by length; sequences of like lengths stay together."""
    assert [g.tolist() for g in by_length(np.arange(4), np.array([5, 6, 5, 4]), 8)] == [[0, 1, 2, 3]]
    assert [g.tolist() for g in by_length(np.arange(4), np.array([3, 70, 4, 2]), 8)] == [[1], [0, 2, 3]]
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 8))
        pages, call = rng.integers(1, 100, n), int(rng.integers(0, 50))
        got = by_length(np.arange(n), pages, call)
        assert sorted(np.concatenate(got).tolist()) == list(range(n))
        p = np.sort(pages)[::-1]
        brute = min(  # every cut of the sorted lengths into runs: each run pads to its first
            sum((b - a) * p[a] + call for a, b in zip((0, *cuts), (*cuts, n)))
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
        )
        assert sum(len(g) * pages[g].max() + call for g in got) == brute


@pytest.mark.parametrize("B", [64, 256])
def test_flex_block_mask_expands_to_the_dense_mask(B):
    """The block mask, expanded (visited key blocks: mask_mod; the rest: none), is the dense
    mask, for a packed step padded to B tokens, its pad tokens included."""
    worker = Worker(build_tiny("llama"), graphs=False)
    step, _ = _interleaved(worker, [200, 17, 130, 5])
    arrays = {k: torch.from_numpy(v) for k, v in padded(step, B).items()}
    visible = attention.Visibility(
        arrays["owner"], arrays["length"], arrays["base"], arrays["size"], arrays["block"],
        worker.kv.pool.owner, worker.kv.pool.index,
    )  # fmt: skip
    flex = FlexMask(visible, worker.kv.slots)
    flex.update(*(torch.from_numpy(a) for a in flex_blocks(step, B, worker.kv.slots // FLEX_BLOCK)))
    rows = flex.rows
    q, kv = torch.arange(rows)[:, None], torch.arange(worker.kv.slots)[None]
    evaluated = flex.block_mask.mask_mod(0, 0, q, kv)
    seen = torch.zeros(rows, worker.kv.slots, dtype=torch.bool)
    for qb in range(-(-rows // FLEX_BLOCK)):
        lo, hi = qb * FLEX_BLOCK, (qb + 1) * FLEX_BLOCK
        for blk in flex.indices[0, 0, qb, : int(flex.counts[0, 0, qb])].tolist():
            cols = slice(blk * FLEX_BLOCK, (blk + 1) * FLEX_BLOCK)
            seen[lo:hi, cols] = evaluated[lo:hi, cols]
    dense = Dense(visible, worker.kv.slots).refresh().mask[0, 0]
    assert torch.equal(seen[:B], dense)
    assert dense[step.tokens :, 0].all() and dense[step.tokens :].sum() == B - step.tokens  # pads: slot 0 alone


def test_backend_choice():
    model = build_tiny("llama")
    assert Worker(model).attention == "sdpa"  # CPU, auto
    assert Worker(model, graphs=True).attention == "sdpa"
    for kw, fragment in (
        (dict(attention="flex", graphs=False), "attention=flex needs fixed-shape steps"),
        (dict(attention="split"), "attention must be one of"),
        (dict(graphs="yes"), "graphs must be true, false or auto"),
        (dict(max_seq_len=1), "max_seq_len must be an integer >= 2"),
        (dict(kv_tokens=100), "kv_tokens must be an integer >= 128"),
        (dict(compile=True, graphs=False), "compile=true needs fixed-shape steps"),
        (dict(compile=True), "compile=true needs fixed-shape steps"),  # graphs=auto: off on CPU
    ):
        with pytest.raises(LPError, match=fragment):
            Worker(model, **kw)
    with pytest.raises(LPError, match="attention=flex needs a Llama-family model"):
        Worker(build_tiny("gemma"), graphs=True, attention="flex")


def test_compiled_flex_one_token_step_equals_eager():
    """The 1-token bucket compiled with FlexAttention on CPU (its query padded to 2 rows), after
    a prompt longer than a key block. tools.buckets checks every bucket."""
    from tools.buckets import compare

    model = build_tiny("llama", num_hidden_layers=1)
    assert compare(model, [1], "flex", prompt_len=150)[0]["max_abs_diff"] < 1e-5


def test_a_step_past_its_page_table_is_refused():
    # the first segment's step needs 2 pages (a page's tokens, then one more) and its table holds 1:
    # its last token would take the next segment's page
    short = prompt_chunk(0, np.zeros(1, np.int64), PAGE, np.array([3]))
    whole = prompt_chunk(1, np.zeros(2, np.int64), 0, np.array([5]))
    PackedStep([prompt_chunk(0, np.zeros(1, np.int64), PAGE - 1, np.array([3])), whole])  # fits its page
    with pytest.raises(LPError, match="fewer pages than its step needs"):
        PackedStep([short, whole])

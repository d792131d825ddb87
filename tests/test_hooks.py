"""lp/decode/hooks.py through the decode (lookahead and plain): every
step's committed tokens reach `on_tokens` in order, `stop` ends the decode after the step where
it holds, and rank 0's `cancelled` travels in the step's message (its halt slot) and ends the
decode after that step, the tokens so far exactly greedy decoding's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import make_prompt, reference_greedy

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.decode.hooks import StepHooks
from lp.decode.loop import Decoder
from lp.engine.tp import ALONE
from lp.message import HALT, HEADER
from lp.worker import Worker

MAX_NEW = 32
PROMPT = make_prompt()
LOOPS = {"lookahead": dict(W=5, N=3, G=5), "plain": dict(mode="ar")}  # name: DecodeConfig settings


@pytest.fixture(scope="module")
def ref(tiny_models):
    return reference_greedy(tiny_models["llama"], PROMPT, MAX_NEW)


def decode(model, loop: str, **hooks):
    dec = Decoder(Worker(model), Collective(), set(), 512)
    return dec.generate(PROMPT, DecodeConfig(max_new_tokens=MAX_NEW, **LOOPS[loop]), **hooks)


@pytest.mark.parametrize("loop", LOOPS)
def test_on_tokens_sees_every_step(loop, tiny_models, ref):
    seen: list[list[int]] = []
    g = decode(tiny_models["llama"], loop, on_tokens=seen.append)
    assert g.output_ids == ref and sum(seen, []) == ref
    assert [len(s) for s in seen] == g.accepted_per_step


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_ends_after_the_step_where_it_holds(loop, tiny_models, ref):
    lengths: list[int] = []

    def stop(output: list[int]) -> bool:
        lengths.append(len(output))
        return len(output) >= 10

    g = decode(tiny_models["llama"], loop, stop=stop)
    assert g.output_ids == ref[: len(g.output_ids)] and lengths[-1] == g.new_tokens >= 10
    assert all(n < 10 for n in lengths[:-1]) and len(lengths) == g.steps


@pytest.mark.parametrize("loop", LOOPS)
def test_cancelled_ends_after_the_step_it_answers(loop, tiny_models, ref):
    asked = []

    def cancelled() -> bool:
        asked.append(True)
        return len(asked) >= 3

    g = decode(tiny_models["llama"], loop, cancelled=cancelled)
    assert g.steps == 3 and g.output_ids == ref[: g.new_tokens]


def test_the_halt_slot_is_rank_0s_answer(tiny_models):
    """Each sequence's message carries rank 0's answer to its `cancelled` (another rank's: 0), and
    a gathered halt ends the decode on every rank."""
    batch = Decoder(Worker(tiny_models["llama"]), Collective(), set(), 512).batch()
    seqs = [SimpleNamespace(hooks=StepHooks.of(None, None, lambda: True, rank=r, tp=ALONE)) for r in (1, 0)]
    seqs.append(SimpleNamespace(hooks=StepHooks.of(None, None, None, rank=0, tp=ALONE)))  # no cancel
    messages = [torch.zeros(HEADER + 4, dtype=torch.long) for _ in seqs]
    stamped = batch._stamped(messages, seqs).view(3, -1)
    assert stamped[:, HALT].tolist() == [0, 1, 0]
    gathered = np.zeros((3, HEADER + 4), dtype=np.int64)
    hooks = StepHooks.of(None, None, lambda: False, rank=2, tp=ALONE)
    assert not hooks.ended([1], gathered)
    gathered[0, HALT] = 1  # rank 0's message says halt: every rank ends
    assert hooks.ended([1], gathered)
    assert not StepHooks.of(None, None, None, rank=2, tp=ALONE).ended([1], gathered)  # no cancel: no halt read

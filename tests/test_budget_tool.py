"""tools.budget's two splits on the same trees: what a step would commit, read off the greedy output."""

from types import SimpleNamespace

import numpy as np
from helpers import make_prompt

from lp.collective import Collective
from lp.decode.budget import Budget
from lp.decode.loop import Decoder
from lp.lookahead.memory import DraftMemory
from lp.worker import Worker
from tools.budget import decode, tokens_committed


def test_a_split_commits_the_accepted_path_among_its_first_grown_nodes():
    # x0 -> 5 -> 7 -> 8 and x0 -> 6; grown in the order 5, 6, 7, 8
    tokens, parents, growth = np.array([5, 7, 8, 6]), np.array([-1, 0, 1, -1]), np.array([0, 2, 3, 1])
    grown = (tokens, parents, np.zeros(4, np.int64), growth, np.array([3, 1]))
    assert tokens_committed(grown, [5, 7, 8, 9], 4) == 4  # three drafts and the next token
    assert tokens_committed(grown, [5, 7, 8, 9], 3) == 3  # 8 not verified
    assert tokens_committed(grown, [5, 7, 8, 9], 0) == 1
    assert tokens_committed(grown, [6, 7], 4) == 2  # 7 is 5's child, not 6's
    assert tokens_committed(grown, [5, 7], 4) == 2  # the output ends
    assert tokens_committed(grown, [9], 4) == 1


def test_the_running_split_on_the_same_trees_is_what_its_steps_committed(tiny_models):
    lm = SimpleNamespace(decoder=Decoder(Worker(tiny_models["llama"]), Collective(), set(), 512))
    prompts = [make_prompt(2, 20, 3), make_prompt(3, 30, 2), make_prompt(4, 12, 4)]
    plain = decode(lm, prompts, 2, Budget("none"), 24, 23)
    run = decode(lm, prompts, 2, Budget("shared", step_tokens=24), 24, 23, plain["outputs"])
    assert run["outputs"] == plain["outputs"]
    assert run["mismatches"] == 0
    steps = [s for s in run["steps"] if "same_trees" in s]
    assert any(s["committed"] > s["sequences"] for s in steps)  # drafts were accepted
    assert sum(s["same_trees"]["shared"] for s in steps) == sum(s["committed"] for s in steps)


def test_every_decode_starts_from_the_saved_memory(tiny_models, tmp_path):
    # a memory taught by other prompts, saved; each decode loads it, so what one decode teaches the
    # memory does not reach the next (each policy's run starts where the others' did)
    decoder = Decoder(Worker(tiny_models["llama"]), Collective(), set(), 512, memory=DraftMemory(4096))

    def load_memory(path):
        decoder.memory = DraftMemory.load(path, 4096, {})

    lm = SimpleNamespace(decoder=decoder, load_memory=load_memory)
    prompts = [make_prompt(2, 20, 3), make_prompt(3, 30, 2), make_prompt(4, 12, 4)]
    decode(lm, [make_prompt(5, 24, 3), make_prompt(6, 16, 2)], 2, Budget("none"), 24, 23)
    path = tmp_path / "warm.lp"
    decoder.memory.save(path, {})

    def committed(run):
        return [s["committed"] for s in run["steps"]]

    shared = Budget("shared", step_tokens=24)
    first = decode(lm, prompts, 2, shared, 24, 23, memory=path)
    again = decode(lm, prompts, 2, shared, 24, 23, memory=path)
    taught = decode(lm, prompts, 2, shared, 24, 23)  # from the memory `again` left: it knows these outputs
    assert committed(again) == committed(first)
    assert sum(committed(taught)) == sum(committed(first)) and len(taught["steps"]) < len(first["steps"])

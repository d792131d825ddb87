"""`python -m lp.serve` on the real default model (SmolLM2-135M-Instruct, fp32), through the
openai client: a completion and a chat (French: multi-byte characters), streamed and not, token
by token transformers' greedy output and `LP.generate`'s, the streamed chunks joined the same
text, and a stop string honoured. One server for the module; 24 new tokens a request."""

from __future__ import annotations

import openai
import pytest
from _serve import Server
from helpers import REAL_MODEL, load, reference_greedy

MAX_NEW = 24
SHAPE = dict(W=5, N=3, G=5)
PROMPT = "def fibonacci(n):"
CHAT = [{"role": "user", "content": "Translate to French: I am very happy, the coffee is hot and the café is open."}]


@pytest.fixture(scope="module")
def server():
    if not (REAL_MODEL / "config.json").exists():
        pytest.skip(f"needs {REAL_MODEL} (python -m lp.models fetch smollm2-135m)")
    s = Server([*(f"{k}={v}" for k, v in SHAPE.items()), f"max_tokens={MAX_NEW}", "timeout_s=120"]).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def hf():
    return load(REAL_MODEL)


@pytest.fixture(scope="module")
def lm(server):
    from lp import LP

    return LP("smollm2-135m", device="cpu")


def test_completion_is_greedy(client, hf, lm):
    r = client.completions.create(model="smollm2-135m", prompt=PROMPT, extra_body={"return_token_ids": True})
    ids = lm.encode(PROMPT)
    assert r.choices[0].model_extra["token_ids"] == reference_greedy(hf, ids, MAX_NEW)
    assert r.usage.prompt_tokens == len(ids) and r.usage.model_extra["S"] > 1


@pytest.fixture(scope="module")
def whole(client):
    return client.chat.completions.create(model="smollm2-135m", messages=CHAT, extra_body={"return_token_ids": True})


def test_chat_streamed_and_whole_is_lp_generate_and_greedy(client, hf, lm, whole):
    mine = lm.generate(lm.encode(CHAT), max_new_tokens=MAX_NEW, **SHAPE)
    assert mine.output_ids == reference_greedy(hf, mine.prompt_ids, MAX_NEW)
    assert whole.choices[0].model_extra["token_ids"] == mine.output_ids
    assert whole.choices[0].message.content == mine.text and any(ord(c) > 127 for c in mine.text)
    chunks = client.chat.completions.create(model="smollm2-135m", messages=CHAT, stream=True)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == mine.text and len(pieces) > 1
    assert all("\ufffd" not in p for p in pieces)  # no character split between two events


def test_stop_string(client, whole):
    full = whole.choices[0].message.content
    stop = full.split()[2]
    r = client.chat.completions.create(model="smollm2-135m", messages=CHAT, stop=[stop], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in r) == full[: full.index(stop)]

"""`torchrun --nproc_per_node 2 -m lp.serve` with gloo: two LP ranks (`tp=1`) and one
tensor-parallel replica of two ranks (`tp=2`). Rank 0 serves; each request reaches both ranks
once; the completions, streamed and not, are transformers' greedy tokens; stop strings and a
client that leaves end the decode on both ranks at the same step (the next request still
decodes); then a rank that hangs (`tp=1`) or dies (`tp=2`) mid-decode fails its request with 503
within timeout_s, and the server ends with no process left."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from _serve import Server
from helpers import load, reference_greedy

TIMEOUT_S = 8  # the servers' collective timeout
SLACK_S = 30  # scheduling slack on a shared 2-core machine
MAX_NEW = 24
PROMPT = "The cat sat on the mat. The cat sat on the"
LAYOUTS = {1: "hang", 2: "die"}  # tp: rank 1's fault


@pytest.fixture(scope="module", params=list(LAYOUTS), ids=lambda tp: f"tp{tp}")
def ranks(request, tiny_text_model, tmp_path_factory):
    """A 2-rank server per layout (tp=1: two LP ranks; tp=2: one replica), with rank 1's fault
    armed by a file (`_worker.py`)."""
    tp, fault = request.param, LAYOUTS[request.param]
    tmp = tmp_path_factory.mktemp(f"tp{tp}")
    env = {
        "LP_TEST_DELAY": str(tmp / "delay"),
        "LP_TEST_FAULT": fault,
        "LP_TEST_FAULT_RANK": "1",
        "LP_TEST_FAULT_WHEN": str(tmp / "fault"),
        "LP_TEST_FAULT_MARK": str(tmp / "faulted_at"),
    }
    args = [f"model.name={tiny_text_model}", "served_model_name=tiny", f"tp={tp}", "W=5", "N=3", "G=5"]
    server = Server([*args, f"max_tokens={MAX_NEW}", f"timeout_s={TIMEOUT_S}"], nproc=2, env=env).wait_ready()
    yield server, tmp, tp
    server.stop()


@pytest.fixture(scope="module")
def greedy(tiny_text_model):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_text_model)(PROMPT)["input_ids"]
    return reference_greedy(load(tiny_text_model), ids, MAX_NEW)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_two_ranks_decode_transformers_greedy(ranks, greedy):
    server, _, tp = ranks
    state = server.health()
    assert state["world_size"] == 2 and state["tp"] == tp, state
    client = _client(server)
    whole = client.completions.create(model="tiny", prompt=PROMPT, extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["token_ids"] == greedy
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chat)


def test_stop_and_disconnect_end_every_rank_at_one_step(ranks):
    server, tmp, _ = ranks
    client = _client(server)
    full = client.completions.create(model="tiny", prompt=PROMPT).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.completions.create(model="tiny", prompt=PROMPT, stop=stop)
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    (tmp / "delay").write_text("0.05")
    try:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 400, "mode": "ar", "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    break
        state = server.wait_health(lambda h: not h["decoding"] and h["last"].get("finish_reason") == "cancelled")
        assert state["last"]["finish_reason"] == "cancelled" and state["last"]["new_tokens"] < 100, state
    finally:
        (tmp / "delay").unlink()
    # had a rank gone on decoding, this request's collectives would not meet
    assert client.completions.create(model="tiny", prompt=PROMPT).choices[0].text == full


def test_a_failed_rank_fails_its_request_with_503_and_the_server_ends(ranks):
    server, tmp, _ = ranks
    (tmp / "fault").write_text("")
    start = time.time()
    body = {"model": "tiny", "prompt": PROMPT}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT_S + SLACK_S)
    assert r.status_code == 503 and list(r.json()) == ["error"], r.text
    assert time.time() - start < TIMEOUT_S + SLACK_S
    assert (tmp / "faulted_at").exists(), server.output()
    assert server.wait_exit(TIMEOUT_S + SLACK_S) not in (None, 0), server.output()
    time.sleep(1)
    assert server.survivors() == [], server.output()

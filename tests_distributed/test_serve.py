"""`python -m lp.serve` on one process with a tiny model, driven by the real openai client and
raw HTTP: completions and chat, streamed and not, the same tokens as `LP.generate` and
transformers' greedy `generate`; stop strings; every bad input answered with its status and one
error object while the server keeps serving; the bounded queue (429); a client that leaves has
its decode stopped; 32 concurrent streaming clients all answered, decoded two at a time; a clean
shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from _serve import Server
from helpers import load, reference_greedy

from tools import serve_load

KEY = "test-key"
MAX_BATCH = 2
MAX_QUEUE = 4
MAX_BODY = 4096
MAX_NEW = 24
SHAPE = dict(W=5, N=3, G=5)
PROMPTS = ["The cat sat on the mat. The cat sat on the", "def add(a, b):\n    return a + b\n\ndef"]


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """The file that holds each of the server's steps (`_worker.py` LP_TEST_DELAY) while it exists."""
    return tmp_path_factory.mktemp("held") / "delay"


@pytest.fixture(scope="module")
def server(tiny_text_model, held):
    args = [f"model.name={tiny_text_model}", "served_model_name=tiny", *(f"{k}={v}" for k, v in SHAPE.items())]
    args += [f"max_tokens={MAX_NEW}", f"max_batch={MAX_BATCH}", f"max_queue={MAX_QUEUE}"]
    args += [f"max_body_bytes={MAX_BODY}", f"api_key={KEY}"]
    s = Server([*args, "timeout_s=30"], env={"LP_TEST_DELAY": str(held)}).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def lm(tiny_text_model):
    """The same model in this process, through the Python API."""
    from lp import LP

    return LP(str(tiny_text_model), device="cpu")


@pytest.fixture(scope="module")
def hf(tiny_text_model):
    return load(tiny_text_model)


def post(
    server: Server, body: str | bytes, key: str | None = KEY, path: str = "/v1/completions", timeout: float = 60
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, content=body, headers=headers, timeout=timeout)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    state = server.health()
    assert state["status"] == "ok" and state["world_size"] == 1 and state["max_queue"] == MAX_QUEUE, state


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_is_lp_generate_and_greedy(client, lm, hf, prompt):
    """Token by token: the server's greedy completion, `LP.generate`'s and transformers'."""
    r = client.completions.create(model="tiny", prompt=prompt, extra_body={"return_token_ids": True})
    mine = lm.generate(prompt, max_new_tokens=MAX_NEW, **SHAPE)
    ids = r.choices[0].model_extra["token_ids"]
    assert ids == mine.output_ids == reference_greedy(hf, mine.prompt_ids, MAX_NEW)
    assert r.choices[0].text == mine.text and r.choices[0].finish_reason == mine.finish_reason
    assert r.usage.prompt_tokens == len(mine.prompt_ids) and r.usage.completion_tokens == len(ids)
    assert r.usage.model_extra["steps"] == mine.steps and r.usage.model_extra["S"] == pytest.approx(mine.S)


def test_streamed_chunks_join_to_the_completion(client):
    whole = client.completions.create(model="tiny", prompt=PROMPTS[0])
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPTS[0], stream=True, stream_options={"include_usage": True})
    )
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(texts) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens and not chunks[-1].choices
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert len(texts) <= chunks[-1].usage.model_extra["steps"]  # one event per step that adds text


def test_chat_streamed_and_whole(client, lm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[0]}]
    mine = lm.generate(lm.encode(messages), max_new_tokens=MAX_NEW, **SHAPE)
    whole = client.chat.completions.create(model="tiny", messages=messages, extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["token_ids"] == mine.output_ids
    assert whole.choices[0].message.content == mine.text and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == mine.text


def test_stop_strings_end_the_decode(client, lm):
    full = lm.generate(PROMPTS[1], max_new_tokens=MAX_NEW, **SHAPE)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    cut = full.text[: full.text.index(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPTS[1], stop=[stop, "never seen"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < full.new_tokens  # the decode ended at the step the string appeared
    streamed = client.completions.create(model="tiny", prompt=PROMPTS[1], stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert lm.generate(PROMPTS[1], max_new_tokens=MAX_NEW, stop=[stop], **SHAPE).text == cut


def _bad_inputs(server: Server) -> dict[str, tuple[int, httpx.Response]]:
    ok = {"model": "tiny", "prompt": "hello"}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    send = lambda body, **kw: post(server, json.dumps(body), **kw)  # noqa: E731
    return {
        "malformed JSON": (400, post(server, b'{"model": "tiny", "prompt": ')),
        "not an object": (422, send([1, 2])),
        "wrong type": (422, send({**ok, "max_tokens": "ten"})),
        "bool for int": (422, send({**ok, "max_tokens": True})),
        "missing prompt": (422, send({"model": "tiny"})),
        "unknown field": (422, send({**ok, "frobnicate": 3})),
        "n > 1": (400, send({**ok, "n": 2})),
        "best_of > 1": (400, send({**ok, "best_of": 3})),
        "a penalty": (400, send({**ok, "presence_penalty": 0.5})),
        "log-probabilities": (400, send({**chat, "logprobs": True}, path="/v1/chat/completions")),
        "tools": (400, send({**chat, "tools": [{"type": "function"}]}, path="/v1/chat/completions")),
        "a huge window": (400, send({**ok, "W": 5000})),
        "a huge n-gram": (400, send({**ok, "N": 200})),
        "a huge step": (400, send({**ok, "W": 60, "N": 5, "G": 60, "step_tokens": 100000})),
        "unknown model": (404, send({**ok, "model": "gpt-4"})),
        "past the context": (400, send({**ok, "max_tokens": 5000})),
        "empty prompt": (400, send({**ok, "prompt": ""})),
        "empty messages": (422, send({"model": "tiny", "messages": []}, path="/v1/chat/completions")),
        "bad lp setting": (400, send({**ok, "W": 0})),
        "token id out of range": (400, send({**ok, "prompt": [1, 10**9]})),
        "five stop strings": (400, send({**ok, "stop": list("abcde")})),
        "body over the limit": (413, send({**ok, "prompt": "x" * MAX_BODY})),
        "no API key": (401, send(ok, key=None)),
        "wrong API key": (401, send(ok, key="guess")),
        "unknown path": (404, post(server, b"{}", path="/v1/embeddings")),
    }


def test_bad_input_gets_one_error_object_and_the_server_serves_on(server, client):
    for name, (status, r) in _bad_inputs(server).items():
        body = r.json()
        assert r.status_code == status, (name, r.status_code, body)
        assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}, (name, body)
        assert body["error"]["message"] and "Traceback" not in r.text, (name, body)
    named = {name: r.json()["error"]["message"] for name, (_, r) in _bad_inputs(server).items()}
    assert "W=5000" in named["a huge window"] and "N=200" in named["a huge n-gram"], named
    assert "presence_penalty" in named["a penalty"] and "lp does not support" in named["a penalty"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="guess", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="exceeds the 1024 tokens"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=5000)
    assert client.completions.create(model="tiny", prompt=PROMPTS[0]).usage.completion_tokens == MAX_NEW
    assert server.health()["status"] == "ok"


def test_openai_fields_at_their_neutral_values_are_taken(client, lm):
    """What clients such as LangChain send by default: the same completion as without them."""
    neutral = dict(presence_penalty=0, frequency_penalty=0.0, n=1, logprobs=False, top_logprobs=None)
    extra = dict(response_format={"type": "text"}, logit_bias={}, tool_choice="none", parallel_tool_calls=True)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    r = client.chat.completions.create(model="tiny", messages=messages, **neutral, extra_body=extra)
    assert r.choices[0].message.content == lm.generate(lm.encode(messages), max_new_tokens=MAX_NEW, **SHAPE).text
    c = client.completions.create(model="tiny", prompt=PROMPTS[0], echo=False, best_of=1, suffix=None)
    assert c.usage.completion_tokens == MAX_NEW


def test_a_full_queue_answers_429(server, client, held):
    """One decode held at its first step (no request joins the batch until it ends), MAX_QUEUE
    requests queued behind it: the next is a 429; released, all are answered, and the same."""
    expected = client.completions.create(model="tiny", prompt=PROMPTS[0]).choices[0].text
    held.write_text("120")
    answers: list[str] = []
    ask = lambda: answers.append(client.completions.create(model="tiny", prompt=PROMPTS[0]).choices[0].text)  # noqa: E731
    try:
        threads = [threading.Thread(target=ask)]
        threads[0].start()
        assert server.wait_health(lambda h: h["decoding"])["decoding"]
        threads += [threading.Thread(target=ask) for _ in range(MAX_QUEUE)]
        for t in threads[1:]:
            t.start()
        assert server.wait_health(lambda h: h["queued"] == MAX_QUEUE)["queued"] == MAX_QUEUE
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="tiny", prompt=PROMPTS[0])
    finally:
        held.unlink()
    for t in threads:
        t.join(60)
    assert answers == [expected] * (1 + MAX_QUEUE)
    assert server.health()["most_queued"] == MAX_QUEUE


def test_a_client_that_leaves_has_its_decode_stopped(server, client, held):
    held.write_text("0.05")  # 20 steps a second
    try:
        start = time.time()
        with httpx.stream(
            "POST",
            server.url + "/v1/completions",
            json={"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 400, "mode": "ar", "stream": True},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        ) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    break  # and the connection closes here
        last = server.wait_health(lambda h: not h["decoding"] and h["last"].get("finish_reason") == "cancelled")
        assert last["last"]["finish_reason"] == "cancelled", last
        assert last["last"]["new_tokens"] < 100 and time.time() - start < 15, last
        # not streamed: a client that gives up while its decode is held at the first step
        held.write_text("120")
        body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 400, "mode": "ar"}
        with pytest.raises(httpx.ReadTimeout):
            post(server, json.dumps(body), timeout=2)
        served = server.health()["served"]
        time.sleep(1)  # the server looks for a waiting client's disconnect every 0.25 s
        held.unlink()  # released: the decode ends at the step it was held in
        last = server.wait_health(lambda h: h["served"] > served)
        assert last["last"] == {"new_tokens": 1, "steps": 1, "finish_reason": "cancelled"}, last
    finally:
        held.unlink(missing_ok=True)
    assert client.completions.create(model="tiny", prompt=PROMPTS[0]).usage.completion_tokens == MAX_NEW


def test_32_concurrent_streaming_clients(server):
    """tools/serve_load.py's load, shortened: every answer complete and the same as alone."""
    settings = {"max_tokens": 8, "temperature": 0}
    alone, _ = asyncio.run(
        serve_load.load(server.url, "tiny", clients=1, requests=8, settings=settings, deadline_s=90, api_key=KEY)
    )
    refs = {r.prompt: r for r in alone}
    records, wall = asyncio.run(
        serve_load.load(
            server.url, "tiny", clients=32, requests=32, settings=settings, deadline_s=90, retry_s=0.05, api_key=KEY
        )
    )
    assert serve_load.wrong(records, refs) == []
    summary = serve_load.summarize(records, wall)
    assert summary["answered"] == 32 and summary["rejected_429"] > 0  # more clients than the batch and queue hold
    assert server.health()["most_queued"] == MAX_QUEUE


def test_shutdown_leaves_no_process(server):
    assert server.stop() == 0, server.output()
    assert server.survivors() == []

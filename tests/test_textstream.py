"""lp/frontend/textstream.py: a decode's text as its steps commit tokens, on the real model's
byte-level BPE tokenizer: the pieces join to the whole decode whatever the steps' sizes, no
piece splits a multi-byte character, and stop strings end the text (never handed on), their
possible beginnings held back until they are known not to begin one."""

from __future__ import annotations

import random

import pytest
from helpers import REAL_MODEL

from lp.errors import LPError
from lp.frontend.textstream import TextStream

TEXT = 'Héllo wörld 😀 — 世界 is "quoted"; naïve café.<|im_end|> after'


@pytest.fixture(scope="module")
def tok():
    if not (REAL_MODEL / "tokenizer.json").exists():
        pytest.skip(f"needs {REAL_MODEL} (python -m lp.models fetch smollm2-135m)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REAL_MODEL)


def steps(ids: list[int], seed: int) -> list[list[int]]:
    """`ids` cut into steps of 1 to 4 tokens, as lookahead commits them."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        out.append(ids[i : i + n])
        i += n
    return out


def run(tok, text: str, stop=(), seed: int = 0) -> tuple[TextStream, list[str], int]:
    """Push `text`'s tokens step by step until the stream says stop: (stream, pieces, steps pushed)."""
    pieces: list[str] = []
    stream = TextStream(tok, stop, pieces.append)
    pushed = 0
    for step in steps(tok(text)["input_ids"], seed):
        stream.push(step)
        pushed += 1
        if stream.stop([]):
            break
    stream.finish()
    return stream, pieces, pushed


@pytest.mark.parametrize("seed", range(5))
def test_pieces_join_to_the_whole_decode(tok, seed):
    ids = tok(TEXT)["input_ids"]
    stream, pieces, _ = run(tok, TEXT, seed=seed)
    assert "".join(pieces) == stream.text == tok.decode(ids, skip_special_tokens=True)
    assert all(pieces) and not any("\ufffd" in p for p in pieces)  # whole characters only


def test_one_token_a_step_splits_no_character(tok):
    ids = tok("😀世界")["input_ids"]
    assert len(ids) > 3  # the emoji and the characters span several byte tokens
    pieces: list[str] = []
    stream = TextStream(tok, (), pieces.append)
    for t in ids:
        stream.push([t])
    assert pieces == ["😀", "世", "界"] and stream.finish() == "😀世界"


@pytest.mark.parametrize("seed", range(3))
def test_stop_string_ends_the_text_and_is_never_handed_on(tok, seed):
    stream, pieces, pushed = run(tok, TEXT, stop=["café", "zzz"], seed=seed)
    assert "".join(pieces) == stream.text == TEXT[: TEXT.index("café")]
    # the decode ended at the step where the string appeared, not later
    before = run(tok, TEXT, seed=seed)[2]
    assert pushed < before


def test_earliest_stop_wins(tok):
    stream, pieces, _ = run(tok, TEXT, stop=["café", "wörld"])
    assert stream.text == "".join(pieces) == "Héllo "


def test_a_possible_beginning_is_held_back_then_released(tok):
    pieces: list[str] = []
    stream = TextStream(tok, ["world peace"], pieces.append)
    stream.push(tok("hello world")["input_ids"])
    assert "".join(pieces) == "hello "  # "world" may begin the stop string
    stream.push(tok(" war")["input_ids"])
    assert "".join(pieces) == "hello world war" and not stream.stop([])
    stream.push(tok(" world")["input_ids"])
    assert stream.finish() == "hello world war world" == "".join(pieces)


def test_bad_stop_strings_and_tokenizers_are_refused(tok):
    with pytest.raises(LPError, match="non-empty"):
        TextStream(tok, [""])
    with pytest.raises(LPError, match="fast"):
        TextStream(object())

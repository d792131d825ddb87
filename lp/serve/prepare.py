"""From an OpenAI request to what every rank decodes: the prompt's token ids (the chat template's
for messages), the decoding settings (the request's fields over the server's defaults) and the
stop strings, all checked on rank 0 before the request is queued (settings that could never run
here, a prompt past the context, a cache too small: lp/frontend/runtime.py `LP.check`), so that
no step ever fails on one request's input and the server serves on."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lp.config import check_settings
from lp.errors import LPError
from lp.serve.protocol import ApiError, ChatRequest, CompletionRequest, Fields

# the request's field -> the DecodeConfig key it sets
KEYS = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "mode": "mode",
    "W": "W",
    "N": "N",
    "G": "G",
    "step_tokens": "step_tokens",
    "memory": "memory",
}


def engine_settings(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`LP.generate`'s settings from the request fields of KEYS (None: left to DecodeConfig)."""
    return {KEYS[name]: value for name, value in fields.items() if value is not None}


def check_engine_settings(settings: Mapping[str, Any]) -> None:
    """`check_settings`, its error naming each key as a request does (max_tokens, not max_new_tokens)."""
    try:
        check_settings(settings)
    except LPError as e:
        raise LPError(_named(str(e))) from None


def _named(message: str) -> str:
    """An error's message naming each setting as a request does (max_tokens, not max_new_tokens)."""
    for name, key in KEYS.items():
        message = message.replace(key, name) if key != name else message
    return message


@dataclass(frozen=True)
class DecodeRequest:
    """What every rank gets of a request (lp/serve/channel.py): token ids, `LP.generate`'s
    settings, stop strings."""

    ids: list[int]
    settings: dict[str, Any]
    stop: list[str]

    def to_json(self) -> dict:
        return asdict(self)


class Preparer:
    """Checks requests against the model and makes their `DecodeRequest`s (rank 0)."""

    def __init__(self, lm: Any, defaults: dict[str, Any]) -> None:
        """`lm`: the `LP` (its tokenizer, encode and checks); `defaults`: the server's value of each
        field of KEYS (None: DecodeConfig's own default)."""
        self.lm, self.defaults = lm, defaults
        self.max_context = lm.decoder.worker.max_seq_len  # the most tokens a sequence holds
        self.vocab = min(len(lm.tokenizer), lm.decoder.worker.vocab_size)  # ids the embedding and tokenizer know

    def completion(self, request: CompletionRequest) -> DecodeRequest:
        prompt = request.one_prompt()
        if isinstance(prompt, list):
            if not all(0 <= t < self.vocab for t in prompt):
                raise ApiError(400, f"prompt: token ids must lie in [0, {self.vocab})", "prompt")
            return self._request(list(prompt), request)
        return self._request(self._encode(prompt), request)

    def chat(self, request: ChatRequest) -> DecodeRequest:
        if request.max_completion_tokens is not None:
            request = request.model_copy(update={"max_tokens": request.max_completion_tokens})
        return self._request(self._encode([m.as_template() for m in request.messages]), request)

    def _encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        try:
            ids = self.lm.encode(prompt)
        except LPError as e:
            raise ApiError(400, str(e), "prompt" if isinstance(prompt, str) else "messages") from None
        except Exception as e:  # a chat template's own refusal (jinja's raise_exception), one line
            raise ApiError(400, f"messages: the chat template refused them: {e}", "messages") from None
        if not ids:
            raise ApiError(400, "prompt: empty prompt", "prompt")
        return ids

    def _request(self, ids: list[int], request: Fields) -> DecodeRequest:
        request.unsupported()
        given = {name: getattr(request, name) for name in KEYS}
        settings = engine_settings({name: self.defaults[name] if v is None else v for name, v in given.items()})
        if request.seed is not None:
            settings["seed"] = request.seed
        elif settings.get("temperature", 0) > 0:  # as OpenAI's: without a seed, samples differ
            settings["seed"] = secrets.randbelow(2**31)
        try:
            check_engine_settings(settings)
        except LPError as e:
            raise ApiError(400, str(e)) from None
        new = settings.get("max_new_tokens", 0)
        if len(ids) + new > self.max_context:
            raise ApiError(
                400,
                f"max_tokens: the prompt ({len(ids)} tokens) + max_tokens ({new}) exceeds the {self.max_context} "
                f"tokens this model decodes",
                "max_tokens",
                "context_length_exceeded",
            )
        stops = request.stops()
        try:
            self.lm.check(ids, **settings)
        except LPError as e:
            raise ApiError(400, _named(str(e))) from None
        return DecodeRequest(ids, settings, stops)


__all__ = ["KEYS", "DecodeRequest", "Preparer", "check_engine_settings", "engine_settings"]

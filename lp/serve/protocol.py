"""The OpenAI request bodies lp serves, as pydantic models (strict: a wrong type is a 422 that
names the field, not a value coerced), lp's own settings among them as extra fields, and the
one error type its handlers raise (`ApiError`, answered as an OpenAI `error` object).

OpenAI fields lp does not implement (penalties, log-probabilities, tools, response formats, ...)
are taken at their neutral values, as clients such as LangChain and chat front ends send them; any
other value of one is a 400 that says lp does not support it (`Fields.unsupported`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP = 4  # stop strings per request, as OpenAI allows
# OpenAI fields lp does not implement, and the values that ask nothing of them
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (True, False),
    "service_tier": ("auto", "default"),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
    "reasoning_effort": (),
    "prediction": (),
    "audio": (),
    "web_search_options": (),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
}


class ApiError(Exception):
    """An answer with an HTTP status and an OpenAI error object instead of a completion."""

    TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = self.TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False  # a last chunk with the usage, and no choices


class Fields(BaseModel):
    """The fields both endpoints take. None: the server's default (configs/serve.yaml)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    # OpenAI's, not implemented: their neutral values only (NEUTRAL; None: left out)
    n: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    modalities: Any = None
    reasoning_effort: Any = None
    prediction: Any = None
    audio: Any = None
    web_search_options: Any = None
    # lp's own settings (extra body fields; `extra_body=` in the openai client)
    top_k: int | None = Field(None, ge=0)
    mode: Literal["lookahead", "ar"] | None = None
    W: int | Literal["auto"] | None = None
    N: int | Literal["auto"] | None = None
    G: int | Literal["auto"] | None = None
    step_tokens: int | None = Field(None, ge=1)
    memory: bool | None = None
    return_token_ids: bool = False  # the completion's token ids beside its text (`token_ids`)

    def unsupported(self) -> None:
        """ApiError 400 naming the first OpenAI field set to a value lp does not implement."""
        for name, neutral in NEUTRAL.items():
            value = getattr(self, name, None)
            if value is not None and not any(_same(value, v) for v in neutral):
                takes = " or ".join(json.dumps(v) for v in (None, *neutral))
                raise ApiError(400, f"{name}: lp does not support {name}={json.dumps(value)} (it takes {takes})", name)

    def stops(self) -> list[str]:
        """The stop strings, a list (at most MAX_STOP, none empty)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP or not all(stops):
            raise ApiError(400, f"stop: at most {MAX_STOP} non-empty strings", "stop")
        return stops


def _same(value: Any, neutral: Any) -> bool:
    """Whether a field's value is `neutral`: 0.0 is 0 (JSON does not tell them apart), but no bool
    is a number."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


class CompletionRequest(Fields):
    """POST /v1/completions: one prompt, as text or token ids (a list of one is taken too)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: Any = None  # OpenAI's, not implemented: neutral values only
    best_of: Any = None
    suffix: Any = None

    def one_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(400, "prompt: lp decodes one prompt per request", "prompt")
            p = p[0]
        if not p:
            raise ApiError(400, "prompt: empty prompt", "prompt")
        return p


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template(self) -> dict:
        """The message as chat templates take it (a developer message is a system one)."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(Fields):
    """POST /v1/chat/completions: messages, rendered by the model's chat template."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens


__all__ = ["MAX_STOP", "ApiError", "ChatRequest", "CompletionRequest", "Fields", "Message"]

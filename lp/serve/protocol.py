"""The OpenAI request bodies lp serves, as pydantic models (strict: a wrong type is a 422 that
names the field, not a value coerced), lp's own settings among them as extra fields, and the
one error type its handlers raise (`ApiError`, answered as an OpenAI `error` object)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP = 4  # stop strings per request, as OpenAI allows


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
    n: Literal[1] = 1  # lp decodes one sequence per request
    user: str | None = None  # accepted, unused
    # lp's own settings (extra body fields; `extra_body=` in the openai client)
    top_k: int | None = Field(None, ge=0)
    mode: Literal["lookahead", "ar"] | None = None
    W: int | Literal["auto"] | None = None
    N: int | Literal["auto"] | None = None
    G: int | Literal["auto"] | None = None
    step_tokens: int | None = Field(None, ge=1)
    return_token_ids: bool = False  # the completion's token ids beside its text (`token_ids`)

    def stops(self) -> list[str]:
        """The stop strings, a list (at most MAX_STOP, none empty)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP or not all(stops):
            raise ApiError(400, f"stop: at most {MAX_STOP} non-empty strings", "stop")
        return stops


class CompletionRequest(Fields):
    """POST /v1/completions: one prompt, as text or token ids (a list of one is taken too)."""

    prompt: str | list[int] | list[str] | list[list[int]]

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

"""The OpenAI response bodies: a whole completion, and the chunks of a streamed one (server-sent
events), for `/v1/completions` (`text_completion`) and `/v1/chat/completions`
(`chat.completion`). `usage` carries lp's steps and S beside the token counts."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

DONE = "data: [DONE]\n\n"  # a stream's last event


def event(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, result: Any) -> dict:
    """Token counts, and the decode's steps and S (tokens per step)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": prompt_tokens + result.new_tokens,
        "steps": result.steps,
        "S": result.S,
    }


@dataclass
class Reply:
    """The bodies of one request's answer: `chat` or not, the served model's name."""

    chat: bool
    model: str
    prompt_tokens: int
    token_ids: bool = False  # add the completion's token ids (`return_token_ids`)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _first: bool = True  # a chat stream's first chunk names the role

    def whole(self, result: Any) -> dict:
        """The whole completion."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": result.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice.update(text=result.text, logprobs=None)
        if self.token_ids:
            choice["token_ids"] = result.output_ids
        return self._body([choice], chunk=False, usage=usage(self.prompt_tokens, result))

    def piece(self, text: str) -> dict:
        """A streamed chunk: the text a step added."""
        return self._body([self._choice(text, None)])

    def end(self, result: Any) -> dict:
        """The streamed chunk that ends the choice: no text, its finish reason."""
        return self._body([self._choice("", result.finish_reason)])

    def usage(self, result: Any) -> dict:
        """A stream's last chunk with `stream_options.include_usage`: no choices, the usage."""
        return self._body([], usage=usage(self.prompt_tokens, result))

    def _choice(self, text: str, finish_reason: str | None) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        delta = {"role": "assistant", "content": text} if self._first else {"content": text} if text else {}
        self._first = False
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def _body(self, choices: list[dict], chunk: bool = True, **extra: Any) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


__all__ = ["DONE", "Reply", "event", "usage"]

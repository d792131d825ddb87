"""A decode's text as its steps commit tokens: detokenized incrementally by the tokenizers
library's `DecodeStream` (which holds back a token until the bytes of its character are
complete, and decodes each token with those before it, so a merge's spaces and a multi-byte
character are never split or repeated), cut at the first stop string.

Every rank that decodes holds one alike (the same tokens, the same tokenizer), so a stop
string ends the decode at the same step on every rank (lp/decode/hooks.py `stop`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenizers.decoders import DecodeStream

from lp.errors import LPError


class TextStream:
    """The text of a decode's committed tokens (special tokens skipped, as `Result.text`), handed
    to `on_text` piece by piece as it becomes final: up to the first of the `stop` strings,
    which ends it, and short of any tail that could still begin one."""

    def __init__(
        self, tokenizer: object, stop: Sequence[str] = (), on_text: Callable[[str], None] | None = None
    ) -> None:
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if self._backend is None:
            raise LPError("streamed text and stop strings need a fast (tokenizers) tokenizer")
        if any(not isinstance(s, str) or not s for s in stop):
            raise LPError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        self._decoder = DecodeStream(skip_special_tokens=True)
        self._stop, self._on_text = tuple(stop), on_text
        self.text = ""  # decoded so far
        self.end: int | None = None  # where the first stop string starts, once one has appeared
        self._sent = 0  # characters handed to `on_text`

    def push(self, tokens: list[int]) -> None:
        """Take a step's committed tokens (lp/decode/hooks.py `on_tokens`)."""
        if self.end is not None:
            return
        piece = self._decoder.step(self._backend, tokens)
        if piece:
            searched = max(0, len(self.text) - max(map(len, self._stop), default=0) + 1)
            self.text += piece
            found = [i for i in (self.text.find(s, searched) for s in self._stop) if i >= 0]
            self.end = min(found) if found else None
        self._send(self.end if self.end is not None else len(self.text) - self._held())

    def stop(self, output: list[int]) -> bool:
        """Whether a stop string has appeared (lp/decode/hooks.py `stop`; the text says it)."""
        return self.end is not None

    def finish(self) -> str:
        """The decode ended: hand on what was held back; the final text."""
        self.text = self.text[: self.end]
        self._send(len(self.text))
        return self.text

    def _held(self) -> int:
        """The longest tail of the text that begins a stop string: not final yet."""
        return max(
            (k for s in self._stop for k in range(min(len(s) - 1, len(self.text)), 0, -1) if self.text.endswith(s[:k])),
            default=0,
        )

    def _send(self, upto: int) -> None:
        if upto > self._sent:
            if self._on_text is not None:
                self._on_text(self.text[self._sent : upto])
            self._sent = upto


__all__ = ["TextStream"]

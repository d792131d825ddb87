"""Decoding settings and their validation (one clear error per bad value)."""
from __future__ import annotations

from dataclasses import dataclass

from lp.errors import LPError

MODES = ("lookahead", "ar")


@dataclass(frozen=True)
class DecodeConfig:
    """W lookahead columns, N n-gram size, G max verification n-grams per step.

    `mode="ar"` decodes one token per step in the same runtime (W, N, G ignored).
    `pool_from_prompt` seeds the n-gram pool with the prompt's own n-grams."""

    W: int = 5
    N: int = 3
    G: int = 5
    max_new_tokens: int = 128
    mode: str = "lookahead"
    seed: int = 0
    pool_from_prompt: bool = True

    def validate(self) -> "DecodeConfig":
        if self.mode not in MODES:
            raise LPError(f"mode must be one of {MODES}, got {self.mode!r}")
        for key, low in (("W", 1), ("N", 2), ("G", 0), ("max_new_tokens", 1)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise LPError(f"{key} must be an integer >= {low}, got {value!r}")
        return self

    @property
    def lookahead(self) -> bool:
        return self.mode == "lookahead"

"""Throughput, defined once for every record that reports it (`lp.decode.loop.Generation`,
`lp.frontend.runtime.Result`, the benchmark's rows and summaries): tokens per decoding step (S) and
tokens per second. Both are nan when undefined (no step, no time), never inf or 0, so an
empty measurement cannot pass for a fast or a slow one."""

from __future__ import annotations

import math

NAN = float("nan")


def tokens_per_step(new_tokens: int, steps: int) -> float:
    """S: generated tokens per decoding step (nan when no step ran)."""
    if steps <= 0:
        return NAN
    return new_tokens / steps


def tokens_per_s(new_tokens: int, seconds: float) -> float:
    """Generated tokens per second (nan without a positive time)."""
    if not seconds or seconds <= 0 or math.isnan(seconds):
        return NAN
    return new_tokens / seconds


__all__ = ["tokens_per_s", "tokens_per_step"]

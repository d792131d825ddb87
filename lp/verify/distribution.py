"""Sampling settings: the logits warper (temperature, top-k, top-p) and a counter-based random
stream that every rank can evaluate on its own.

`warp` gives the distribution P that sampling verification (lp.verify.sampling) walks. It applies
transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper in that order, with
min_tokens_to_keep=1, then a softmax, so lookahead sampling targets exactly the distribution of
`model.generate(do_sample=True, temperature=..., top_k=..., top_p=...)`. temperature=0 means
greedy: the one-hot of the argmax (first maximum on ties, as torch.argmax).

`uniforms(seed, stream, step, n)` is a pure function of its integer arguments (SplitMix64
hashing of a counter, no torch or numpy global RNG), so every rank and every run draws the same
numbers for the same (seed, stream, step): use the prompt index as `stream` and the decoding
step as `step`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lp.errors import LPError

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise LPError (one line) unless temperature >= 0, top_k >= 0 (0: off), 0 < top_p <= 1."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise LPError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise LPError(f"top_k must be an integer >= 0 (0: disabled), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise LPError(f"top_p must be a number in (0, 1] (1: disabled), got {top_p!r}")


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Next-token probabilities `[..., V]` from logits `[..., V]` (typically `[R, V]`).

    Computed in float32 (float64 input stays float64), like transformers' sampling. Top-k keeps
    ties with the k-th value; top-p keeps the smallest set of most likely tokens whose mass
    reaches top_p (at least one token), both on the temperature-scaled logits."""
    validate_sampling(temperature, top_k, top_p)
    scores = logits if logits.dtype == torch.float64 else logits.float()
    if temperature == 0:
        return torch.zeros_like(scores).scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    shape = scores.shape
    scores = scores.reshape(-1, shape[-1])
    if temperature != 1.0:
        scores = scores / float(temperature)
    if top_k != 0:
        k = min(top_k, scores.size(-1))
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -math.inf)
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = 0  # min_tokens_to_keep = 1
        remove = remove.scatter(1, sorted_indices, remove)
        scores = scores.masked_fill(remove, -math.inf)
    return scores.softmax(dim=-1).reshape(shape)


_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SMALL = 64  # up to this many numbers, Python integers are faster than numpy


def _mix(z: int) -> int:
    """SplitMix64's finalizer on a 64-bit integer."""
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _mix_np(z: np.ndarray) -> np.ndarray:
    """The same finalizer on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _key(seed: int, stream: int, step: int) -> int:
    """Hash (seed, stream, step) into one 64-bit key, mixing after each component."""
    key = 0
    for part in (seed, stream, step):
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)):
            raise TypeError(f"uniforms: seed, stream and step must be integers, got {part!r}")
        key = (_mix(key ^ ((int(part) + _GOLDEN) & _MASK)) + _GOLDEN) & _MASK
    return key


def _bits(key: int, n: int) -> list[int] | np.ndarray:
    """Top 53 bits of mix(key + i * golden) for i = 1..n."""
    if n <= _SMALL:
        return [_mix((key + i * _GOLDEN) & _MASK) >> 11 for i in range(1, n + 1)]
    with np.errstate(over="ignore"):
        counters = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
        return (_mix_np(np.uint64(key) + counters) >> np.uint64(11)).astype(np.float64)


def uniforms(seed: int, stream: int, step: int, n: int) -> torch.Tensor:
    """n float64 uniforms in the open interval (0, 1), a pure function of (seed, stream, step).

    Counter-based: u[i] = (top 53 bits of mix(key + (i+1) * golden) + 0.5) / 2**53, where mix is
    SplitMix64's finalizer and key hashes (seed, stream, step) (integers of any sign and size,
    taken mod 2**64). No state, no global RNG: the same on every process, platform and run;
    u[:m] is a prefix of u[:n]."""
    if n < 0:
        raise ValueError(f"uniforms: n must be >= 0, got {n}")
    bits = torch.as_tensor(_bits(_key(seed, stream, step), n), dtype=torch.float64)
    return (bits + 0.5) * 2.0**-53


__all__ = ["uniforms", "validate_sampling", "warp"]

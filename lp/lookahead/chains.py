"""A step's drafts as chains: draft c is `tokens[starts[c] : starts[c + 1]]`, from draft source
`sources[c]` (its row of counted rates, lp/lookahead/rates.py). The text index and the n-gram pool
append their drafts here (lp/lookahead/text.py, lp/lookahead/pool.py), best first by kind
(lp/lookahead/drafts.py), and the tree's growth reads them (lp/lookahead/grow.py)."""

from __future__ import annotations

import numpy as np
from numba.experimental import structref

from lp.jit import State, compiled


@structref.register
class ChainsType(State):
    pass


class Chains(structref.StructRefProxy):
    """Room for a step's drafts (`new_chains`): `count` of them so far."""

    @property
    def drafts(self) -> list[tuple[int, ...]]:
        """Every draft as a tuple of tokens."""
        tokens, starts = _arrays(self)
        flat, bounds = tokens.tolist(), starts.tolist()
        return [tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:])]

    @property
    def sources(self) -> np.ndarray:
        """Each draft's source."""
        return _sources(self)


structref.define_proxy(Chains, ChainsType, ["tokens", "starts", "sources", "count"])


@compiled
def new_chains(drafts: int, tokens: int) -> Chains:
    """Room for `drafts` drafts of `tokens` tokens in all."""
    return Chains(np.empty(tokens, np.int64), np.zeros(drafts + 1, np.int64), np.empty(drafts, np.int64), 0)


@compiled
def add(chains: Chains, seq: np.ndarray, at: int, length: int, source: int) -> None:
    """Append `seq[at : at + length]` as a draft of `source`."""
    c, s = chains.count, chains.starts[chains.count]
    tokens = chains.tokens
    for t in range(length):
        tokens[s + t] = seq[at + t]
    chains.starts[c + 1] = s + length
    chains.sources[c] = source
    chains.count = c + 1


@compiled
def holds(chains: Chains, first: int, seq: np.ndarray, at: int, length: int) -> bool:
    """Whether drafts `first`.. already hold `seq[at : at + length]`."""
    tokens, starts = chains.tokens, chains.starts
    for c in range(first, chains.count):
        s = starts[c]
        if starts[c + 1] - s == length:
            same = True
            for t in range(length):
                if tokens[s + t] != seq[at + t]:
                    same = False
                    break
            if same:
                return True
    return False


@compiled
def _arrays(chains: Chains) -> tuple[np.ndarray, np.ndarray]:
    return chains.tokens[: chains.starts[chains.count]], chains.starts[: chains.count + 1]


@compiled
def _sources(chains: Chains) -> np.ndarray:
    return chains.sources[: chains.count].copy()


__all__ = ["Chains", "add", "holds", "new_chains"]

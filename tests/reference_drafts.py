"""Plain references of the text index (lp/lookahead/text.py), the n-gram pool
(lp/lookahead/pool.py), the draft memory (lp/lookahead/memory.py) and a step's drafts
(lp/lookahead/drafts.py), for randomized equality tests: Python lists, dicts and tuples, one
n-gram or occurrence at a time."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from lp.config import DecodeConfig
from lp.lookahead.memory import CONTEXT, END, VISITS
from lp.lookahead.sources import KINDS, MEMORY_SOURCE, WINDOW_SOURCE
from lp.lookahead.text import MAX_MATCH, MIN_MATCH


class ListTextIndex:
    """The sequence and, per L-gram (MIN_MATCH <= L <= MAX_MATCH, and L = 1 with `lone`), the
    positions ending it, oldest first."""

    def __init__(self, tokens: Iterable[int] = (), indexed: bool = True, lone: bool = False) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._shortest = 1 if lone and indexed else MIN_MATCH
        self._longest = MAX_MATCH if indexed else 0
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        seq, ends = self.tokens, self._ends
        for token in tokens:
            seq.append(int(token))
            e = len(seq) - 1
            for L in range(self._shortest, min(self._longest, e + 1) + 1):
                ends.setdefault(tuple(seq[e - L + 1 :]), []).append(e)

    def lone_drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """The continuations of x0's occurrences whose token before is not x0's, newest first."""
        seq = self.tokens
        last = len(seq) - 1
        out: dict[tuple[int, ...], None] = {}
        if length < 1 or count < 1 or self._shortest > 1 or last < 1:
            return []
        for e in reversed(self._ends.get((seq[last],), ())):
            if e == last or (e > 0 and seq[e - 1] == seq[last - 1]):
                continue
            out.setdefault(tuple(seq[e + 1 : e + 1 + length]))
            if len(out) == count:
                break
        return list(out)

    def drafts(self, length: int, count: int) -> list[tuple[int, ...]]:
        """The longest matched suffix first, then the most recent occurrence; each occurrence
        once, at its longest match; distinct continuations."""
        seq = self.tokens
        last = len(seq) - 1
        out: dict[tuple[int, ...], None] = {}
        seen: set[int] = set()
        if length < 1 or count < 1:
            return []
        for L in range(min(MAX_MATCH, last + 1), MIN_MATCH - 1, -1):
            for e in reversed(self._ends.get(tuple(seq[last - L + 1 :]), ())):
                if e == last or e in seen:
                    continue
                seen.add(e)
                out.setdefault(tuple(seq[e + 1 : e + 1 + length]))
                if len(out) == count:
                    return list(out)
        return list(out)


class DictPool:
    """At most `capacity` tails per first token, least recently inserted evicted first; a tail
    inserted again moves to the newest and counts once more."""

    def __init__(self, n: int, capacity: int) -> None:
        self.n, self.capacity = n, capacity
        self.table: dict[int, OrderedDict[tuple[int, ...], int]] = {}

    def add(self, key: int, tail: Sequence[int]) -> None:
        if not self.capacity:
            return
        entries = self.table.setdefault(int(key), OrderedDict())
        tail = tuple(map(int, tail))
        entries[tail] = entries.pop(tail, 0) + 1
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def add_rows(self, grams: np.ndarray) -> None:
        for row in grams.tolist():
            self.add(row[0], row[1:])

    def add_sequence(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        for i in range(len(tokens) - self.n + 1):
            self.add(tokens[i], tokens[i + 1 : i + self.n])

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        return list(self.table.get(key, ()))

    def best(self, key: int, frequent: bool = False) -> list[tuple[int, ...]]:
        entries = self.table.get(key, {})
        newest = list(entries)[::-1]
        return sorted(newest, key=entries.__getitem__, reverse=True) if frequent else newest

    def __len__(self) -> int:
        return sum(map(len, self.table.values()))


class ListMemory:
    """The memory's generations as lists, fed as DraftMemory is."""

    def __init__(self, budget: int) -> None:
        self.half, self.older, self.newer = budget // 2, [], []

    def add(self, prompt: list[int], output: list[int]) -> None:
        tokens = [*prompt[-CONTEXT:], *output]
        if self.half < 2 or not tokens:
            return
        text = tokens[-(self.half - 1) :]
        if len(self.newer) + len(text) + 1 > self.half:
            self.older, self.newer = self.newer, []
        self.newer += [*text, END]

    def drafts(self, seq: list[int], length: int, count: int) -> list[tuple[tuple[int, ...], int]]:
        """Brute force: per generation (the newer first), the longest suffix match first, then the
        newest occurrence; an occurrence that matches one more token counted at that length. Each
        draft with its source among the memory's (its match: 4 tokens or more, 3, 2)."""
        out: list[tuple[tuple[int, ...], int]] = []
        n = len(seq)
        if length < 1 or count < 1 or n < MIN_MATCH or self.half < 2:
            return out
        for mem in (self.newer, self.older):
            visits = VISITS
            for L in range(min(MAX_MATCH, n), MIN_MATCH - 1, -1):
                longer = seq[n - L - 1 :] if L < MAX_MATCH and n > L else None
                occurs_longer = longer is not None and any(mem[e - L : e + 1] == longer for e in range(L, len(mem)))
                for e in range(len(mem) - 1, L - 2, -1):
                    if mem[e - L + 1 : e + 1] != seq[n - L :]:
                        continue
                    if visits == 0:
                        break
                    visits -= 1
                    if occurs_longer and e >= L and mem[e - L : e + 1] == longer:
                        continue
                    cont = []
                    for t in mem[e + 1 : e + 1 + length]:
                        if t == END:
                            break
                        cont.append(t)
                    if cont and tuple(cont) not in [d for d, _ in out]:
                        out.append((tuple(cont), min(max(MIN_MATCH + 2 - L, 0), 2)))
                        if len(out) == count:
                            return out
        return out


def listed_drafts(cfg: DecodeConfig, pool: DictPool, text: ListTextIndex) -> list[list[tuple[int, ...]]]:
    """A step's drafts by kind (lp/lookahead/drafts.py `step_drafts`) but the memory's: the text's
    drafts, the context-matched pool tails, the pool's tails, the drafts of x0's lone matches."""
    out = text.tokens
    x0 = out[-1]
    text_on = cfg.drafts == "pool+text"
    texts = text.drafts(cfg.draft_len, cfg.text_drafts) if text_on else []
    context = (
        [t[1:] for t in pool.best(out[-2]) if t[0] == x0]
        if cfg.pool_order == "context" and len(out) > 1 and pool.n > 2
        else []
    )
    lone = text.lone_drafts(cfg.draft_len, cfg.text_drafts) if text_on else []
    return [texts, context, pool.best(x0, cfg.pool_order == "frequent"), lone]


def listed_chains(
    cfg: DecodeConfig, pool: DictPool, text: ListTextIndex, row: Sequence[int] = (), memory: ListMemory | None = None
) -> tuple[list[tuple[int, ...]], list[int]]:
    """`step_drafts`: every draft and its source, the memory's (if any) after the other kinds, the
    window's `row` (if any) last."""
    drafts: list[tuple[int, ...]] = []
    sources: list[int] = []
    source = 0
    for ranks, found in zip(KINDS, listed_drafts(cfg, pool, text)):
        drafts += found
        sources += [source + min(r, ranks - 1) for r in range(len(found))]
        source += ranks
    if memory is not None and cfg.memory:
        for draft, among in memory.drafts(text.tokens, cfg.max_draft, cfg.text_drafts):
            drafts.append(draft)
            sources.append(MEMORY_SOURCE + among)
    if len(row):
        drafts.append(tuple(row))
        sources.append(WINDOW_SOURCE)
    return drafts, sources

"""The most the draft memory's texts could give a decode (tools.memory's ceiling), read off its
output and the texts the memory held when it started.

`reach`: at each output position, the longest right continuation (at most the longest draft a step
verifies) that follows any occurrence, in the memory's texts, of the text's last MIN_MATCH tokens.
Every draft lp/lookahead/memory.py could offer there is one of these occurrences' continuations,
whatever its match length, its rank among them or the visit limit; so a decode drawing on the texts
perfectly would be offered no more.

`steps_with`: the steps a recorded course would take had each step also been offered that longest
continuation. A step at position p commits one token more than the longer of the two: what the
course's step covering p still accepted past p (its own sources, as they were) and the texts' reach
at p. An estimate, not a bound either way: a step that starts mid-way through one of the course's
steps is credited that step's remaining tokens, which its own sources might not have drafted, and
nothing further, which they might have."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from lp.lookahead.text import MIN_MATCH


def reach(texts: list[np.ndarray], prompt: list[int], output: list[int], depth: int) -> list[int]:
    """The texts' longest right continuation at each of the output's positions (`depth` at most).
    `texts`: the memory's generations (DraftMemory.texts()), each text ending with its END mark,
    which no token equals, so no continuation runs past a text's end."""
    seq = np.concatenate(texts).tolist()
    after: dict[tuple[int, ...], list[int]] = defaultdict(list)  # a MIN_MATCH-gram: where the text goes on
    for i in range(MIN_MATCH, len(seq)):
        after[tuple(seq[i - MIN_MATCH : i])].append(i)
    text = [*prompt, *output]
    out = []
    for p in range(len(output)):
        n = len(prompt) + p
        target = output[p : p + depth]
        best = 0
        for i in after.get(tuple(text[n - MIN_MATCH : n]), ()) if n >= MIN_MATCH else ():
            m = 0
            while m < len(target) and i + m < len(seq) and seq[i + m] == target[m]:
                m += 1
            best = max(best, m)
        out.append(best)
    return out


def steps_with(course: list[int], reaches: list[int]) -> int:
    """The steps of a course (each step's committed tokens, in order) had each step also been
    offered the texts' continuation at its position (`reaches`: `reach`'s)."""
    ends = np.cumsum(course)  # the course's step j covers positions [ends[j - 1], ends[j])
    p = steps = 0
    while p < len(reaches):
        own = int(ends[np.searchsorted(ends, p, side="right")]) - p - 1
        p += 1 + max(own, reaches[p])
        steps += 1
    return steps


def short_steps(course: list[int], reaches: list[int]) -> int:
    """The course's steps at whose start the texts reached further than the step accepted."""
    starts = np.cumsum([0, *course[:-1]])
    return sum(reaches[s] > c - 1 for s, c in zip(starts, course))

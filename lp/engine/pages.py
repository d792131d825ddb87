"""The KV cache's pages: its slots in pages of PAGE, lent to the sequences as they grow and given
back when they leave, so the cache's memory holds what the sequences hold, not a slot of the
longest context per sequence (docs/design.md section 5).

A sequence's KV lies in its pages in order (its page table, `SequenceKV.pages`): storage index i
(its i-th token: committed ones at their sequence positions, a step's tokens after them in step
order) at slot `pages[i // PAGE] * PAGE + i % PAGE`. Every slot's owner (a sequence's id) and the
storage index it holds live on the device (`PagePool.owner`, `.index`), where the attention mask
reads them (lp/engine/attention.py `visible`), so a step needs no page table on the device.

Page 0 is never lent: the pad tokens of a fixed-shape step write there and see only its first
slot (owner PAD), so no real token ever sees them.

The pool is sized once (`kv_tokens`); admission promises each sequence its worst case (prompt,
new tokens and one step's speculative tokens, `promise`), so no decode runs out of pages halfway,
while the pages it holds are only those it has reached."""

from __future__ import annotations

import numpy as np
import torch

from lp.errors import LPError

PAGE = 16  # slots a page: a sequence wastes at most 15 (FlexAttention's key blocks of 128 hold 8)
PAD = -1  # owner of page 0: the pad tokens of fixed-shape steps
FREE = -2  # owner of a page not lent


def pages_for(tokens: int) -> int:
    """Pages that hold `tokens` storage indices."""
    return -(-tokens // PAGE)


class PagePool:
    """The pages of a cache of `pages` pages on `device`: which are free, which sequence owns
    each slot and which storage index it holds, and the pages promised to admitted sequences."""

    def __init__(self, pages: int, device: torch.device) -> None:
        if pages < 2:
            raise LPError(f"the KV cache needs at least 2 pages of {PAGE} slots, got {pages}")
        self.pages = pages
        self.owner = torch.full((pages * PAGE,), FREE, dtype=torch.long, device=device)
        self.owner[:PAGE] = PAD
        self.index = torch.arange(PAGE, device=device).repeat(pages)
        self._steps = torch.arange(PAGE, device=device)
        self._free = list(range(pages - 1, 0, -1))  # pop() lends the lowest: one sequence alone gets a run
        self.promised = 0

    @property
    def free(self) -> int:
        """Pages not lent now."""
        return len(self._free)

    @property
    def lendable(self) -> int:
        """Pages that no admitted sequence may still need (page 0 is never lent)."""
        return self.pages - 1 - self.promised

    def promise(self, pages: int) -> None:
        """Promise `pages` to a sequence being admitted (an LPError where they are not there)."""
        if pages > self.lendable:
            raise LPError(
                f"the KV cache has {self.lendable} pages of {PAGE} tokens left for a sequence that may need {pages}"
            )
        self.promised += pages

    def lend(self, owner: int, i: int) -> int:
        """A free page, lent to sequence `owner` as its `i`-th."""
        page = self._free.pop()
        at = slice(page * PAGE, (page + 1) * PAGE)
        self.owner[at] = owner
        torch.add(self._steps, i * PAGE, out=self.index[at])
        return page

    def give_back(self, pages: list[int], promised: int) -> None:
        """A leaving sequence's pages, and the pages promised to it."""
        for page in pages:
            self.owner[page * PAGE : (page + 1) * PAGE] = FREE
        self._free.extend(reversed(pages))
        self._free.sort(reverse=True)
        self.promised -= promised


class SequenceKV:
    """One sequence's pages (its page table) and its committed KV length: the one owner of that
    length on the host (the device holds no length; a step's slots say where its tokens go)."""

    def __init__(self, pool: PagePool, owner: int, most: int) -> None:
        """`most`: the storage indices the sequence may ever use, promised now."""
        self.pool, self.owner = pool, owner
        self.promised = pages_for(most)
        pool.promise(self.promised)
        self.pages: list[int] = []
        self._table = np.zeros(0, np.int64)
        self.length = 0

    def reserve(self, tokens: int) -> None:
        """Hold the pages of storage indices `[0, tokens)`."""
        need = pages_for(tokens)
        if need > self.promised:
            raise LPError(f"a sequence needs {tokens} KV slots, more than the {self.promised * PAGE} promised to it")
        if need > len(self.pages):
            self.pages += [self.pool.lend(self.owner, i) for i in range(len(self.pages), need)]
            self._table = np.asarray(self.pages, dtype=np.int64)

    def slots(self, start: int, n: int) -> np.ndarray:
        """The slots of storage indices `start .. start + n - 1` (held: `reserve`)."""
        i = np.arange(start, start + n, dtype=np.int64)
        return self._table[i // PAGE] * PAGE + i % PAGE

    @property
    def table(self) -> np.ndarray:
        """The pages in order, int64."""
        return self._table

    def release(self) -> None:
        """Give every page back (the sequence has left)."""
        self.pool.give_back(self.pages, self.promised)
        self.pages, self._table, self.promised, self.length = [], np.zeros(0, np.int64), 0, 0


__all__ = ["FREE", "PAD", "PAGE", "PagePool", "SequenceKV", "pages_for"]

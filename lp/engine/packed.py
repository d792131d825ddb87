"""A packed step: the tokens of every sequence a step feeds, side by side in one forward.

Each sequence contributes a segment: its pending tokens, window and tree (lp/lookahead/mask.py's
layout of its step), or a chunk of its prompt. A segment's tokens go to its sequence's next
storage indices (lp/engine/pages.py), see that sequence's committed KV and, within the segment,
what its block allows (lp/engine/attention.py `Visibility`). `PackedStep` holds the host side as
named per-token arrays; the forward's inputs are exactly the step's tokens (`exact`: eager steps,
attention by groups of segments) or padded to a bucket (`padded`: fixed shapes, lp/engine/fixed_steps.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from lp.engine.attention import FLEX_BLOCK, Group, Grouped, Visibility
from lp.engine.pages import PAD, PAGE, pages_for
from lp.errors import LPError
from lp.jit import compiled
from lp.lookahead.mask import StepLayout

BUCKETS = (1, 16, 32, 64, 128, 256, 512)  # few graphs, little padding; plain decoding stays at 1
# what one more attention group costs (its gathers, sdpa and copies on every layer), in pages
# gathered: a bucket's sequences split into groups of like lengths where the pages a group pads to
# its longest cost more. On a 2-core CPU (SmolLM2-135M, scratch timings of tools.attention_groups'
# steps) 48 to 128 timed alike, while 8 or 16 split 32 chat prompts of 40-90 tokens into groups
# that cost 20% more than one
GROUP_CALL_PAGES = 64
LARGE = 256  # beyond the last bucket, steps round up to a multiple of this


def buckets(tokens: np.ndarray) -> np.ndarray:
    """The padded size of a step of each count of `tokens` (integers): the first bucket that holds
    it, beyond the last a multiple of LARGE."""
    at = np.searchsorted(BUCKETS, tokens)
    return np.where(at < len(BUCKETS), np.take(BUCKETS, at, mode="clip"), -(-tokens // LARGE) * LARGE)


def bucket(tokens: int) -> int:
    """The padded size of a step of `tokens` tokens."""
    return int(buckets(np.asarray(tokens)))


@dataclass(eq=False)
class Segment:
    """One sequence's tokens in a step: ids and positions (RoPE's), the `[n, n]` block of which of
    them each sees, the rows whose logits the step returns (the segment's own indices), each
    token's depth below x0 (a tree node's: its distance from x0), and the tree nodes' parents (-1:
    x0; the nodes are the segment's last tokens; none in a prompt chunk). `owner`, `length`,
    `pages`: its sequence's page owner id, committed KV length and page table (holding
    `length + n`)."""

    owner: int
    ids: np.ndarray
    positions: np.ndarray
    block: np.ndarray
    rows: np.ndarray
    depth: np.ndarray
    parents: np.ndarray
    length: int
    pages: np.ndarray

    @property
    def size(self) -> int:
        return len(self.ids)


def step_segment(owner: int, layout: StepLayout, ids: np.ndarray, x0: int, length: int, pages: np.ndarray) -> Segment:
    """A sequence's step laid out as `layout` (lp/lookahead/mask.py), its x0 at position `x0`,
    after `length` committed tokens."""
    return Segment(
        owner=owner,
        ids=ids,
        positions=x0 + layout.depth,
        block=layout.mask,
        rows=layout.logit_rows,
        depth=layout.depth,
        parents=layout.parents,
        length=length,
        pages=pages,
    )


def prompt_chunk(owner: int, ids: np.ndarray, start: int, pages: np.ndarray, logits: bool = False) -> Segment:
    """A chunk of a prompt, tokens at positions `start ..` after `start` committed: causal, no
    logits (`logits`: every row's, as a timed step computes what a tree's nodes need)."""
    n = len(ids)
    none = np.zeros(0, np.int64)
    block = np.tri(n, dtype=np.bool_)
    rows = np.arange(n) if logits else none
    return Segment(owner, ids, np.arange(start, start + n), block, rows, np.zeros(n, np.int64), none, start, pages)


@dataclass(eq=False)
class PackedStep:
    """A step's segments side by side (host arrays): per token its id, position, slot (where its KV
    goes), sequence (`owner`), that sequence's committed length, its segment's first token
    (`base`) and size, and its depth; the step's `[n, n]` block (segments' blocks on the
    diagonal); the rows whose logits the step returns; every segment's tree parents; per segment
    the pages its sequence holds to the step's end (`pages`); and where each segment's tokens,
    rows and parents start (`starts`, `row_starts`, `parent_starts`, one
    more than segments)."""

    segments: list[Segment]
    ids: np.ndarray = field(init=False)
    positions: np.ndarray = field(init=False)
    slots: np.ndarray = field(init=False)
    owner: np.ndarray = field(init=False)
    length: np.ndarray = field(init=False)
    base: np.ndarray = field(init=False)
    size: np.ndarray = field(init=False)
    depth: np.ndarray = field(init=False)
    block: np.ndarray = field(init=False)
    rows: np.ndarray = field(init=False)
    parents: np.ndarray = field(init=False)
    pages: np.ndarray = field(init=False)
    starts: np.ndarray = field(init=False)
    row_starts: np.ndarray = field(init=False)
    parent_starts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        segs = self.segments
        sizes = np.array([s.size for s in segs], np.int64)
        self.starts = np.concatenate(([0], np.cumsum(sizes)))
        self.row_starts = np.concatenate(([0], np.cumsum([len(s.rows) for s in segs])))
        self.parent_starts = np.concatenate(([0], np.cumsum([len(s.parents) for s in segs])))
        cat = np.concatenate
        self.ids = cat([s.ids for s in segs]).astype(np.int64, copy=False)
        self.positions = cat([s.positions for s in segs]).astype(np.int64, copy=False)
        self.depth = cat([s.depth for s in segs]).astype(np.int64, copy=False)
        lengths = np.array([s.length for s in segs], np.int64)
        self.owner = np.repeat([s.owner for s in segs], sizes)
        self.length = np.repeat(lengths, sizes)
        self.base = np.repeat(self.starts[:-1], sizes)
        self.size = np.repeat(sizes, sizes)
        self.pages = pages_for(lengths + sizes)
        # each token's slot: its storage index's page, looked up in its segment's table (all the
        # segments' tables end to end, by array ops, not a pass over the tokens per segment)
        index = self.length + np.arange(len(self.ids)) - self.base
        tables = cat([s.pages[:p] for s, p in zip(segs, self.pages.tolist())]).astype(np.int64, copy=False)
        if len(tables) != self.pages.sum():  # else a short table's tokens would land in the next one's pages
            raise LPError("a segment's page table holds fewer pages than its step needs: reserve them first")
        first = np.repeat(np.concatenate(([0], np.cumsum(self.pages)[:-1])), sizes)
        self.slots = tables[first + index // PAGE] * PAGE + index % PAGE
        T = int(self.starts[-1])
        self.block = np.zeros((T, T), np.bool_)
        for a, s in zip(self.starts, segs):
            self.block[a : a + s.size, a : a + s.size] = s.block
        self.rows = cat([s.rows + a for a, s in zip(self.starts, segs)]).astype(np.int64, copy=False)
        self.parents = cat([s.parents for s in segs]).astype(np.int64, copy=False)

    @property
    def tokens(self) -> int:
        return len(self.ids)

    def groups(self, call_pages: int = GROUP_CALL_PAGES) -> list[tuple[np.ndarray, int]]:
        """The segments by size bucket, each bucket's split by length (`by_length`): each group's
        segment indices and padded size."""
        sizes = np.diff(self.starts)
        by_bucket: dict[int, list[int]] = {}
        for i, B in enumerate(buckets(sizes).tolist()):
            by_bucket.setdefault(B, []).append(i)
        out = []
        for members in by_bucket.values():
            for m in by_length(np.asarray(members, np.int64), self.pages[members], call_pages):
                out.append((m, int(sizes[m].max())))
        return out


def by_length(members: np.ndarray, pages: np.ndarray, call_pages: int = GROUP_CALL_PAGES) -> list[np.ndarray]:
    """`members` (their pages `pages`) split into groups of like lengths: a group gathers each
    member's pages padded to its longest's, so the split that gathers the fewest pages, each group
    counted `call_pages` more (the best of the splits of the members sorted by length)."""
    if len(members) == 1:
        return [members]
    order = np.argsort(-pages, kind="stable")
    cut = _length_cuts(pages[order].astype(np.int64), call_pages)
    groups, j = [], len(members)
    while j:
        groups.append(np.sort(members[order[cut[j] : j]]))
        j = cut[j]
    return groups[::-1]


@compiled
def _length_cuts(p: np.ndarray, call: int) -> np.ndarray:
    """For lengths `p` sorted longest first: per j, where the last group of the cheapest split of
    the first j starts (a group of i..j-1 costs (j - i) x p[i] + `call`)."""
    n = len(p)
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, np.int64)
    for j in range(1, n + 1):
        best[j] = np.inf
        for i in range(j):
            c = best[i] + (j - i) * p[i] + call
            if c < best[j]:
                best[j], cut[j] = c, i
    return cut


@dataclass(eq=False)
class PackedTensors:
    """A packed step on the device: ids, positions, slots and logit rows (padded to `tokens`
    with pad tokens at fixed shapes), what the tokens see, the tree parents and depths (for the
    verifier), and how the layers attend (`attend`, one of lp/engine/attention.py's)."""

    step: PackedStep
    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    rows: torch.Tensor
    depth: torch.Tensor
    parents: torch.Tensor
    visible: Visibility
    attend: object = None

    def segment(self, i: int) -> SegmentTensors:
        """Segment i's views, as its sequence's verifier reads them."""
        s = self.step
        a, b = int(s.starts[i]), int(s.starts[i + 1])
        n = int(s.parent_starts[i + 1] - s.parent_starts[i])
        p = int(s.parent_starts[i])
        return SegmentTensors(
            ids=self.ids[a:b],
            rows=slice(int(s.row_starts[i]), int(s.row_starts[i + 1])),
            parents=self.parents[p : p + n],
            tree_depth=self.depth[b - n : b],
            tree_ancestors=self.visible.block[b - n : b, b - n : b],
            slots=self.slots[a:b],
        )


@dataclass(frozen=True)
class SegmentTensors:
    """One segment of a packed step on the device: its ids and slots, its logits rows (a slice of
    the step's), its tree's parents, depths and `[n, n]` ancestors (`[i, j]`: j is i or above it)."""

    ids: torch.Tensor
    rows: slice
    parents: torch.Tensor
    tree_depth: torch.Tensor
    tree_ancestors: torch.Tensor
    slots: torch.Tensor


def on_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host array `a` on `device`: on a GPU copied from pinned memory (a pageable copy waits for the
    device's queued work)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)


def exact(
    step: PackedStep,
    slot_owner: torch.Tensor,
    slot_index: torch.Tensor,
    groups: int,
    call_pages: int = GROUP_CALL_PAGES,
) -> PackedTensors:
    """`step` at its exact size, attending by groups of segments (`Grouped`, grouped by size and
    length: `PackedStep.groups`); `groups`: query heads a kv head (the mask's folded rows; 0: no
    attention made, for a forward that computes none)."""
    dev = slot_owner.device
    t = {
        name: on_device(getattr(step, name), dev) for name in ("ids", "positions", "slots", "rows", "depth", "parents")
    }
    visible = Visibility(
        *(on_device(getattr(step, name), dev) for name in ("owner", "length", "base", "size", "block")),
        slot_owner,
        slot_index,
    )
    on = PackedTensors(step, visible=visible, **t)
    if groups:
        on.attend = _grouped(step, visible, groups, dev, call_pages)
    return on


def _grouped(step: PackedStep, visible: Visibility, heads: int, dev: torch.device, call_pages: int) -> Grouped:
    parts = step.groups(call_pages)
    out = []
    for members, n in parts:
        segs = [step.segments[i] for i in members]
        p = int(step.pages[members].max())
        # each member's queries, its last repeated to the group's size; `real`: the unrepeated ones
        sizes = (step.starts[members + 1] - step.starts[members])[:, None]
        queries = step.starts[members][:, None] + np.minimum(np.arange(n), sizes - 1)
        real = np.flatnonzero(np.arange(n) < sizes)
        pages = np.zeros((len(segs), p), np.int64)  # the pad page: its owner matches no token
        for r, (i, s) in enumerate(zip(members, segs)):
            used = step.pages[i]
            pages[r, :used] = s.pages[:used]
        padded = len(real) < queries.size
        run = None
        if len(segs) == 1 and (np.diff(pages[0]) == 1).all():
            run = slice(int(pages[0, 0]) * PAGE, int(pages[0, -1] + 1) * PAGE)
        q = on_device(queries, dev)
        slots = on_device((pages[:, :, None] * PAGE + np.arange(PAGE)).reshape(len(segs), -1), dev)
        mask = visible(q[:, :, None], slots[:, None, :])[:, None]
        out.append(
            Group(
                queries=q,
                pages=None if run is not None else on_device(pages, dev),
                run=run,
                mask=mask.repeat(1, 1, heads, 1) if heads > 1 else mask,
                rows=on_device(real, dev) if padded else None,
                tokens=on_device(queries.reshape(-1)[real], dev),
            )
        )
    whole = len(out) == 1 and out[0].rows is None and len(parts[0][0]) == 1
    return Grouped(out, whole)


def flex_blocks(step: PackedStep, B: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of FLEX_BLOCK queries of a step padded to B tokens, the key blocks it visits: those
    holding pages of its sequences up to their step's end, and the pad page's (block 0), as
    `[n_q]` counts and `[n_q, blocks]` indices."""
    n_q, per = -(-B // FLEX_BLOCK), FLEX_BLOCK // PAGE
    counts = np.zeros(n_q, np.int32)
    indices = np.zeros((n_q, blocks), np.int32)
    for qb in range(n_q):
        lo, hi = qb * FLEX_BLOCK, (qb + 1) * FLEX_BLOCK
        seen = [np.zeros(1, np.int64)]
        for i, (a, s) in enumerate(zip(step.starts, step.segments)):
            if a < hi and a + s.size > lo:
                seen.append(s.pages[: step.pages[i]] // per)
        visit = np.unique(np.concatenate(seen))
        counts[qb] = len(visit)
        indices[qb, : len(visit)] = visit
    return counts, indices


def padded(step: PackedStep, B: int) -> dict[str, np.ndarray]:
    """The per-token arrays of `step` padded to B tokens: a pad token writes to slot 0 (the pad
    page's first) and sees only it; pad rows read row 0."""
    T, R = step.tokens, len(step.rows)
    out = {}
    for name, fill in (
        ("ids", 0),
        ("positions", 0),
        ("slots", 0),
        ("owner", PAD),
        ("length", 1),
        ("size", 0),
        ("depth", 0),
    ):
        a = np.full(B, fill, np.int64)
        a[:T] = getattr(step, name)
        out[name] = a
    out["base"] = np.arange(B, dtype=np.int64)
    out["base"][:T] = step.base
    rows = np.zeros(B, np.int64)
    rows[:R] = step.rows
    out["rows"] = rows
    block = np.eye(B, dtype=np.bool_)
    block[:T, :T] = step.block
    out["block"] = block
    return out


__all__ = [
    "BUCKETS",
    "GROUP_CALL_PAGES",
    "LARGE",
    "PackedStep",
    "PackedTensors",
    "Segment",
    "SegmentTensors",
    "bucket",
    "by_length",
    "exact",
    "flex_blocks",
    "padded",
    "prompt_chunk",
    "step_segment",
]

"""W=auto's ladder: the lookahead step shapes it chooses between (`Shape`, `LADDER`), each
sized for P ranks whose shares fill their buckets, and the tokens one rank feeds in a step of one."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

from lp.config import DRAFT_LEN, NUMBER_OPTIONS, SUCCESSORS, DecodeConfig
from lp.decode.shares import share_cap
from lp.engine.packed import BUCKETS, LARGE


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A lookahead step's shape: DecodeConfig's keys that W=auto chooses. W window columns, n-gram
    size N, G pool n-grams per first token; the step's size, `step_tokens`, and the tree's limit
    where it does not follow from it (`tree_tokens`); `successors` kept per token; text drafts
    from x0's lone matches too (`lone_matches`), of at most `draft_len` tokens; the text's
    continuations below each node (`continuation_len`)."""

    W: int
    N: int
    G: int
    step_tokens: int
    tree_tokens: int | None = None
    successors: int = SUCCESSORS
    lone_matches: bool = False
    draft_len: int = DRAFT_LEN
    continuation_len: int = 0

    @property
    def config(self) -> DecodeConfig:
        return DecodeConfig(**asdict(self))

    @classmethod
    def of(cls, cfg: DecodeConfig) -> Shape:
        """The shape `cfg` steps in: its size the largest step, its tree's limit where another than
        the size gives, the successors as its steps send them. A shape's steps take text drafts
        (`drafts` is not one of its keys): `cfg`'s without them are priced as if they could commit
        a text draft's length."""
        given = {f.name: getattr(cfg, f.name) for f in fields(cls)}  # every key, however many a shape has
        shape = cls(
            **{**given, "step_tokens": cfg.largest_step, "tree_tokens": None, "successors": cfg.successors_sent}
        )
        tree = cfg.tree_limit
        return shape if shape.config.tree_limit == tree else replace(shape, tree_tokens=tree)

    def _extras(self) -> list[tuple[str, str, object]]:
        """(name part, key, value) of the keys that differ from their defaults, in field order."""
        letters = {key: letter for letter, key in NUMBER_OPTIONS.items()}
        out = []
        for f in fields(self)[4:]:
            value = getattr(self, f.name)
            if value != f.default:
                out.append(("lone" if f.name == "lone_matches" else f"{letters[f.name]}{value}", f.name, value))
        return out

    @property
    def name(self) -> str:
        """The shape as lp.bench names configs: W3N3G15-L128-D14 (lp/bench/shapes.py)."""
        return f"W{self.W}N{self.N}G{self.G}-L{self.step_tokens}" + "".join(f"-{part}" for part, _, _ in self._extras())

    def describe(self) -> str:
        extra = "".join(f" {key}={'true' if v is True else v}" for _, key, v in self._extras())
        return f"W={self.W} N={self.N} G={self.G} step_tokens={self.step_tokens}{extra}"


# Shapes of growing step size (11 to 1,024 tokens). Up to 32 tokens, the tree gets what the
# pending tokens leave (one replica's x0 alone, P ranks' last commit) and text drafts come from
# x0's lone matches too (prompt lookup's fallback). A small window and a tree of the rest: at 11
# tokens, the size prompt lookup feeds, W1 N2 (no window token: the column is x0's own prediction;
# a tree of up to 9, so at most 10 tokens a step on one replica), above prompt lookup in every
# category; W1 N3 at 16; from 32, W3 N3, which gave the most S at 128 tokens (results/tree); more
# recycled successors from 512 tokens; text drafts of up to 14 tokens at 128 and 16 at 1,024, where
# each node also goes on as the text did after its token. The budget sweep measures them
# (results/sweep/spec_bench_48; its screens compare the shapes tried at 11, 128 and 1,024 tokens).
LADDER: tuple[Shape, ...] = (
    Shape(W=1, N=2, G=15, step_tokens=11, tree_tokens=9, lone_matches=True),
    Shape(W=1, N=3, G=15, step_tokens=16, tree_tokens=14, lone_matches=True),
    Shape(W=3, N=3, G=15, step_tokens=32, tree_tokens=26, lone_matches=True),
    Shape(W=3, N=3, G=15, step_tokens=64),
    Shape(W=3, N=3, G=15, step_tokens=128, draft_len=14),
    Shape(W=3, N=3, G=15, step_tokens=256),
    Shape(W=3, N=3, G=15, step_tokens=512, successors=16),
    Shape(W=3, N=3, G=15, step_tokens=1024, successors=16, draft_len=16, continuation_len=16),
)


@lru_cache(maxsize=256)  # W=auto prices each shape a few times a sequence
def rank_tokens(shape: Shape, P: int = 1) -> int:
    """The most tokens one of P ranks feeds in a step of `shape`: the pending tokens on every rank,
    the window's columns and the tree split evenly (lp/partition.py balances them), at most the
    bucket its greedy shares are cut to (lp/decode/shares.py)."""
    cfg = shape.config
    even = cfg.max_commit + math.ceil((cfg.largest_step - cfg.max_commit) / P)
    return min(even, share_cap(cfg, P) or even)


def for_ranks(shape: Shape, P: int) -> Shape:
    """`shape` with its step sized for P ranks whose shares fill a bucket: its size cut to P
    shares of the largest bucket within an even share (unchanged where it is P of them already,
    as the ladder's are at powers of two of P, where an even share is under the least bucket but
    one, and on one rank)."""
    share = math.ceil(shape.step_tokens / P)
    B = max([b for b in BUCKETS[1:] if b <= share] + [share // LARGE * LARGE])
    if P == 1 or not B or P * B >= shape.step_tokens:  # a share under the least bucket past 1 is left so
        return shape
    return replace(shape, step_tokens=P * B)


@lru_cache(maxsize=16)
def ladder(P: int = 1) -> tuple[Shape, ...]:
    """The ladder's shapes, each sized for P ranks (`for_ranks`)."""
    return tuple(for_ranks(shape, P) for shape in LADDER)


__all__ = ["LADDER", "Shape", "for_ranks", "ladder", "rank_tokens"]

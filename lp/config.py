"""Decoding settings and their validation (one clear error per bad value)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from lp.errors import LPError
from lp.partition import RankPlan
from lp.verify.distribution import validate_sampling

MODES = ("lookahead", "ar")
AUTO_KEYS = ("W", "N", "G")  # may be "auto": lp/decode/auto.py chooses them
DRAFTS = ("pool", "pool+text")
POOL_ORDERS = ("recent", "frequent", "context")
SUCCESSORS = 8  # successors kept per token unless `successors` says otherwise
DRAFT_LEN = 10  # the longest text draft unless `draft_len` says otherwise
# the number-valued keys as a config name spells them after a dash (lp/bench/shapes.py, W=auto's
# shapes): W3N3G15-L128-D14 is step_tokens=128 draft_len=14. Not W, N, G, P (LP replicas), T (a
# tensor-parallel group's ranks) nor S (tokens a step commits).
NUMBER_OPTIONS = {
    "L": "step_tokens",
    "B": "tree_tokens",
    "D": "draft_len",
    "X": "text_drafts",
    "C": "pool_size",
    "R": "successors",
    "F": "continuation_len",
}


@dataclass(frozen=True)
class DecodeConfig:
    """W lookahead columns, N n-gram size, G pool n-grams per first token that a step may verify.

    `mode="ar"` decodes one token per step in the same runtime (W, N, G ignored).
    `pool_from_prompt` seeds the n-gram pool with the prompt's own n-grams and `pool_from_output`
    adds those of the generated text as it grows. `temperature` 0 is greedy; above 0, tokens are
    sampled from the model's distribution (after `top_k`, `top_p`) exactly, by the paper's
    Algorithm 4; the lookahead branch and the pool stay greedy.

    A step's size: `step_tokens`, the most tokens a step feeds (its pending tokens, the window and
    the tree): each step's tree gets what its pending tokens leave of it, at most `tree_tokens`.
    One replica feeds x0 alone (the drafts' KV is kept: lp/worker.py `keep`); over P ranks the
    tokens the last step committed are re-fed. `tree_tokens` (None) follows from it: what a step
    after the longest commit leaves, so the tree's size does not change (without `step_tokens`:
    G*(N-1), the classic branch's size, and no cap on the step).

    `drafts`: where verification candidates come from: `pool` (the n-gram pool, N-1 tokens each)
    or `pool+text` (also continuations of the text's longest suffix matches, up to `draft_len`
    tokens; `text_drafts` of them per step; with `lone_matches`, those of x0's lone matches too, as
    prompt lookup falls back to, as a source of their own). `pool_size`: n-grams the pool keeps per
    first token (None: G). `pool_order`: the order of the pool's candidates: `context` (those that
    also match the token before x0 first, then newest; measured best), `recent` (newest first) or
    `frequent` (most often produced first). `tree`: verify candidates that share a prefix once (a
    token tree grown best first across all sources, lp/lookahead/grow.py); false: one chain per
    candidate. `successors`: the model's top-k next tokens kept per token from the logits rows of
    every step but those of plain batched decoding (lp/lookahead/successors.py), whose paths
    compete with the other drafts' tokens for the tree (0: off; None: SUCCESSORS, or the shape's
    where `W=auto` chose it). `continuation_len`:
    below each tree node (but those it made), the text after an earlier occurrence of its token,
    the one whose tokens before it match the node's path longest, up to this many tokens (at most
    the longest draft), sources with their own counted rates (0: off; text drafts only).
    `memory`: draw on the draft memory of earlier decodes (lp/lookahead/memory.py; LP's
    `draft_memory`), `text_drafts` of its drafts a step as a source of its own, start the sources'
    rates from what it counted, and teach it this decode's text and counts when it ends (false:
    none of these)."""

    W: int = 5
    N: int = 3
    G: int = 5
    max_new_tokens: int = 128
    mode: str = "lookahead"
    seed: int = 0
    pool_from_prompt: bool = True
    pool_from_output: bool = True
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    drafts: str = "pool+text"
    tree: bool = True
    step_tokens: int | None = None
    tree_tokens: int | None = None
    draft_len: int = DRAFT_LEN
    text_drafts: int = 4
    lone_matches: bool = False
    pool_size: int | None = None
    pool_order: str = "context"
    successors: int | None = None
    continuation_len: int = 0
    memory: bool = True

    def validate(self) -> DecodeConfig:
        if self.mode not in MODES:
            raise LPError(f"mode must be one of {MODES}, got {self.mode!r}")
        for key, low in (("W", 1), ("N", 2), ("G", 0), ("max_new_tokens", 1), ("draft_len", 0), ("text_drafts", 0)):
            _check_int(key, getattr(self, key), low)
        for key in ("tree_tokens", "pool_size", "successors"):
            if getattr(self, key) is not None:
                _check_int(key, getattr(self, key), 0)
        _check_int("continuation_len", self.continuation_len, 0)
        validate_sampling(self.temperature, self.top_k, self.top_p)
        if self.drafts not in DRAFTS:
            raise LPError(f"drafts must be one of {DRAFTS}, got {self.drafts!r}")
        if self.pool_order not in POOL_ORDERS:
            raise LPError(f"pool_order must be one of {POOL_ORDERS}, got {self.pool_order!r}")
        for key in ("tree", "lone_matches", "pool_from_prompt", "pool_from_output", "memory"):
            if not isinstance(getattr(self, key), bool):
                raise LPError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.step_tokens is not None:
            least = self.fixed_tokens + 1
            if type(self.step_tokens) is not int or self.step_tokens < least:
                raise LPError(
                    f"step_tokens must be an integer >= {least} (x0, the window's {least - 2} tokens and one "
                    f"tree node), got {self.step_tokens!r}"
                )
        return self

    @cached_property
    def lookahead(self) -> bool:
        return self.mode == "lookahead"

    @cached_property
    def fixed_tokens(self) -> int:
        """Tokens every step feeds whatever its tree: x0 and the window's (lp.partition)."""
        return RankPlan(range(self.W), range(0)).cost(self.N) if self.lookahead else 1

    @cached_property
    def max_draft(self) -> int:
        """The longest draft a step verifies (N-1 from the pool, `draft_len` from the text)."""
        return max(self.N - 1, self.draft_len if self.drafts == "pool+text" else 0)

    @cached_property
    def tree_limit(self) -> int:
        """The most tree nodes a step verifies (`tree_tokens`, or what follows from the step's size)."""
        if self.tree_tokens is not None:
            return self.tree_tokens
        if self.step_tokens is not None:
            return max(0, self.step_tokens - self.fixed_tokens - self.max_draft)
        return self.G * (self.N - 1)

    @cached_property
    def step_shape(self) -> tuple[int, int, int, int]:
        """(W, N, G, tree_limit) as the steps run them: (0, 2, 0, 0) in `ar` mode."""
        return (self.W, self.N, self.G, self.tree_limit) if self.lookahead else (0, 2, 0, 0)

    @cached_property
    def max_commit(self) -> int:
        """The most tokens a step commits: the longest draft its tree (and its size, after a
        one-token commit) holds, plus one."""
        if not self.lookahead:
            return 1
        longest = min(self.max_draft, self.tree_limit)
        return 1 + (longest if self.step_tokens is None else min(longest, self.step_tokens - self.fixed_tokens))

    def tree_budget(self, pending: int) -> int:
        """The tree nodes of a step that feeds `pending` tokens first: the tree's limit, cut to what
        `step_tokens` leaves."""
        budget = self.step_shape[3]
        if self.step_tokens is None:
            return budget
        return max(0, min(budget, self.step_tokens - self.fixed_tokens - (pending - 1)))

    @cached_property
    def largest_step(self) -> int:
        """The most tokens a step feeds one rank at any world size: `max_commit` pending tokens
        (re-fed over P ranks; one replica feeds x0 alone), every window column and the whole
        tree, or `step_tokens` where it is less."""
        W, N, _, budget = self.step_shape
        most = RankPlan(range(W), range(budget)).cost(N, pending=self.max_commit, candidate_tokens=1)
        return most if self.step_tokens is None else min(most, self.step_tokens)

    @cached_property
    def pool_capacity(self) -> int:
        """N-grams the pool keeps per first token (none without G)."""
        return self.G if self.pool_size is None or not self.G else self.pool_size

    @cached_property
    def longest_continuation(self) -> int:
        """The longest text continuation a tree node offers (`continuation_len`, at most the longest
        draft; 0: none, and without text drafts)."""
        return min(self.continuation_len, self.max_draft) if self.drafts == "pool+text" else 0

    @cached_property
    def successors_sent(self) -> int:
        """Successors per logits row that steps send for the successor table (0: none)."""
        if not (self.lookahead and self.tree_limit):
            return 0
        return SUCCESSORS if self.successors is None else self.successors


def _check_int(key: str, value: object, low: int) -> None:
    if type(value) is not int or value < low:
        raise LPError(f"{key} must be an integer >= {low}, got {value!r}")


def check_settings(settings: Mapping[str, object]) -> None:
    """Validate `DecodeConfig` settings given by name, where W, N and G may be "auto"; an unknown
    name is an LPError too."""
    given = {k: v for k, v in settings.items() if not (k in AUTO_KEYS and v == "auto")}
    try:
        DecodeConfig(**given).validate()
    except TypeError as e:
        raise LPError(str(e)) from None

"""Decoding settings and their validation (one clear error per bad value)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lp.errors import LPError
from lp.lookahead.drafts import MIN_MATCH
from lp.partition import RankPlan
from lp.verify.distribution import validate_sampling

MODES = ("lookahead", "ar")
AUTO_KEYS = ("W", "N", "G")  # may be "auto": lp/decode/auto.py chooses them
DRAFTS = ("pool", "pool+text")
ORDERS = ("recent", "frequent", "context")
RECYCLE = 8  # successors kept per token unless `recycle` says otherwise
DRAFT_LEN = 10  # the longest text draft unless `draft_len` says otherwise
# the number-valued keys as a config name spells them after a dash (lp/bench/shapes.py, W=auto's
# shapes): -B80 is budget=80
NUMBER_OPTIONS = {
    "B": "budget",
    "D": "draft_len",
    "T": "text_drafts",
    "P": "pool_size",
    "R": "recycle",
    "L": "step_limit",
    "M": "text_match",
    "F": "follow",
}


@dataclass(frozen=True)
class DecodeConfig:
    """W lookahead columns, N n-gram size, G max verification n-grams per step.

    `mode="ar"` decodes one token per step in the same runtime (W, N, G ignored).
    `pool_from_prompt` seeds the n-gram pool with the prompt's own n-grams and
    `pool_from_output` adds those of the generated text as it grows. `temperature` 0 is greedy;
    above 0, tokens are sampled from the model's distribution (after `top_k`, `top_p`) exactly,
    by the paper's Algorithm 4; the lookahead branch and the pool stay greedy.

    `drafts`: where verification candidates come from: `pool` (the n-gram pool, N-1 tokens
    each) or `pool+text` (also continuations of the text's longest suffix matches, up to
    `draft_len` tokens; `text_drafts` of them per step, of matches of at least MIN_MATCH
    tokens; `text_match=1` adds those of x0 alone, as prompt lookup falls back to, as a
    source of their own). `pool_size`: n-grams the pool keeps
    per first token (None: G; more than G lets a tree's shared prefixes leave room for more
    candidates). `order`: the order of the pool's candidates: `context` (those that also match
    the token before x0 first, then newest; measured best), `recent` (newest first) or
    `frequent` (most often produced first). `tree`: verify candidates that share a prefix
    once (a token tree); false: G-style unshared chains. `budget`: verification tokens per step (None: G*(N-1), the
    classic branch's size, so a shape keeps its cost). `recycle`: the model's top-k next tokens
    kept per token from every step's logits rows (lp/lookahead/successors.py); paths through
    them compete with the other drafts' tokens for the budget, the likeliest first by each
    source's counted acceptance (0: off; None: RECYCLE, or the shape's where `W=auto` chose it).
    `step_limit`: the most tokens a step feeds (its pending tokens, the window and the tree):
    each step's tree gets what its pending tokens leave of it, at most `budget`. One replica
    feeds x0 alone (the drafts' KV is kept: lp/worker.py `keep`); over P ranks the tokens the
    last step committed are re-fed, so a step after a short commit can verify a deeper draft
    than one after a long one (None: steps of `budget` nodes). `follow`: below each tree node
    (but those it made), the text after an earlier occurrence of its token, the one whose tokens
    before it match the node's path longest, up to `follow` tokens (at most the longest draft),
    sources with their own counted rates: where a recycled path runs into text the sequence has
    seen, the text goes on (0: off; text drafts only; lp/lookahead/grow.py `Follow`)."""

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
    budget: int | None = None
    draft_len: int = DRAFT_LEN
    text_drafts: int = 4
    text_match: int = MIN_MATCH
    pool_size: int | None = None
    order: str = "context"
    recycle: int | None = None
    step_limit: int | None = None
    follow: int = 0

    def validate(self) -> DecodeConfig:
        if self.mode not in MODES:
            raise LPError(f"mode must be one of {MODES}, got {self.mode!r}")
        for key, low in (("W", 1), ("N", 2), ("G", 0), ("max_new_tokens", 1)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise LPError(f"{key} must be an integer >= {low}, got {value!r}")
        validate_sampling(self.temperature, self.top_k, self.top_p)
        if self.drafts not in DRAFTS:
            raise LPError(f"drafts must be one of {DRAFTS}, got {self.drafts!r}")
        if self.order not in ORDERS:
            raise LPError(f"order must be one of {ORDERS}, got {self.order!r}")
        if not isinstance(self.tree, bool):
            raise LPError(f"tree must be true or false, got {self.tree!r}")
        for key in ("budget", "draft_len", "text_drafts", "pool_size", "recycle"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise LPError(f"{key} must be an integer >= 0, got {value!r}")
        if type(self.follow) is not int or self.follow < 0:
            raise LPError(f"follow must be an integer >= 0, got {self.follow!r}")
        if type(self.text_match) is not int or self.text_match not in (1, MIN_MATCH):
            raise LPError(f"text_match must be 1 or {MIN_MATCH}, got {self.text_match!r}")
        if self.step_limit is not None and (
            not isinstance(self.step_limit, int)
            or isinstance(self.step_limit, bool)
            or self.step_limit < self._fixed + 1
        ):
            raise LPError(
                f"step_limit must be an integer >= {self._fixed + 1} (x0, the window's {self._fixed - 1} "
                f"tokens and one tree node), got {self.step_limit!r}"
            )
        return self

    @property
    def verify_budget(self) -> int:
        """Verification tokens per step."""
        return self.G * (self.N - 1) if self.budget is None else self.budget

    @property
    def pool_capacity(self) -> int:
        """N-grams the pool keeps per first token (none without G)."""
        return self.G if self.pool_size is None or not self.G else self.pool_size

    @property
    def max_draft(self) -> int:
        """The longest draft a step verifies (N-1 from the pool, `draft_len` from the text)."""
        return max(self.N - 1, self.draft_len if self.drafts == "pool+text" else 0)

    @property
    def follow_len(self) -> int:
        """The longest continuation of the text a tree node's token offers (`follow`, at most the
        longest draft; 0: none, and without text drafts)."""
        return min(self.follow, self.max_draft) if self.drafts == "pool+text" else 0

    @property
    def step_shape(self) -> tuple[int, int, int, int]:
        """(W, N, G, budget) as the steps run them: (0, 2, 0, 0) in `ar` mode."""
        return (self.W, self.N, self.G, self.verify_budget) if self.lookahead else (0, 2, 0, 0)

    @property
    def _fixed(self) -> int:
        """Tokens every step feeds whatever its tree: x0 and the window's (lp.partition)."""
        W, N, _, _ = self.step_shape
        return RankPlan(range(W), range(0)).cost(N)

    @property
    def max_commit(self) -> int:
        """The most tokens a step commits: the longest draft the budget (and `step_limit`, after
        a one-token commit) holds, plus one."""
        if not self.lookahead:
            return 1
        longest = min(self.max_draft, self.verify_budget)
        return 1 + (longest if self.step_limit is None else min(longest, self.step_limit - self._fixed))

    def tree_budget(self, pending: int) -> int:
        """The tree nodes of a step that feeds `pending` tokens first: the step's budget (`step_shape`),
        cut to what `step_limit` leaves."""
        budget = self.step_shape[3]
        if self.step_limit is None:
            return budget
        return max(0, min(budget, self.step_limit - self._fixed - (pending - 1)))

    @property
    def successors_sent(self) -> int:
        """Successors per logits row that steps send for the successor table (0: none)."""
        if not (self.lookahead and self.verify_budget):
            return 0
        return RECYCLE if self.recycle is None else self.recycle

    @property
    def lookahead(self) -> bool:
        return self.mode == "lookahead"


def check_settings(settings: Mapping[str, object]) -> None:
    """Validate `DecodeConfig` settings given by name, where W, N and G may be "auto"; an
    unknown name is an LPError too."""
    given = {k: v for k, v in settings.items() if not (k in AUTO_KEYS and v == "auto")}
    try:
        DecodeConfig(**given).validate()
    except TypeError as e:
        raise LPError(str(e)) from None

"""The drafting policy: which candidates a step verifies, and the host-side sources they come from
(the Jacobi window, the n-gram pool, the text's own suffix matches, the successor table of
recycled top-k tokens), kept identical on every rank by feeding them the same merged outcomes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from lp import message
from lp.compiled import sources_digest
from lp.config import DecodeConfig
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool, draft_loops, loops
from lp.lookahead.draft_loops import feed_step
from lp.lookahead.drafts import TextIndex, as_tuples, step_drafts
from lp.lookahead.grow import NO_FOLLOW, Chains, Follow, Grown, Labelled, grow, occurrences, successor_arrays
from lp.lookahead.loops import MATCHED, count_rates, observe_step
from lp.lookahead.rates import DraftRates
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.tree import DraftTree, TreeBuilder, pair_key
from lp.message import HEADER, merge_loop, step_message_size

# the draft sources whose acceptance rates are counted apart (DraftRates): the text drafts, the
# pool's context-matched and plain n-grams, the text drafts of x0's lone matches, each by rank
# (the last bucket takes the ranks after it), and the window's row 0
TEXT_RANKS, POOL_RANKS, LONE_RANKS = 4, 3, 2
KINDS = (TEXT_RANKS, POOL_RANKS, POOL_RANKS, LONE_RANKS)  # text, context-matched pool, pool, lone text
WINDOW_SOURCE = sum(KINDS)
# the text after earlier occurrences of a node's token, by the length of their match with the
# node's path (`Follow`): 0 to MATCHED tokens before it
FOLLOW_SOURCE = WINDOW_SOURCE + 1
SOURCES = FOLLOW_SOURCE + MATCHED + 1


class DraftSources:
    """One sequence's draft sources. `tree()` builds the next step's verification tree, or
    `growth()` hands lp/decode/plan.py what it needs to grow it in the step's compiled plan
    (`grew()` takes it back); `prepare()` does, while the device computes, what the step's
    outcome does not decide, the compiled calls' arguments among it; `observe()` merges the
    step's messages and feeds the outcome to the sources, the committed tokens joining the text
    last. lp/decode/plan.py's `observe_next` does the same and plans the next step in one
    compiled call, from `take()`'s arguments and `next_growth`, finishing with
    `observed(now=False)` and `grew_later()`: `settle()` then brings the sources' own counts up
    to date once the next forward is queued (`prepare`, `growth` and `tree` call it first).
    The text's, the pool's and the successor table's arrays are replaced only in `__init__` and
    `prepare()` (room made), which take them for the calls afresh."""

    def __init__(self, cfg: DecodeConfig, prompt_ids: list[int], vocab_size: int, keep: bool = False) -> None:
        """`keep`: the decode keeps each step's accepted drafts' KV (lp/worker.py `keep`), so
        every step feeds one pending token: its tree's budget does not depend on the last
        step's commit."""
        W, N, G, budget = cfg.step_shape
        k = cfg.successors_sent
        if k > vocab_size:
            raise LPError(f"recycle={k} is more than the model's {vocab_size} tokens")
        self.cfg, self.N, self.G, self.keep = cfg, N, G, keep
        self.budget = cfg.tree_budget(1) if keep else budget
        # every step keys at most a row per tree node and x0's
        self.successors = SuccessorTable(k, vocab_size, cfg.max_new_tokens * (budget + 1)) if k else None
        self.window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        # the prompt's n-grams and text index: host work on the prompt's length, which the caller
        # times with the prefill (a GPU prefills meanwhile)
        self.pool = NGramPool(N, cfg.pool_capacity)
        self.rates = DraftRates(SOURCES, cfg.max_draft)
        # `Follow`'s occurrences, brought up to date by each growth (none read without `follow`)
        follows = cfg.follow_len > 0
        self.occurrences = occurrences(vocab_size * follows, (len(prompt_ids) + cfg.max_new_tokens) * follows)
        self._follow = (*self.occurrences, cfg.follow_len)  # their rates the window's next (FOLLOW_SOURCE)
        self._grown: Labelled | None = None  # the last step's growth, until its outcome is counted
        self._observing: tuple | None = None  # `observe`'s arguments, which `prepare` makes
        self._unsettled: tuple[int, int] | None = None  # an observe's counts kept for `settle`
        self._growing: Callable[[], Labelled] | None = None  # a growth kept for `settle` (`grew_later`)
        self.next_growth: tuple | None = None  # the next step's growth's, with them (`prepare`)
        # `growth`'s settings, read once: the text drafts' length and count, the pool's order
        self._depth = cfg.max_draft
        self._text_args = (cfg.draft_len, cfg.text_drafts if cfg.drafts == "pool+text" else 0)
        self._pool_args = (cfg.order == "context" and N > 2, cfg.order == "frequent")
        # `observe`'s: the window slots' start in a message, the successors a row sends, the
        # most tokens a step commits, the rates' arrays (flat chances), what it pools
        self._start, self._k, self._most = HEADER + cfg.max_commit, k, cfg.max_commit
        self._rates = (self.rates.hits, self.rates.offered, self.rates.chances.reshape(-1))
        self._drafted = (_NO_ROW, _NO_ROW)  # the last step's tree's tokens and parents
        # `prepare`'s: the pair keys of x0's successor row and of the tree's nodes' (last first)
        self._keys: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))
        self._pooled = G > 0 and self.pool.capacity > 0
        self._from_text = self._pooled and bool(cfg.pool_from_output)  # a bool: one compiled signature
        self.text = TextIndex(
            prompt_ids,
            indexed=cfg.drafts == "pool+text" and budget > 0,
            lone=cfg.text_match == 1,
            room=len(prompt_ids) + cfg.max_new_tokens,
        )
        if G and cfg.pool_from_prompt:
            self.pool.add_sequence(prompt_ids)
            self.pool.flush()
        # whether a step's tree budget depends on its pending tokens
        self._limited = cfg.step_limit is not None and not keep
        self._arrays()

    def tree(self, pending: int) -> DraftTree:
        """The next step's verification tree (`step_tree`), for a step that feeds `pending`
        tokens first (its tree gets what they leave of a `step_limit`)."""
        self.settle()
        tree, grown = step_tree(
            self.cfg,
            self.cfg.tree_budget(pending),
            self.pool,
            self.text,
            successors=self.successors,
            rates=self.rates,
            window=self.window,
            occurring=self.occurrences,
        )
        self._drafted = (tree.tokens, tree.parent_array)
        self._grown = None if grown is None else Labelled(grown.tokens, grown.parents, grown.labels)
        return tree

    def growth(self, pending: int) -> tuple | None:
        """The next step's tree growth (`tree(pending)`'s, where it grows one) as the arguments
        of lp/decode/plan.py's compiled plan, which grows the same tree in the same call as it
        splits and lays out the step: (True, the budget, the depth, the text's arrays and its
        drafts' settings, the pool's arrays and settings, the window's row-0 guesses taken, their
        source, the chances, the successor table's arrays). None where `tree(pending)` grows none
        (`cfg.tree` false, or no budget left)."""
        self.settle()
        budget = self.cfg.tree_budget(pending) if self._limited else self.budget
        if not (budget and self.cfg.tree):
            return None
        # the arrays as `_arrays` took them (the step's outcome writes into them, and only the
        # text's length changes), so that little Python runs between the read and the plan
        text = self.text
        return (
            True, budget, self._depth, text.seq, text.n, *self._drafting, self._guesses(0), *self._recycling,
            *self._follow,
        )  # fmt: skip

    def _guesses(self, updates: int) -> int:
        """The window's row-0 guesses a growth takes once the window is `updates` updates on."""
        window = self.window
        return self._depth if window is not None and window.W > 1 and window.ready_after(updates) else 0

    def _arrays(self) -> None:
        """Take the sources' arrays for `growth`, after whatever replaced some (the pool's flush,
        the room made for a step)."""
        text, pool = self.text, self.pool
        self._drafting = (
            text.grams, text.head, text.longest, text.lone, *self._text_args, pool.table, pool.rows, pool.rings,
            pool.state, pool.queue, *self._pool_args, _RANKS,
        )  # fmt: skip
        self._recycling = (WINDOW_SOURCE, self.rates.chances, *successor_arrays(self.successors))

    def grew(self, grown: Labelled) -> None:
        """The next step's tree's arrays, grown from `growth`'s arguments (as `tree` keeps its own)."""
        self._drafted, self._grown = (grown.tokens, grown.parents), grown

    def grew_later(self, grown: Callable[[], Labelled]) -> None:
        """`grew(grown())` at `settle`: the arrays are cut from the plan's buffer once the step's
        forward is queued."""
        self._growing = grown

    def settle(self) -> None:
        """Bring the counts kept outside the compiled call's arrays up to date: the last
        `observed(now=False)`'s and the last `grew_later`'s. Every method of these sources that
        reads those counts (`prepare`, which lp/decode/loop.py calls once the next forward is
        queued, `growth`, `tree`) calls it first; code that reads the text, the window or the
        table directly calls it itself."""
        if self._unsettled is not None:
            n, ids = self._unsettled
            self._unsettled = None
            self.text.appended(n, ids)
            if self.successors is not None:  # its staged rows written
                self.successors.apply()
            if self.window is not None:
                self.window.updates += 1
        if self._growing is not None:
            grown, self._growing = self._growing, None
            self.grew(grown())

    def prepare(self) -> None:
        """The part of `observe` that needs no outcome, done while the device computes the step's
        forward (lp/decode/loop.py: before the all-gather): the pool's queued n-grams land, the
        successor rows' pair keys are made (`_pair_keys`), the text, the pool and the successor
        table make room for what the step may bring, and the compiled call's arguments but the
        messages are gathered (`observe`'s, and the arrays of the next `growth`). It settles the
        last observe first (`settle`)."""
        self.settle()
        self.pool.flush()
        window, table, text, pool = self.window, self.successors, self.text, self.pool
        W = window.W if window is not None else 0
        text.reserve(self._most)
        if self._pooled:  # the window's n-grams and those ending in the committed tokens
            pool.reserve(W + self._most)
        if table is not None:
            self._keys = self._pair_keys()
            table.reserve(1 + W + len(self._drafted[1]))  # x0's row, the columns', the nodes'
        self._arrays()
        tree = self._grown if self._grown is not None else _NOT_GROWN
        first, keys = self._keys
        hits, token_rows, pairs, index, _, stage = successor_arrays(table)
        self._observing = (
            self._start, self._k, tree.tokens, tree.parents, tree.labels, *self._rates, token_rows, pairs, index,
            stage, hits, keys, first, text.seq, text.grams, text.head,
            text.table, text.n, text.n_ids, text.longest, text.lone, pool.state, pool.queue,
            window.rows if window is not None else _NO_WINDOW, self._pooled and window is not None and window.ready,
            self._from_text,
        )  # fmt: skip
        # the next step's growth where the observe's compiled call can grow it (lp/decode/plan.py
        # `observe_next`): `growth`'s arguments but those the observe's hold (the text's arrays,
        # the pool's state and queue, the chances, the successor table's), its budget fixed, the
        # window's guesses taken as the call leaves it, one update on
        self.next_growth = None
        if self.cfg.tree and self.budget and not self._limited:
            self.next_growth = (
                self.budget, self._depth, *self._text_args, pool.table, pool.rows, pool.rings, *self._pool_args,
                _RANKS, self._guesses(1), WINDOW_SOURCE, *self._follow, self.keep,
            )  # fmt: skip

    def observe(
        self, gathered: np.ndarray, bounds: np.ndarray, remaining: int, eos: np.ndarray
    ) -> tuple[list[int], bool]:
        """Merge a step's gathered messages `[P, K]` (of ranks whose shares are the rows of
        `bounds`: `StepPlan.bounds`) and feed the outcome to the sources (after `prepare`), in
        one compiled call (`_observe_loop`): the committed tokens, cut at `remaining` and after
        the first of the int64 `eos` tokens, and whether one ended them. In this order: the
        messages merged (lp.message.merge: an LPError where the ranks drifted apart); the grown
        tree's rates counted; with a successor table, the committed tokens' ranks counted and the
        step's successor rows written (`x0`, the token before it and the new ones counted on the
        table the drafts used); the window's n-grams pooled, the committed tokens added to the
        text and (with `pool_from_output`) their n-grams pooled, as prompt lookup's free
        candidates; the window moved up a level."""
        best, new, stopped, ids, rows = _observe_loop(gathered, bounds, remaining, eos, *self.take())
        return self.observed(gathered, best, new, ids, rows), stopped

    def take(self) -> tuple:
        """`observe`'s compiled call's arguments after the messages, the remaining tokens and the
        EOS ids (`observe_body`'s), as `prepare` made them: taken once per step."""
        args = self.arguments()
        self._observing, self._grown = None, None  # its outcome is counted in the call
        return args

    def arguments(self) -> tuple:
        """`take`'s arguments, left in place (lp/decode/plan.py `rehearse` reads them)."""
        if self._observing is None:  # the compiled call writes into the room `prepare` made
            raise LPError("DraftSources.observe needs a prepare() after the step's plan")
        return self._observing

    def observed(
        self, gathered: np.ndarray, best: int, new: np.ndarray, ids: int, rows: np.ndarray, *, now: bool = True
    ) -> list[int]:
        """The committed tokens of the compiled observe's answer (`observe_body`'s), after its errors
        are raised; the counts kept outside the arrays are brought up to date, and the staged
        successor `rows` written (`SuccessorTable.apply`), now or with `now=False` at `settle`
        (after the next forward is queued)."""
        if best == -2:
            raise LPError(
                f"ranks diverged: output lengths {gathered[:, 3].tolist()}, checksums {gathered[:, 4].tolist()}"
            )
        if best == -3:
            raise LPError(
                f"a message accepts more than the step's {self._most - 1} draft tokens: {gathered[:, 2].tolist()}"
            )
        self._unsettled = (len(new), ids)
        if self.successors is not None:
            first, keys = self._keys
            self.successors.hold(rows, keys, first)
        if now:
            self.settle()
        return new.tolist()

    def _pair_keys(self) -> tuple[int, np.ndarray]:
        """The pair keys (`pair_key`) of the step's successor rows whose input's
        predecessor is known (lp.message: x0's row, the columns', the tree's nodes' from the
        last to the first): x0's row's (-1 without a token before x0), then the nodes', each
        node's predecessor its parent (x0 for a root)."""
        out, (tokens, parents) = self.text.tokens, self._drafted
        first = pair_key(out[-2], out[-1]) if len(out) > 1 else -1
        before = np.where(parents >= 0, tokens[parents], out[-1])
        return first, pair_key(before[::-1], tokens[::-1])


def source_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[list[tuple[int, ...]]]:
    """The step's drafts of each kind (KINDS), best first: the text's longest-suffix
    continuations (with `drafts="pool+text"`); with `order="context"` (the default), the pool's
    n-grams that start with the last two tokens (what follows them, N-2 tokens: two matched
    tokens predict better than one); the pool's n-grams under x0, newest (or most frequent)
    first; with `text_match=1`, the continuations of x0's lone matches (`TextIndex.lone_drafts`)."""
    tokens, starts, sources = _drafts(cfg, pool, text, _NO_ROW)
    kinds = np.searchsorted(np.cumsum(KINDS), sources, side="right").tolist()
    out: list[list[tuple[int, ...]]] = [[] for _ in KINDS]
    for kind, draft in zip(kinds, as_tuples(tokens, starts)):
        out[kind].append(draft)
    return out


def ranked_drafts(cfg: DecodeConfig, pool: NGramPool, text: TextIndex) -> list[tuple[int, ...]]:
    """The step's drafts in one list, best first (`source_drafts` in order, duplicates dropped):
    the candidates of a tree without sharing (`tree=False`)."""
    return list(dict.fromkeys(d for drafts in source_drafts(cfg, pool, text) for d in drafts))


def draft_chains(cfg: DecodeConfig, pool: NGramPool, text: TextIndex, window: JacobiWindow | None) -> Chains:
    """Every draft as a chain for `grow`, its source (`source_drafts`, ranked, then the window's
    row 0: its guesses of the next W-1 tokens) naming its row of `DraftRates.chances`."""
    row = window.rows[0, 1 : cfg.max_draft + 1] if window is not None and window.ready and window.W > 1 else _NO_ROW
    return Chains(*_drafts(cfg, pool, text, row))


def _drafts(
    cfg: DecodeConfig, pool: NGramPool, text: TextIndex, row: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`step_drafts` of cfg's kinds, their sources ranked as KINDS says, then `row`."""
    return step_drafts(
        text,
        pool,
        length=cfg.draft_len,
        count=cfg.text_drafts if cfg.drafts == "pool+text" else 0,
        context=cfg.order == "context" and pool.n > 2,
        frequent=cfg.order == "frequent",
        ranks=_RANKS,
        row=row,
        row_source=WINDOW_SOURCE,
    )


_RANKS, _NO_ROW = np.array(KINDS, dtype=np.int64), np.zeros(0, dtype=np.int64)


def step_tree(
    cfg: DecodeConfig,
    budget: int,
    pool: NGramPool,
    text: TextIndex,
    successors: SuccessorTable | None,
    rates: DraftRates | None = None,
    window: JacobiWindow | None = None,
    occurring: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[DraftTree, Grown | None]:
    """The step's verification tree within `budget` nodes, and its growth where grown. As a
    token tree (`cfg.tree`): the likeliest nodes of all drafts (`draft_chains`) and of the
    successor table's paths, by their estimated chances (`rates`: the drafts' counted
    acceptance; default: fresh ones; lp/lookahead/grow.py). Without sharing: `ranked_drafts` in
    order, then the paths to the leaves of the budget's likeliest recycled nodes."""
    if not budget:
        return DraftTree(np.zeros(0, dtype=np.int64), ()), None
    x0 = text.tokens[-1]
    if cfg.tree:
        rates = rates or DraftRates(SOURCES, cfg.max_draft)
        before = text.tokens[-2] if len(text.tokens) > 1 else -1
        chains = draft_chains(cfg, pool, text, window)
        follow = NO_FOLLOW
        if cfg.follow_len:
            occurring = occurring or occurrences(int(text.tokens.max()) + 1, len(text.tokens))
            follow = Follow(text.tokens, *occurring, cfg.follow_len, FOLLOW_SOURCE)
        grown = grow(budget, x0, cfg.max_draft, chains, rates.chances, successors, before, follow)
        return grown.tree, grown
    builder = TreeBuilder(budget, share=False)
    for draft in ranked_drafts(cfg, pool, text):
        if builder.full:
            break
        builder.add(draft)
    if successors is not None and not builder.full:
        for path in grow(budget, x0, cfg.max_draft, table=successors).leaf_paths():
            builder.add(path)  # each path to a leaf is a chain of its own
    return builder.tree(), None


@njit
def observe_body(
    gathered, bounds, remaining, eos, start, k, tree, parents, labels, rate_hits, offered, chances,
    table, pairs, index, stage, hits, keys, first, seq, grams, head, text_table, n, made, longest, lone,
    state, queue, window, from_window, from_text,
):  # fmt: skip
    """`DraftSources.observe`'s work: the winning rank (-2: the ranks drifted apart, -3: a message
    accepts more than a step holds), the committed tokens, whether an EOS ended them, the text's
    ids after, and the step's successor rows, staged in `stage` (none without a table, nor
    staged after an error). Not cached itself: the cached calls that run it (`_observe_loop`,
    lp/decode/plan.py's) are keyed by its sources (lp/compiled.py)."""
    best, level, rows = merge_loop(gathered, bounds, start, k)
    if best == -2:
        return best, gathered[0, :0], False, made, rows
    accepted = gathered[best, 2] if best >= 0 else 0
    if accepted >= start - HEADER:  # the path's slots hold max_commit tokens
        return -3, gathered[0, :0], False, made, rows
    path = gathered[best, HEADER : HEADER + accepted + 1] if best >= 0 else gathered[0, :1]
    cut, stopped = min(len(path), remaining), False
    for i in range(cut):
        for token in eos:
            stopped = stopped or path[i] == token
        if stopped:
            cut = i + 1
            break
    new = path[:cut]
    if k:  # before the tokens join the text: counted on the table the drafts used
        observe_step(
            tree, parents, labels, path[:accepted], rate_hits, offered, chances,
            table, pairs, index, stage, seq, n, new, hits, rows, keys, first,
        )  # fmt: skip
    else:
        count_rates(tree, parents, labels, path[:accepted], rate_hits, offered, chances)
    made = feed_step(
        seq, grams, head, text_table, n, made, new, longest, lone, state, queue, window, level, from_window, from_text
    )
    levels = window.shape[0]
    if window.shape[1]:  # `JacobiWindow.update`
        for lvl in range(levels - 1):
            window[lvl, :] = window[lvl + 1, :]
        window[levels - 1, :] = level
    return best, new, stopped, made, rows


def _compile(digest: str):
    """`_observe_loop`, keyed in numba's cache by `digest` too (lp/compiled.py)."""

    @njit(cache=True)
    def observe_loop(*args):
        """`observe_body` on `DraftSources.observe`'s arguments."""
        if len(digest) == 0:  # never: the digest is read for numba's cache key (lp/compiled.py)
            raise ValueError("no digest of the loops' sources")
        return observe_body(*args)

    return observe_loop


_observe_loop = _compile(sources_digest(draft_loops, loops, message))
_NOT_GROWN = Labelled(_NO_ROW, _NO_ROW, _NO_ROW)
_NO_WINDOW = np.zeros((1, 0), np.int64)


def compile_kernels() -> None:
    """Compile the drafting's numba loops (text index, pool, tree growth, successor table,
    rates, the step's plan and observe), or load them from numba's cache, on two steps of tiny
    decodes with and without a successor table: before a decode's clock starts rather than in its
    first step (seconds on a fresh install, once per process)."""
    from lp.decode.plan import observe_next, plan_next  # the plan's module reads these sources' growth

    for recycle in (2, 0):
        cfg = DecodeConfig(W=2, N=3, G=2, recycle=recycle)
        sources = DraftSources(cfg, [1, 2, 1, 2, 1], vocab_size=16)
        gathered = np.zeros((1, step_message_size(cfg)), np.int64)
        step = plan_next([1], sources, W=cfg.W, N=cfg.N, P=1, rank=0)
        sources.prepare()  # the observe that plans the next step, then the one that does not
        _, _, step = observe_next(gathered, step.bounds, 2, _NO_ROW, sources, W=cfg.W, N=cfg.N, P=1, rank=0)
        sources.prepare()
        sources.observe(gathered, step.bounds, 2, _NO_ROW)

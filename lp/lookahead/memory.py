"""A draft memory that outlives a request: the texts of finished decodes (each output with the last
prompt tokens before it), indexed as a sequence's own text is (lp/lookahead/text.py), so that a new
decode's tree can draw on what earlier ones produced: the continuations of earlier occurrences of
its own text's suffix. They are draft sources of their own, by the length of their match
(`MEMORY_SOURCES`: 4 tokens or more, 3, 2), whose rates each sequence counts like every source's
(lp/lookahead/rates.py). Where it does not fit, its drafts lose their place in the best-first tree
and cost nothing.

The memory also keeps what the earlier decodes counted of every source's rates (`hits`, `offered`,
by source and depth) and of their successor tables' ranks (`ranks`), and a new decode's counts
start from them (`seed`) rather than from a blind prior: a source that is rarely right starts low,
a text match that runs on starts high, so a fresh decode's first trees (and, in a batch, the step's
budget across its sequences) rank nodes as the earlier decodes found them. A sequence's own counts
soon outweigh them (SEED offers' worth at most).

Bounded: `budget` tokens in two generations of half each; when the newer is full it becomes the
older and the older is dropped, so the oldest texts age out whole (and the counts halve). Every
rank feeds it the same texts and counts in the same order (a batch's sequences as they end, between
steps: one writer), so every rank's drafts stay alike; `fingerprint` (`digest`, a running hash of
every text fed, mixed with a hash of the counts) lets the ranks check it. Saved to a file and
loaded with the model and tokenizer it was learned from named (`identity`): a file learned from
another model is refused."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from numba.experimental import structref

from lp.errors import LPError
from lp.jit import State, compiled
from lp.lookahead.chains import Chains, add, holds
from lp.lookahead.rates import PRIOR_HITS, PRIOR_OFFERED, DraftRates
from lp.lookahead.sources import MEMORY_SOURCES, SOURCES
from lp.lookahead.successors import SuccessorTable
from lp.lookahead.text import GRAMS, MAX_MATCH, MIN_MATCH, TextIndex, extend, find_gram, new_text_index, reserve

DRAFT_MEMORY = 1 << 16  # tokens kept by default
END = -1  # between two texts: no draft runs past it
CONTEXT = MAX_MATCH  # prompt tokens kept before each output: the first output tokens' context
VISITS = 64  # occurrences a step's walk visits at most per memory generation (common n-grams recur often)
DEPTHS = 64  # depths counted (deeper ones count as the last)
SEED = 4.0  # the offers a new sequence's rates start from at most, at the rates the memory counted
RANKS = 64  # successor ranks counted (a table of more successors starts from its own prior, teaching none)
VERSION = 2  # of the saved file


def check_budget(budget: object) -> None:
    """An LPError unless `budget` is a memory's budget: tokens, 0 or more."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise LPError(f"draft_memory must be an integer >= 0 (tokens; 0: off), got {budget!r}")


def check_file(path: object) -> None:
    """An LPError unless `path` is None or a file path whose folder exists (checked before a run,
    not when the memory is saved after it)."""
    if path is None:
        return
    if not isinstance(path, (str, Path)) or not str(path):
        raise LPError(f"draft_memory_file must be a file path, got {path!r}")
    if Path(path).is_dir() or not Path(path).parent.is_dir():
        raise LPError(f"draft_memory_file={path}: not a file in an existing folder")


@structref.register
class DraftMemoryType(State):
    pass


class DraftMemory(structref.StructRefProxy):
    """The texts of finished decodes, at most `budget` tokens (0: off), in two generations."""

    def __new__(cls, budget: int) -> DraftMemory:
        check_budget(budget)
        return new_memory(budget)

    def add(self, prompt: list[int], output: list[int]) -> None:
        """A finished decode: its output and the prompt's last CONTEXT tokens before it."""
        tokens = np.asarray([*prompt[-CONTEXT:], *output], dtype=np.int64)
        add_text(self, tokens)

    @property
    def tokens(self) -> int:
        """Tokens held (texts and their ends)."""
        return _held(self)

    @property
    def nbytes(self) -> int:
        """The bytes its arrays hold."""
        return _nbytes(self)

    @property
    def budget(self) -> int:
        """The most tokens it holds (0: off)."""
        return _budget(self)

    @property
    def rates(self) -> np.ndarray:
        """The acceptance rates every draft source had in the decodes it learned from, `[source,
        depth]` (lp/lookahead/sources.py), a blind 1/2 where they counted none."""
        hits, offered, _ = _counts(self)
        return (hits + PRIOR_HITS) / (offered + PRIOR_OFFERED)

    @property
    def ranks(self) -> np.ndarray:
        """`[2, RANKS]`: the decodes' committed tokens that were their predecessor's rank-r
        successor, and those counted by a table with a rank r that were of rank r or more."""
        return _counts(self)[2]

    @property
    def fingerprint(self) -> int:
        """The digest mixed with a hash of the counts: equal on ranks that hold the same memory (two
        files of the same texts may hold other counts, which would draw other trees)."""
        hits, offered, ranks = _counts(self)
        h = hashlib.sha256(np.int64(self.digest).tobytes() + hits.tobytes() + offered.tobytes() + ranks.tobytes())
        return int.from_bytes(h.digest()[:8], "little", signed=True)

    @property
    def digest(self) -> int:
        """A hash of every text fed, in order: equal on ranks that were fed alike."""
        return _digest(self)

    def clear(self) -> None:
        """Forget every text and count, in place (whoever holds the memory sees it empty)."""
        _clear(self)

    def texts(self) -> list[np.ndarray]:
        """The generations' sequences, the older first."""
        return [_sequence(self, 0), _sequence(self, 1)]

    def save(self, path: str | Path, identity: dict) -> None:
        """Write the texts and what they were learned from (`identity`: the model and tokenizer)."""
        older, newer = self.texts()
        hits, offered, ranks = _counts(self)
        meta = json.dumps({"version": VERSION, "budget": self.budget, "digest": self.digest, **identity})
        path = Path(path)
        partial = path.with_name(path.name + ".partial")  # a crash while writing leaves the old file whole
        with open(partial, "wb") as f:
            np.savez_compressed(
                f, meta=np.asarray(meta), older=older, newer=newer, hits=hits, offered=offered, ranks=ranks
            )
        partial.replace(path)

    @classmethod
    def load(cls, path: str | Path, budget: int, identity: dict) -> DraftMemory:
        """A memory of `budget` tokens holding a saved one's texts (the newest, where fewer fit); an
        LPError where the file is not a draft memory or was learned from another model or tokenizer."""
        try:
            with np.load(Path(path)) as f:
                meta = json.loads(str(f["meta"]))
                if not isinstance(meta, dict):
                    raise ValueError("unexpected contents")
                if meta.get("version") != VERSION:  # an older lp's file holds other arrays
                    raise LPError(
                        f"draft_memory_file={path}: version {meta.get('version')}, lp reads version {VERSION}"
                    )
                older, newer, hits, offered, ranks = (f[key] for key in ("older", "newer", "hits", "offered", "ranks"))
            if older.dtype != np.int64 or newer.dtype != np.int64:
                raise ValueError("unexpected contents")
            if hits.shape != (SOURCES, DEPTHS) or offered.shape != hits.shape or ranks.shape != (2, RANKS):
                raise ValueError("unexpected counts")
        except LPError:
            raise
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise LPError(f"draft_memory_file={path}: not a draft memory ({e})") from None
        for key, value in identity.items():
            if meta.get(key) != value:
                raise LPError(
                    f"draft_memory_file={path} was learned from another {key} ({meta.get(key)!r}, this one is "
                    f"{value!r}): its drafts would be another model's"
                )
        memory = cls(budget)
        for text in (older, newer):
            ends = np.flatnonzero(text == END)
            for a, b in zip(np.concatenate(([0], ends[:-1] + 1)), ends):
                add_text(memory, text[a:b])
        # the saved memory's digest (it counts texts aged out before the save), mixed with another budget's
        digest = int(meta.get("digest", 0))
        _set_digest(memory, digest if budget == meta.get("budget") else _mixed(digest, budget))
        _set_counts(memory, hits.astype(np.float64), offered.astype(np.float64), ranks.astype(np.float64))
        return memory


structref.define_proxy(DraftMemory, DraftMemoryType, ["texts_", "budget", "digest", "hits", "offered", "ranks"])


@compiled
def new_memory(budget: int) -> DraftMemory:
    """An empty memory of `budget` tokens."""
    empty = np.zeros(0, np.int64)
    half = budget // 2
    texts = (new_text_index(empty, budget > 0, False, half, 0), new_text_index(empty, budget > 0, False, half, 0))
    counts = np.zeros((SOURCES, DEPTHS)), np.zeros((SOURCES, DEPTHS))  # learned: the prior is added where read
    return DraftMemory(
        texts, budget, _mixed(0, budget), *counts, np.zeros((2, RANKS))
    )  # ranks of other budgets differ at once


@compiled
def add_text(m: DraftMemory, tokens: np.ndarray) -> None:
    """Append a text and its end to the newer generation; where it would pass half the budget, the
    newer becomes the older (the older is dropped) first. A text longer than that keeps its end."""
    half = m.budget // 2
    if half < 2 or len(tokens) == 0:
        return
    for t in tokens:  # wrapping arithmetic: a hash, the same on every rank
        m.digest = _mixed(m.digest, t + 1)
    m.digest = _mixed(m.digest, 0)  # the text's end: [1, 2] + [3] is not [1] + [2, 3]
    text = tokens[-(half - 1) :]
    older, newer = m.texts_
    if newer.n + len(text) + 1 > half:
        older, newer = newer, new_text_index(np.zeros(0, np.int64), True, False, half, 0)
        m.texts_ = (older, newer)
        m.hits *= 0.5  # the counts age with the texts
        m.offered *= 0.5
        m.ranks *= 0.5
    reserve(newer, len(text) + 1)
    extend(newer, text)
    extend(newer, np.full(1, END, np.int64))


@compiled
def _suffix_ids(memory: TextIndex, text: TextIndex) -> np.ndarray:
    """The ids, in the memory's index, of the L-grams ending with the text's last token
    (`ids[L - MIN_MATCH]`, -1 where the memory holds none): each L-gram is the (L-1)-gram ending one
    token earlier and its last token, so they come from a short triangle of lookups."""
    ids = np.full(GRAMS, -1, np.int64)
    seq, n = text.seq, text.n
    top = min(MAX_MATCH, n)
    for L in range(MIN_MATCH, top + 1):  # the L-gram ending at n - 1: its (L-1)-gram ends at n - 2
        before = seq[n - L]  # the token before the 2-gram that starts the chain at n - L + 1
        g = -1
        for k in range(2, L + 1):  # the k-gram ending at n - L + k - 1
            g = find_gram(memory, k, before, seq[n - L + k - 1])
            if g < 0:
                break
            before = g
        ids[L - MIN_MATCH] = g
        if g < 0:  # a text without this suffix has no longer one either
            break
    return ids


@compiled
def memory_drafts(m: DraftMemory, text: TextIndex, length: int, count: int, chains: Chains, source: int) -> None:
    """Append up to `count` continuations (at most `length` tokens, none past a text's end) of the
    memory's occurrences of the text's suffix, the longest match first (counted up to MAX_MATCH),
    then the newest; each from source `source + match_source(L)` by its match's length L."""
    if length < 1 or count < 1 or m.budget == 0 or text.n < MIN_MATCH:
        return
    first = chains.count
    older, newer = m.texts_
    for mem in (newer, older):
        if mem.n == 0:
            continue
        ids = _suffix_ids(mem, text)
        visits = VISITS
        for L in range(MAX_MATCH, MIN_MATCH - 1, -1):
            col = L - MIN_MATCH
            g = ids[col]
            if g < 0:
                continue
            e = mem.head[g]
            while e >= 0 and visits > 0:
                visits -= 1
                # an occurrence that matches L + 1 tokens was taken at L + 1
                if not (L < MAX_MATCH and ids[col + 1] >= 0 and mem.grams[e, col + 1, 0] == ids[col + 1]):
                    size = 0
                    while size < length and e + 1 + size < mem.n and mem.seq[e + 1 + size] != END:
                        size += 1
                    if size and not holds(chains, first, mem.seq, e + 1, size):
                        add(chains, mem.seq, e + 1, size, source + match_source(L))
                        if chains.count - first == count:
                            return
                e = mem.grams[e, col, 1]


@compiled
def match_source(L: int) -> int:
    """The memory's source (of MEMORY_SOURCES) of a draft whose match is L tokens: 0 from
    MIN_MATCH + 2 on, 1 at MIN_MATCH + 1, 2 at MIN_MATCH."""
    return min(max(MIN_MATCH + 2 - L, 0), MEMORY_SOURCES - 1)


@compiled
def seed(m: DraftMemory, rates: DraftRates, table: SuccessorTable) -> tuple[np.ndarray, np.ndarray]:
    """Start a new sequence's counts where the earlier decodes' left them: each source's rate at
    each depth at the rate the memory counted on top of the blind prior (1 hit in 2 offers), worth
    as many offers, SEED at most (where it counted none: the blind prior itself); the successor
    table's rank counts in the shares the memory counted, worth the table's own prior (one count a
    rank and one for none: left as they are where it counted none). What was written, which
    `learn` takes back out."""
    sources, depth = rates.chances.shape
    chances = rates.chances.reshape(-1)
    for s in range(min(sources, SOURCES)):
        for d in range(depth):
            c = min(d, DEPTHS - 1)
            weight = min(m.offered[s, c] + PRIOR_OFFERED, SEED)
            label = s * depth + d
            chances[label] = (m.hits[s, c] + PRIOR_HITS) / (m.offered[s, c] + PRIOR_OFFERED)
            rates.hits[label], rates.offered[label] = weight * chances[label], weight
    k = table.k
    if 0 < k <= RANKS and m.ranks[1, 0] > 0:  # rank r's chance where no lower rank was right, prior uniform
        left = 1.0
        for r in range(k):
            c = (m.ranks[0, r] + 1.0) / (m.ranks[1, r] + k + 1.0 - r)
            table.hits[r] = (k + 1.0) * left * c
            left *= 1.0 - c
        table.hits[k] = (k + 1.0) * left
    return np.stack((rates.hits.copy(), rates.offered.copy())), table.hits.copy()


@compiled
def learn(m: DraftMemory, rates: DraftRates, table: SuccessorTable, written: tuple[np.ndarray, np.ndarray]) -> None:
    """Add a finished sequence's counts (less what `seed` wrote) to the memory's."""
    sources, depth = rates.chances.shape
    counts, ranks = written
    for s in range(min(sources, SOURCES)):
        for d in range(depth):
            label, c = s * depth + d, min(d, DEPTHS - 1)
            m.hits[s, c] += rates.hits[label] - counts[0, label]
            m.offered[s, c] += rates.offered[label] - counts[1, label]
    k = table.k
    if 0 < k <= RANKS:
        reached = 0.0  # tokens counted whose rank was r or more
        for r in range(k + 1):
            reached += table.hits[r] - ranks[r]
        for r in range(k):
            m.ranks[0, r] += table.hits[r] - ranks[r]
            m.ranks[1, r] += reached
            reached -= table.hits[r] - ranks[r]


@compiled
def _clear(m: DraftMemory) -> None:
    empty = new_memory(m.budget)
    m.texts_ = empty.texts_
    m.digest = empty.digest
    m.hits[:] = empty.hits
    m.offered[:] = empty.offered
    m.ranks[:] = empty.ranks


@compiled
def _mixed(digest: int, value: int) -> int:
    return digest * 1000003 + value


@compiled
def _set_digest(m: DraftMemory, value: int) -> None:
    m.digest = value


@compiled
def _counts(m: DraftMemory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return m.hits.copy(), m.offered.copy(), m.ranks.copy()


@compiled
def _set_counts(m: DraftMemory, hits: np.ndarray, offered: np.ndarray, ranks: np.ndarray) -> None:
    m.hits[:] = hits
    m.offered[:] = offered
    m.ranks[:] = ranks


@compiled
def _budget(m: DraftMemory) -> int:
    return m.budget


@compiled
def _digest(m: DraftMemory) -> int:
    return m.digest


@compiled
def _nbytes(m: DraftMemory) -> int:
    total = m.hits.nbytes + m.offered.nbytes + m.ranks.nbytes
    for mem in m.texts_:
        total += mem.seq.nbytes + mem.grams.nbytes + mem.head.nbytes + mem.table.nbytes + mem.latest.nbytes
        total += mem.earlier.nbytes
    return total


@compiled
def _held(m: DraftMemory) -> int:
    older, newer = m.texts_
    return older.n + newer.n


@compiled
def _sequence(m: DraftMemory, which: int) -> np.ndarray:
    older, newer = m.texts_
    mem = older if which == 0 else newer
    return mem.seq[: mem.n].copy()


def identity(model: object, tokenizer: object) -> dict:
    """What a memory is learned from, hashed: the model's configuration and the first rows of its
    embedding (in bfloat16, so a model loaded in another dtype is the same model), and the
    tokenizer's vocabulary. A memory of another model's texts would draft another model's words."""
    cfg = model.config.to_dict()
    kept = {k: v for k, v in cfg.items() if k not in ("_name_or_path", "transformers_version", "torch_dtype", "dtype")}
    rows = model.get_input_embeddings().weight[:16].detach().to("cpu", torch.bfloat16).view(torch.int16)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode())
    digest.update(rows.numpy().tobytes())
    return {
        "model": digest.hexdigest()[:16],
        "tokenizer": hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16],
    }


__all__ = [
    "CONTEXT",
    "DRAFT_MEMORY",
    "END",
    "DraftMemory",
    "check_budget",
    "identity",
    "learn",
    "match_source",
    "memory_drafts",
    "seed",
]

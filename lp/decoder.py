"""The decode loop: exact greedy lookahead decoding (or plain autoregressive decoding) under
Lookahead Parallelism. World size 1 and P run this same code; per step each rank runs one
forward over its share, then one all-gather merges the results, so window, pool and output
stay identical on all ranks."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from lp.collective import Collective
from lp.config import DecodeConfig
from lp.errors import LPError
from lp.lookahead import JacobiWindow, NGramPool, step_layout
from lp.lookahead.drafts import text_drafts
from lp.lookahead.tree import DraftTree, build_tree
from lp.message import merge, pack
from lp.partition import partition
from lp.sampling import uniforms, warp
from lp.verify import Acceptance, greedy_accept, sample_continue, sample_first_level
from lp.verify.sampling import uniforms_needed
from lp.worker import Worker

_CHECK_MOD = 2**31 - 1


@dataclass
class Generation:
    """One sequence's result. `accepted` holds the tokens committed by each step,
    `step_tokens` the tokens of this rank's forward in each step."""

    output_ids: list[int]
    steps: int
    prefill_seconds: float
    seconds: float
    accepted: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def compression(self) -> float:
        """S: generated tokens per decoding step."""
        return self.new_tokens / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")


def _fingerprint(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _drafts(cfg: DecodeConfig, pool: NGramPool, out: np.ndarray) -> list[tuple[int, ...]]:
    """The step's candidates, best first: the text's longest-suffix continuations, then the
    pool's n-grams under x0, newest (or most frequent) first (duplicates dropped). With
    `rank="context"` (the default), the pool's n-grams that start with the last two tokens come
    first (what follows them, N-2 tokens): two matched tokens predict better than one."""
    x0 = int(out[-1])
    ranked = text_drafts(out, cfg.draft_len, cfg.text_drafts) if cfg.drafts == "pool+text" else []
    if cfg.rank == "context" and len(out) > 1 and pool.n > 2:
        ranked += [t[1:] for t in pool.best(int(out[-2])) if t[0] == x0]
    ranked += pool.best(x0, cfg.rank == "frequent")
    return list(dict.fromkeys(ranked))


def _sampled_accept(cfg: DecodeConfig, x0_logits: torch.Tensor, tree: DraftTree, mine: range,
                    node_logits: torch.Tensor, u: torch.Tensor, width: int) -> tuple[torch.Tensor, Acceptance]:
    """Sampling verification (Algorithm 4) on one rank. Every rank decides the first token from
    the tree's root tokens (the drafts are replicated); the rank holding the accepted roots'
    subtrees walks on. Returns (first token, acceptance) shaped like the greedy result for `pack`."""
    warp_ = lambda x: warp(x, cfg.temperature, cfg.top_k, cfg.top_p)  # noqa: E731
    roots = tree.roots
    first = sample_first_level(warp_(x0_logits), torch.from_numpy(tree.tokens[roots]), u)
    token = x0_logits.new_tensor(first.token, dtype=torch.long)
    alive = roots[(tree.tokens[roots] == first.token) & (roots >= mine.start) & (roots < mine.stop)] \
        if first.accepted else roots[:0]
    if len(alive) == 0:  # the step commits the first token alone: the no-candidate result
        none = token.new_zeros(0)
        return token, greedy_accept(token, none, none, none, none.bool().view(0, 0), none, width)
    # the alive roots are adjacent (build_tree groups them) and their subtrees whole on this rank
    start = int(alive[0])
    stop = int(roots[roots > alive[-1]][0]) if (roots > alive[-1]).any() else tree.size
    p_nodes = warp_(node_logits[start - mine.start:stop - mine.start])
    result = sample_continue(first.token, tree.slice(start, stop), p_nodes, u, width)
    # The lowest alive root stands for the group: a rule fixed before the outcome is seen.
    return token, Acceptance(token.new_tensor(start - mine.start), token.new_tensor(result.n - 1), result.tokens)


class Decoder:
    """Decodes with one Worker per rank; all ranks call `generate` with the same arguments."""

    def __init__(self, worker: Worker, collective: Collective, eos_ids: set[int], max_context: int) -> None:
        self.worker = worker
        self.comm = collective
        self.eos_ids = frozenset(eos_ids)
        self.max_context = max_context

    def _handshake(self, prompt: list[int], cfg: DecodeConfig) -> None:
        """Refuse to decode unless every rank got the same prompt and settings (one all-gather
        per sequence, so a mismatch is an error rather than a garbled or hung step)."""
        mine = torch.tensor([_fingerprint(cfg), _fingerprint(prompt), self.comm.world_size],
                            dtype=torch.long, device=self.worker.device)
        seen = self.comm.all_gather(mine).cpu()
        if (seen != seen[0]).any():
            raise LPError(f"rank mismatch: ranks were given different prompts or settings "
                          f"(fingerprints {seen[:, :2].tolist()})")

    def generate(self, prompt_ids: list[int], cfg: DecodeConfig, stream: int = 0) -> Generation:
        """Decode one prompt. With `cfg.temperature > 0`, `stream` selects the random stream
        (with `cfg.seed`), so several prompts of one run draw independent samples."""
        cfg.validate()
        if not prompt_ids:
            raise LPError("empty prompt")
        L = len(prompt_ids)
        if L + cfg.max_new_tokens > self.max_context:
            raise LPError(f"prompt ({L} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                          f"{self.max_context} tokens this model decodes (its context, or max_seq_len)")
        self._handshake(prompt_ids, cfg)
        W, N, G = (cfg.W, cfg.N, cfg.G) if cfg.lookahead else (0, 2, 0)
        budget = cfg.verify_budget if cfg.lookahead else 0
        width = min(cfg.max_draft, budget) + 1  # the most tokens a step commits
        P, rank, dev = self.comm.world_size, self.comm.rank, self.worker.device
        max_step = N + W + W * (N - 1) + budget  # pending + prefix + levels + tree
        self.worker.reset(L + cfg.max_new_tokens, max_step)

        t0 = time.perf_counter()
        self.worker.prefill(torch.tensor(prompt_ids[:-1], dtype=torch.long, device=dev))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()

        # the sequence so far, prompt included, in one buffer: seq[:length]
        seq = np.zeros(L + cfg.max_new_tokens, dtype=np.int64)
        seq[:L] = prompt_ids
        length = L
        pending = [prompt_ids[-1]]
        checksum = _fingerprint(prompt_ids)
        window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        pool = NGramPool(N, cfg.pool_capacity)
        if G and cfg.pool_from_prompt:
            pool.add_sequence(prompt_ids)
        sampled = cfg.temperature > 0
        accepted: list[int] = []
        step_tokens: list[int] = []
        while length - L < cfg.max_new_tokens:
            x0 = int(seq[length - 1])
            tree = build_tree(_drafts(cfg, pool, seq[:length]), budget, cfg.tree) if budget else build_tree([], 0)
            plans = partition(W, N, tree.size, P, tree.groups(), width=1)
            plan = plans[rank]
            mine = tree.slice(plan.candidates.start, plan.candidates.stop)  # this rank's subtrees
            layout = step_layout(len(pending), W, N, plan.columns, mine.parents)
            rows = window.rows.ravel() if window is not None else mine.tokens[:0]
            source = np.concatenate([np.asarray(pending, dtype=np.int64), rows, mine.tokens])
            ids = self.worker.upload(source[layout.gather])

            logits = self.worker.step(ids, layout, length - 1)
            n_cols = len(plan.columns)
            argmax = logits.argmax(dim=-1)  # one pass over every used row
            new = argmax[1:1 + n_cols]  # the lookahead branch stays greedy
            if sampled:
                u = uniforms(cfg.seed, stream, len(accepted), uniforms_needed(width - 1))
                y1, acc = _sampled_accept(cfg, logits[0], tree, plan.candidates, logits[1 + n_cols:], u, width)
            else:
                y1 = argmax[0]
                tree_on_device = self.worker.on_device(layout)  # no per-step upload: a copy would sync
                acc = greedy_accept(y1, ids[layout.size - mine.size:], tree_on_device.parents, tree_on_device.tree_depth,
                                    tree_on_device.tree_ancestors, argmax[1 + n_cols:], width)
            message = pack(y1, acc, plan.candidates.start, new, length, checksum, W)
            outcome = merge(self.comm.all_gather(message).cpu().numpy(), plans, width)  # the step's one sync

            self.worker.commit(len(pending))
            tokens = outcome.tokens[:cfg.max_new_tokens - (length - L)]
            stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            if stop is not None:
                tokens = tokens[:stop + 1]
            if window is not None:
                if G and window.ready:
                    pool.add_rows(window.ngrams(x0, outcome.new))
                window.update(outcome.new)
            for t in tokens:
                checksum = (checksum * 31 + t) % _CHECK_MOD
            seq[length:length + len(tokens)] = tokens
            length += len(tokens)
            if G and cfg.pool_from_output:
                # the n-grams that end in the new tokens: free candidates, as in prompt lookup
                pool.add_sequence(seq[max(length - len(tokens) - N + 1, 0):length])
            pending = tokens
            accepted.append(len(tokens))
            step_tokens.append(layout.size)
            if stop is not None:
                break
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t2 = time.perf_counter()
        return Generation(seq[L:length].tolist(), len(accepted), t1 - t0, t2 - t1, accepted, step_tokens)


__all__ = ["Decoder", "Generation"]

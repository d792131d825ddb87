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
from lp.message import merge, pack
from lp.partition import partition
from lp.sampling import uniforms, warp
from lp.verify import Acceptance, greedy_accept, sample_continue, sample_first_level
from lp.worker import Worker

_CHECK_MOD = 2**31 - 1


@dataclass
class Generation:
    """One sequence's result. `accepted` holds the tokens committed by each step."""

    output_ids: list[int]
    steps: int
    prefill_seconds: float
    seconds: float
    accepted: list[int] = field(default_factory=list)

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


def _sampled_accept(cfg: DecodeConfig, x0_logits: torch.Tensor, first_tokens: np.ndarray, mine: range,
                    cand_tokens: torch.Tensor, cand_logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, Acceptance]:
    """Sampling verification (Algorithm 4) on one rank. Every rank decides the first token from
    all candidates' first draft tokens (the pool is replicated); the rank holding the accepted
    group walks on. Returns (first token, acceptance) shaped like the greedy result for `pack`."""
    warp_ = lambda x: warp(x, cfg.temperature, cfg.top_k, cfg.top_p)  # noqa: E731
    first = sample_first_level(warp_(x0_logits), torch.from_numpy(first_tokens), u)
    token = x0_logits.new_tensor(first.token, dtype=torch.long)
    N = cand_tokens.shape[1] + 1
    local = np.flatnonzero(first_tokens[mine.start:mine.stop] == first.token) if first.accepted else []
    if len(local) == 0:  # the step commits the first token alone: the no-candidate result
        return token, greedy_accept(token, cand_tokens[:0], cand_tokens[:0])
    alive = torch.from_numpy(local).to(cand_tokens.device)
    p_cand = warp_(cand_logits.view(-1, N - 1, cand_logits.shape[-1]).index_select(0, alive))
    result = sample_continue(first.token, cand_tokens.index_select(0, alive), p_cand, u)
    # The lowest alive candidate stands for the group: a rule fixed before the outcome is seen.
    return token, Acceptance(alive[0], token.new_tensor(result.n - 1), result.tokens)


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
        P, rank, dev = self.comm.world_size, self.comm.rank, self.worker.device
        max_step = N + W + W * (N - 1) + G * (N - 1)  # pending + prefix + levels + candidates
        self.worker.reset(L + cfg.max_new_tokens, max_step)

        t0 = time.perf_counter()
        self.worker.prefill(torch.tensor(prompt_ids[:-1], dtype=torch.long, device=dev))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()

        out = list(prompt_ids)
        pending = [prompt_ids[-1]]
        checksum = _fingerprint(prompt_ids)
        window = JacobiWindow(W, N, prompt_ids, cfg.seed) if W else None
        pool = NGramPool(N, G)
        if G and cfg.pool_from_prompt:
            pool.add_sequence(prompt_ids)
        empty_rows = np.zeros((0, N - 1), dtype=np.int64)
        sampled = cfg.temperature > 0
        accepted: list[int] = []
        while len(out) - L < cfg.max_new_tokens:
            x0 = out[-1]
            cands = pool.lookup(x0)
            drafts = np.asarray(cands, dtype=np.int64).reshape(-1, N - 1) if cands else empty_rows
            groups = None
            if sampled and len(drafts):
                # candidates sharing a first draft token stay together: one rank finishes their walk
                drafts = drafts[np.argsort(drafts[:, 0], kind="stable")]
                groups = tuple(np.unique(drafts[:, 0], return_counts=True)[1].tolist())
            plans = partition(W, N, len(drafts), P, groups)
            plan = plans[rank]
            layout = step_layout(len(pending), W, N, plan.columns, len(plan.candidates))
            rows = window.rows.ravel() if window is not None else drafts[:0].ravel()
            mine = drafts[plan.candidates.start:plan.candidates.stop]  # this rank's share
            source = np.concatenate([np.asarray(pending, dtype=np.int64), rows, mine.ravel()])
            ids = self.worker.upload(source[layout.gather])

            logits = self.worker.step(ids, layout, len(out) - 1)
            n_cols, n_cand = len(plan.columns), len(plan.candidates)
            argmax = logits.argmax(dim=-1)  # one pass over every used row
            new = argmax[1:1 + n_cols]  # the lookahead branch stays greedy
            cand_tokens = ids[ids.numel() - n_cand * (N - 1):].view(n_cand, N - 1)
            if sampled:
                u = uniforms(cfg.seed, stream, len(accepted), 2 * N)
                y1, acc = _sampled_accept(cfg, logits[0], drafts[:, 0], plan.candidates, cand_tokens,
                                          logits[1 + n_cols:], u)
            else:
                y1 = argmax[0]
                acc = greedy_accept(y1, cand_tokens, argmax[1 + n_cols:].view(n_cand, N - 1))
            message = pack(y1, acc, plan.candidates.start, new, len(out), checksum, W)
            outcome = merge(self.comm.all_gather(message).cpu().numpy(), plans, N)  # the step's one sync

            self.worker.commit(len(pending))
            tokens = outcome.tokens[:cfg.max_new_tokens - (len(out) - L)]
            stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            if stop is not None:
                tokens = tokens[:stop + 1]
            if window is not None:
                if G and window.ready:
                    pool.add_rows(window.ngrams(x0, outcome.new))
                window.update(outcome.new)
            for t in tokens:
                checksum = (checksum * 31 + t) % _CHECK_MOD
            out += tokens
            if G and cfg.pool_from_output:
                # the n-grams that end in the new tokens: free candidates, as in prompt lookup
                pool.add_sequence(out[-(len(tokens) + N - 1):])
            pending = tokens
            accepted.append(len(tokens))
            if stop is not None:
                break
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t2 = time.perf_counter()
        return Generation(out[L:], len(accepted), t1 - t0, t2 - t1, accepted)


__all__ = ["Decoder", "Generation"]

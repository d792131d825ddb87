"""Token Recycling (Luo et al. 2024, "Turning Trash into Treasure: Accelerating Inference of Large
Language Models with Token Recycling"), the draft-free baseline `token-recycling` of lp.bench.

An adjacency matrix keeps each token's top-k (k=8) next tokens, as the model last predicted them:
after every forward, each logits row's input token gets that row's top-k (the prefill's rows
too). A step's drafts fill the paper's static tree template (80 nodes, each the rank-th successor
of its parent) from the matrix, walking it from the last committed token; one forward verifies
the tree (tree attention mask, positions by depth); the longest path whose every token is the
model's greedy choice commits, with the model's next token after it. As in the paper the matrix
is kept across prompts ("hot start"): a decoder's results depend on the prompts it decoded before.

It runs on its own transformers model with a `DynamicCache`: each step feeds the tokens its last
step committed (their KV was not kept: the cache is cropped back to the committed prefix after
every forward) followed by the tree, so it counts steps and step tokens as lp does: the prefill
(the prompt but its last token) is not a step, and a step's tokens include the re-fed ones."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from lp.bench.interface import BenchDecoder, DecodeOutput, sync
from lp.decode.state import DecodeState
from lp.verify.greedy import greedy_accept

TOP_K = 8
# The paper's tree template ("2.2.2"), level by level: a node is the string of successor ranks on
# the path from the root (the last committed token), "01" being the root's top successor's second.
PAPER_TEMPLATE = (
    "0 1 2 3 4 5 6 7",
    "00 01 02 03 04 05 06 07 10 11 12 13 20 21 22 30 31 40 50 60 70",
    "000 001 002 003 004 005 006 007 010 011 012 020 021 030 040 050 060 070 100 101 110 200 300 400 500",
    "0000 0001 0002 0003 0004 0010 0011 0020 0030 0040 0100 0200 1000 2000 3000",
    "00000 00001 00002 00010 00020 00100 01000 10000",
    "000000 000001 000100",
)


@dataclass(frozen=True)
class Template:
    """A static draft tree: node i takes the `ranks[i]`-th successor of node `parents[i]`'s token
    (-1: the root); parents precede their children."""

    parents: np.ndarray  # [n] int64
    ranks: np.ndarray  # [n] int64
    depth: np.ndarray  # [n] int64, 1 for the root's children
    ancestors: np.ndarray  # [n, n] bool: [i, j] iff node j is node i or one of its ancestors

    @property
    def size(self) -> int:
        return len(self.parents)

    @classmethod
    def from_paths(cls, levels: tuple[str, ...] = PAPER_TEMPLATE) -> Template:
        paths = [p for level in levels for p in level.split()]
        index = {p: i for i, p in enumerate(paths)}
        parents = np.array([index[p[:-1]] if len(p) > 1 else -1 for p in paths], dtype=np.int64)
        ranks = np.array([int(p[-1]) for p in paths], dtype=np.int64)
        depth = np.array([len(p) for p in paths], dtype=np.int64)
        ancestors = np.array([[q == p[: len(q)] for q in paths] for p in paths], dtype=bool)
        return cls(parents, ranks, depth, ancestors)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def fill(self, successors: np.ndarray, root: int) -> np.ndarray:
        """The tree's tokens from the `[V, k]` successor matrix, walked from `root`, a level at a time."""
        tokens = np.empty(self.size, dtype=np.int64)
        for d in range(1, self.max_depth + 1):
            at = np.flatnonzero(self.depth == d)
            parent = self.parents[at]
            from_tokens = np.where(parent < 0, root, tokens[np.maximum(parent, 0)])
            tokens[at] = successors[from_tokens, self.ranks[at]]
        return tokens

    def accept(self, tokens: np.ndarray, choice: np.ndarray, root_choice: int) -> np.ndarray:
        """The longest path (node indices, root's child first) on which every node's token is the
        model's greedy choice after its parent: `choice[i]` the model's next token after node i,
        `root_choice` after the root."""
        acc = greedy_accept(  # lp's own tree verification (paper Algorithm 3), on the host
            torch.tensor(root_choice),
            torch.from_numpy(tokens),
            torch.from_numpy(self.parents),
            torch.from_numpy(self.depth),
            torch.from_numpy(self.ancestors),
            torch.from_numpy(choice),
            max_commit=self.max_depth + 1,
        )
        best = int(acc.best)
        if best < 0:
            return np.empty(0, dtype=np.int64)
        path = np.flatnonzero(self.ancestors[best])
        return path[np.argsort(self.depth[path])]


class TokenRecycling(BenchDecoder):
    """Token Recycling on its own transformers model (rank 0 only), greedy."""

    name = "token-recycling"
    local = True

    def __init__(self, model, eos_ids: list[int], k: int = TOP_K, template: Template | None = None) -> None:
        self.template = template or Template.from_paths()
        rank = int(self.template.ranks.max())
        if k <= rank:
            raise ValueError(f"token-recycling: k={k} successors per token cannot fill a tree using rank {rank}")
        super().__init__(f"token-recycling[k{k}n{self.template.size}]", 1, {"k": k, "nodes": self.template.size})
        self.model = model
        self.k = k
        self.eos_ids = frozenset(eos_ids)
        # hot start: kept across prompts; no model (and no table) off rank 0, where it never decodes
        vocab = 0 if model is None else model.get_output_embeddings().weight.shape[0]
        self.successors = np.zeros((vocab, k), dtype=np.int64)
        t = self.template
        self._anc = torch.from_numpy(t.ancestors)
        self._depth = torch.from_numpy(t.depth)

    @property
    def max_step_tokens(self) -> int:
        """The most tokens a step feeds: the last step's commits (the deepest path and the next
        token) and the tree."""
        return self.template.max_depth + 1 + self.template.size

    def _recycle(self, ids: np.ndarray, logits: torch.Tensor) -> None:
        """Each row's input token gets the row's top-k next tokens (the last row of a token wins)."""
        top = torch.topk(logits, self.k, dim=-1).indices.numpy()
        _, last = np.unique(ids[::-1], return_index=True)
        rows = len(ids) - 1 - last
        self.successors[ids[rows]] = top[rows]

    def _mask(self, cached: int, p: int, dtype: torch.dtype) -> torch.Tensor:
        """`[1, 1, q, cached + q]` additive mask: the cache, the re-fed tokens causally, the tree's ancestors."""
        n = self.template.size
        q = p + n
        allowed = torch.ones(q, cached + q, dtype=torch.bool)
        block = allowed[:, cached:]
        block[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        block[:p, p:] = False
        block[p:, p:] = self._anc
        mask = torch.zeros(q, cached + q, dtype=dtype)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> DecodeOutput:
        from transformers import DynamicCache

        dev = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        cache = DynamicCache(config=self.model.config)
        state = DecodeState(list(prompt_ids))
        sync(dev)
        t0 = time.perf_counter()
        # `past_key_values`: the cache's keyword in every transformers lp supports (5.17 has no `cache`)
        if len(prompt_ids) > 1:
            head = torch.tensor([prompt_ids[:-1]], dtype=torch.long, device=dev)
            out = self.model(input_ids=head, past_key_values=cache, use_cache=True)
            self._recycle(np.asarray(prompt_ids[:-1]), out.logits[0].float().cpu())
        sync(dev)
        t1 = time.perf_counter()
        starts: list[float] = []
        n = self.template.size
        while not state.stopped and len(state.output) < max_new_tokens:
            starts.append(time.perf_counter())
            pending = np.asarray(state.pending, dtype=np.int64)
            p = len(pending)
            cached = cache.get_seq_length()
            tree = self.template.fill(self.successors, int(pending[-1]))
            ids = np.concatenate([pending, tree])
            depth = torch.cat([torch.arange(p), p - 1 + self._depth])
            out = self.model(
                input_ids=torch.from_numpy(ids)[None].to(dev),
                attention_mask=self._mask(cached, p, dtype).to(dev),
                position_ids=(cached + depth)[None].to(dev),
                past_key_values=cache,
                use_cache=True,
            )
            cache.crop(-n)  # keep the re-fed tokens' KV, drop the tree's
            logits = out.logits[0].float().cpu()
            choice = logits.argmax(-1).numpy()
            path = self.template.accept(tree, choice[p:], int(choice[p - 1]))
            bonus = choice[p + path[-1]] if len(path) else choice[p - 1]
            committed = [*tree[path].tolist(), int(bonus)]
            self._recycle(ids, logits)
            state.advance(state.clip(committed, max_new_tokens, self.eos_ids), len(ids), len(ids))
        sync(dev)
        end = time.perf_counter()
        return DecodeOutput(
            list(state.output),
            len(state.accepted),
            t1 - t0,
            end - t1,
            accepted_per_step=list(state.accepted),
            fed_per_step=list(state.fed_per_step),
            whole_per_step=list(state.whole_per_step),
            step_latencies=[b - a for a, b in zip(starts, [*starts[1:], end])],
        )

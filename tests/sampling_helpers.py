"""Helpers of the sampling tests (tests/ and tests_distributed/): exact next-tokens distributions and a chi-square
goodness-of-fit test (no scipy needed)."""

from __future__ import annotations

from collections import Counter

import torch

from lp.verify.distribution import warp


def peaked_llama(
    seed: int = 3, vocab: int = 8, scale: float = 40.0, kv_heads: int = 1
) -> tuple[torch.nn.Module, list[int]]:
    """A tiny random Llama with peaked next-token distributions, and a prompt that is its own
    greedy rollout, so the n-gram pool holds drafts the model often samples. `kv_heads=2`
    makes every head count divide by 2 (tensor parallelism)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    start = torch.tensor([[1, 5]])
    prompt = model.generate(start, do_sample=False, max_new_tokens=14, attention_mask=torch.ones_like(start))
    return model, prompt[0].tolist()


@torch.inference_mode()
def exact_distribution(
    model: torch.nn.Module, prompt: list[int], length: int, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens) under the warped model, by enumerating every prefix."""
    dist = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, p in dist.items():
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            probs = warp(logits.double(), temperature, top_k, top_p).tolist()
            for t, q in enumerate(probs):
                if q > 0:
                    nxt[prefix + (t,)] = p * q
        dist = nxt
    return dist


def chi_square_pvalue(
    samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float], min_expected: float = 5.0
) -> float:
    """Goodness of fit of `samples` to `expected` probabilities; cells with an expected count
    below `min_expected` are pooled into one. A sample outside the support gives p = 0."""
    n = len(samples)
    counts = Counter(samples)
    if any(s not in expected for s in counts):
        return 0.0
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in expected.items():
        if p * n >= min_expected:
            cells.append((counts.get(key, 0), p * n))
        else:
            pooled_obs += counts.get(key, 0)
            pooled_exp += p * n
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


def follow_first_drafts(first_token: int, tree, p_nodes: torch.Tensor, width: int):
    """A wrong sampling rule for the distribution tests' controls (same signature as
    lp.verify.sample_continue): always accept the drafts, from the first root carrying
    `first_token` down each node's first child, then the most likely next token."""
    from lp.verify.sampling import Sampled

    node = next(int(r) for r in tree.roots if tree.tokens[r] == first_token)
    out = [first_token]
    while True:
        kids = [i for i, p in enumerate(tree.parents) if p == node]
        if not kids:
            break
        node = kids[0]
        out.append(int(tree.tokens[node]))
    out.append(int(p_nodes[node].argmax()))
    return Sampled(torch.tensor(out + [-1] * (width - len(out))), len(out))


def alive_after(first_tokens: torch.Tensor, first):
    """Bool `[r]`: the roots that continue to level 2 after `first` (none if no draft was accepted)."""
    if not first.accepted:
        return torch.zeros_like(first_tokens, dtype=torch.bool)
    return first_tokens == first.token


def sample_accept(p_x0: torch.Tensor, tree, p_nodes: torch.Tensor, u: torch.Tensor, width: int | None = None):
    """One step's sampling verification on one rank, whole: `sample_first_level`, then, when a
    draft was accepted, `sample_continue` (what lp's SamplingVerifier does across ranks)."""
    from lp.verify.sampling import Sampled, sample_continue, sample_first_level, uniforms_needed

    depth = int(tree.depth.max()) if tree.size else 0
    width = width or depth + 1
    if p_nodes.shape[0] != tree.size or (tree.size and p_nodes.shape[1] != p_x0.shape[-1]):
        raise ValueError(
            f"sample_accept: p_nodes {tuple(p_nodes.shape)} does not match a tree of "
            f"{tree.size} nodes and p_x0 {tuple(p_x0.shape)}"
        )
    if u.numel() < uniforms_needed(depth):
        raise ValueError(f"sampling verification needs {uniforms_needed(depth)} uniforms, got {u.numel()}")
    first = sample_first_level(p_x0, torch.from_numpy(tree.tokens[tree.roots]), u)
    if not first.accepted:
        return Sampled(torch.tensor([first.token] + [-1] * (width - 1), dtype=torch.long, device=p_x0.device), 1)
    return sample_continue(first.token, tree, p_nodes, u, width)

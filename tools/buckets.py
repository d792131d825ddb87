"""Compiled fixed-shape steps against eager ones, bucket by bucket.

    python -m tools.buckets [model=tiny|NAME] [sizes=1,16,...] [attention=sdpa,flex] [prompt_len=200]

For each attention backend and each step size, one worker runs the step eagerly and one compiled
(torch.compile of the fixed-shape forward, as on a GPU, without the CUDA graph), after the same
prompt (longer than one FlexAttention block, so committed blocks are full blocks); prints the
largest absolute difference of their logits and the compile's seconds. `model=tiny`: a random
1-layer Llama (seconds per bucket); otherwise a named model (lp.models), in fp32.
"""

from __future__ import annotations

import sys
import time

import torch

from lp.engine.packed import BUCKETS
from lp.lookahead.mask import step_layout
from lp.worker import Worker


def tiny_model() -> torch.nn.Module:
    """A random 1-layer Llama with grouped kv heads (2 query heads per kv head)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(cfg).eval()


@torch.inference_mode()
def compare(model: torch.nn.Module, sizes: list[int], attention: str, prompt_len: int = 200) -> list[dict]:
    """Per step size: the largest |compiled - eager| over the step's logits, and compile seconds.
    The step is `size` causal tokens after a `prompt_len`-token prefill."""
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=gen)
    eager = Worker(model, graphs=True, compile=False, attention=attention)
    compiled = Worker(model, graphs=True, compile=True, attention=attention)
    rows = []
    for T in sizes:
        layout = step_layout(T, 1, 2, range(0), 0)
        ids = torch.randint(0, vocab, (T,), generator=gen).numpy()
        logits = []
        for w in (eager, compiled):
            t0 = time.perf_counter()
            w.prepare(T)  # compiles T's bucket
            seconds = time.perf_counter() - t0
            kv = w.sequence(prompt_len, T)
            w.prefill(kv, prompt.numpy())
            logits.append(w.step(kv, layout, ids).float().clone())
            kv.release()
        diff = (logits[1] - logits[0]).abs().max().item()
        rows.append({"attention": attention, "tokens": T, "max_abs_diff": diff, "compile_s": seconds})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv))
    sizes = [int(s) for s in args.get("sizes", ",".join(map(str, BUCKETS))).split(",")]
    name = args.get("model", "tiny")
    if name == "tiny":
        model = tiny_model()
    else:
        from lp import LP

        model = LP(name, device="cpu", dtype="float32", graphs=False, compile=False).model
    print(f"model={name} torch={torch.__version__} device=cpu prompt_len={args.get('prompt_len', 200)}")
    print("| attention | tokens | max abs diff (compiled - eager) | compile s |\n|---|---:|---:|---:|")
    for attention in args.get("attention", "sdpa,flex").split(","):
        for r in compare(model, sizes, attention, int(args.get("prompt_len", 200))):
            print(f"| {r['attention']} | {r['tokens']} | {r['max_abs_diff']:.2e} | {r['compile_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m lp.generate` (or `torchrun --nproc_per_node P -m lp.generate`): decode prompts
with lookahead decoding, print text and a summary, write JSONL results (rank 0 only).
Keys: configs/generate.yaml, e.g. `prompt="..." W=7 N=5 G=7 max_new_tokens=256`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig
from tqdm import tqdm

from lp.errors import LPError
from lp.prompts import Prompt, read_jsonl
from lp.runtime import LP

CONFIGS = str(Path(__file__).resolve().parent.parent / "configs")


def _prompts(cfg: DictConfig) -> list[Prompt]:
    if (cfg.prompt is None) == (cfg.prompts is None):
        raise LPError("give exactly one of prompt=\"...\" or prompts=FILE.jsonl")
    if cfg.prompt is not None:
        return [Prompt(0, str(cfg.prompt))]
    return read_jsonl(cfg.prompts, cfg.limit)


def run(cfg: DictConfig) -> None:
    prompts = _prompts(cfg)  # validated on every rank before any collective
    lm = LP(cfg.model.name, dtype=cfg.model.dtype, device=cfg.device, timeout_s=cfg.timeout_s,
            attention=cfg.attention, graphs=cfg.graphs, compile=cfg.compile, max_seq_len=cfg.max_seq_len,
            backend=cfg.backend)
    main = lm.comm.is_main
    settings = dict(W=cfg.W, N=cfg.N, G=cfg.G, max_new_tokens=cfg.max_new_tokens, mode=cfg.mode,
                    seed=cfg.seed, pool_from_prompt=cfg.pool_from_prompt,
                    pool_from_output=cfg.pool_from_output, temperature=cfg.temperature,
                    top_k=cfg.top_k, top_p=cfg.top_p)
    out = open(cfg.out, "w", encoding="utf-8") if (main and cfg.out) else None
    try:
        bar = tqdm(prompts, disable=not main or len(prompts) < 2, desc="prompts", file=sys.stderr)
        for i, p in enumerate(bar):
            r = lm.generate(p.text, chat=cfg.chat, stream=i, **settings)
            if not main:
                continue
            row = {"id": p.id, **({"category": p.category} if p.category else {}), **r.to_dict()}
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            summary = (f"[{p.id}] {r.new_tokens} tokens in {r.steps} steps, S={r.compression:.2f}, "
                       f"{r.tokens_per_s:.1f} tokens/s ({r.mode}, W={r.W} N={r.N} G={r.G}, "
                       f"world {r.world_size})")
            if r.auto:
                bar.write(f"auto: {r.auto}", file=sys.stderr)
            if cfg.quiet:
                bar.write(summary, file=sys.stderr)
            else:
                bar.write(f"{r.text}\n--- {summary}")
    finally:
        if out:
            out.close()
        lm.close()


@hydra.main(config_path=CONFIGS, config_name="generate", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except LPError as e:
        sys.exit(f"lp: error: {e}")


if __name__ == "__main__":
    main()

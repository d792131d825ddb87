"""`python -m lp.generate` (or `torchrun --nproc_per_node P -m lp.generate`): decode prompts
with lookahead decoding, print text and a summary, write JSONL results (rank 0 only).
Keys: configs/generate.yaml (`python -m lp.generate --help`)."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig
from tqdm import tqdm

from lp import models
from lp.collective import check_backend, check_device
from lp.config import DecodeConfig, check_settings
from lp.errors import LPError
from lp.frontend import cli
from lp.frontend.prompts import Prompt, read_jsonl
from lp.frontend.runtime import LP, Result
from lp.lookahead.memory import check_budget, check_file
from lp.mesh import check_tp
from lp.worker import check_options

SETTINGS = tuple(f.name for f in fields(DecodeConfig))  # the decoding keys of configs/generate.yaml


def _prompts(cfg: DictConfig) -> list[Prompt]:
    if (cfg.prompt is None) == (cfg.prompts is None):
        raise LPError('give exactly one of prompt="..." or prompts=FILE.jsonl')
    if cfg.prompt is not None:
        if not str(cfg.prompt):
            raise LPError("empty prompt")
        return [Prompt(0, str(cfg.prompt))]
    return read_jsonl(cfg.prompts, cfg.limit)


def _check_out(out: str | None) -> None:
    if out is None:
        return
    path = Path(out)
    if path.is_dir():
        raise LPError(f"out={out} is a directory; give a file path")
    if not path.parent.is_dir():
        raise LPError(f"out={out}: the directory {path.parent} does not exist")


def settings_of(cfg: DictConfig) -> dict:
    """The decoding settings the command line gives: a null key is left out, to DecodeConfig's
    default or, with W, N and G auto, to the shape W=auto chooses (which sets only keys not given)."""
    return {k: cfg[k] for k in SETTINGS if cfg[k] is not None}


def check(cfg: DictConfig) -> tuple[list[Prompt], dict]:
    """Every check that needs no model, so bad input fails in a second instead of after the
    load: the prompts, the decoding settings, `out`, the device, the model's name."""
    prompts = _prompts(cfg)
    settings = settings_of(cfg)
    check_settings(settings)
    _check_out(cfg.out)
    check_runtime(cfg)
    if not isinstance(cfg.batch, int) or isinstance(cfg.batch, bool) or cfg.batch < 1:
        raise LPError(f"batch must be an integer >= 1, got {cfg.batch!r}")
    return prompts, settings


def check_runtime(cfg: DictConfig) -> None:
    """The checks of the keys that load the model and join the ranks (lp.generate's and lp.serve's)."""
    if not cfg.timeout_s or cfg.timeout_s <= 0:
        raise LPError(f"timeout_s must be > 0, got {cfg.timeout_s!r}")
    check_device(cfg.device)
    check_backend(cfg.backend)
    check_tp(cfg.tp)
    check_options(cfg.attention, cfg.graphs, cfg.compile, cfg.max_seq_len, cfg.kernels, cfg.kv_tokens)
    check_budget(cfg.draft_memory)
    check_file(cfg.draft_memory_file)
    models.resolve(cfg.model.name)


def summary(pid: object, r: Result) -> str:
    """One line per prompt, the same with and without `quiet`."""
    shape = f"lookahead W={r.W} N={r.N} G={r.G}" if r.mode == "lookahead" else "plain decoding (mode=ar)"
    ranks = f"{r.world_size} rank{'s' if r.world_size > 1 else ''}"
    if r.tp > 1:
        ranks += f" ({r.world_size // r.tp} replica{'s' if r.world_size > r.tp else ''} x tp={r.tp})"
    line = (
        f"[{pid}] {r.new_tokens} tokens in {r.steps} steps, S={r.S:.2f}, "
        f"{r.tokens_per_s:.1f} tokens/s; {shape}, {ranks}"
    )
    if r.predicted:
        line += f"; auto predicted S={r.predicted['S']:.2f}, {r.predicted['tokens_per_s']:.1f} tokens/s"
    return line


def load(cfg: DictConfig) -> LP:
    """This rank's `LP` as the runtime keys say (lp.generate's and lp.serve's)."""
    cli.quiet_third_party()
    return LP(
        cfg.model.name,
        dtype=cfg.model.dtype,
        device=cfg.device,
        timeout_s=cfg.timeout_s,
        attention=cfg.attention,
        graphs=cfg.graphs,
        compile=cfg.compile,
        max_seq_len=cfg.max_seq_len,
        kv_tokens=cfg.kv_tokens,
        backend=cfg.backend,
        tp=cfg.tp,
        kernels=cfg.kernels,
        draft_memory=cfg.draft_memory,
        draft_memory_file=cfg.draft_memory_file,
    )


def _print(text: str) -> None:
    print(text, end="", flush=True)


def run(cfg: DictConfig) -> None:
    """The job: check the input, load the model, decode every prompt (every rank alike)."""
    prompts, settings = check(cfg)  # on every rank, before any collective or model load
    lm = load(cfg)
    main = lm.comm.is_main
    live = main and not cfg.quiet and sys.stdout.isatty()  # a terminal sees the text as it is committed
    try:
        out = open(cfg.out, "w", encoding="utf-8") if (main and cfg.out) else None
    except OSError as e:
        lm.close()
        raise LPError(f"cannot write out={cfg.out}: {e.strerror}") from None
    try:
        bar = tqdm(
            total=len(prompts), disable=not main or cfg.quiet or len(prompts) < 2, desc="prompts", file=sys.stderr
        )
        if cfg.batch == 1:  # one at a time: a terminal sees each text as it is committed
            results = (
                lm.generate(p.text, chat=cfg.chat, sample_stream=i, on_text=_print if live else None, **settings)
                for i, p in enumerate(prompts)
            )
        else:  # `batch` at a time, each prompt joining as another ends: results as they end
            live = False
            results = lm.stream([p.text for p in prompts], chat=cfg.chat, batch=cfg.batch, **settings)
        for i, r in enumerate(results):
            bar.update()
            if not main:
                continue
            p = prompts[r.index if cfg.batch > 1 else i]
            row = {"id": p.id, **({"category": p.category} if p.category else {}), **r.to_dict()}
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            if not cfg.quiet:
                bar.write(("" if live else r.text) + "\n", file=sys.stdout)
            if r.auto:
                bar.write(f"[{p.id}] auto: {r.auto}", file=sys.stdout)
            bar.write(summary(p.id, r), file=sys.stdout)
    finally:
        if out:
            out.close()
        lm.close()


main = cli.entry("generate", run)

if __name__ == "__main__":
    main()

"""`python -m lp.bench.sweep [key=value ...]`: the budget sweep. lp decodes a dataset at a ladder of
step sizes, a step's size being the most tokens it feeds the model (its pending tokens, at most
the last step's commit; the window; the tree: `DecodeConfig.largest_step`), and the draft-free
baselines (Token Recycling, transformers' prompt lookup) decode the same prompts at their own step
sizes. Every output is checked token by token against transformers' greedy `generate` (fp32 on
the CPU by default), computed once per prompt and cached in OUT/references.json
(`lp.bench.references`). Keys: configs/sweep.yaml.

Writes OUT/rows.jsonl (one row per prompt and decoder, appended as it goes; `resume=true` skips
the rows it holds), and after every prompt OUT/sweep.json (docs: the sweep file's keys below),
OUT/sweep.md (S per step size, pooled and per category) and OUT/sweep.png (S against step
tokens); `decode=false` writes those of the rows OUT/rows.jsonl holds, decoded by other runs
(launch/sweep.sh joins parallel runs so), and `sizes=[] baselines=[]` computes only the
references. S pools a group's prompts: all new tokens / all decoding steps, steps counted as
lp.bench counts them (lp/bench/decoders.py).

sweep.json: {label, command, device, date, model, dataset, prompts, max_new_tokens, rows: [{decoder
("lp" | "token-recycling" | "prompt-lookup"), config, step_tokens (the most tokens a step may
feed: the sweep's x), step_tokens_mean, S, S_by_category, identical, prompts}]}."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lp.bench import datasets, metrics, report, sweep_report
from lp.bench.decoders import build
from lp.bench.interface import BenchDecoder, Context
from lp.bench.references import References
from lp.bench.settings import PromptKeys
from lp.bench.shapes import parse_lookahead
from lp.config import DecodeConfig
from lp.decode.ladder import LADDER as AUTO_LADDER
from lp.decode.ladder import rank_tokens
from lp.decode.record import collector_paused
from lp.engine.kernel_choice import cpu_name
from lp.errors import LPError

# lp's config at each step size: W=auto's ladder (lp/decode/auto.py), each shape at its largest step.
LADDER = {rank_tokens(shape): shape.name for shape in AUTO_LADDER}
BASELINES = {"token-recycling": "token-recycling", "hf-prompt-lookup": "prompt-lookup"}  # kind -> sweep name


@dataclass
class SweepSettings(PromptKeys):
    """The keys of configs/sweep.yaml."""

    per_category: int | None = 8
    max_new_tokens: int = 128
    sizes: list[int] = field(default_factory=lambda: list(LADDER))
    configs: list[str] | None = None
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    seed: int = 0
    threads: int | None = None
    device: str = "cpu"
    graphs: bool | str = "auto"
    compile: bool | str = "auto"
    out: str = "sweep-results/latest"
    resume: bool = False
    decode: bool = True
    label: str | None = None
    progress: bool = True

    @classmethod
    def from_mapping(cls, cfg: Mapping) -> SweepSettings:
        s = cls(**cls.values(cfg))
        unknown = [b for b in s.baselines if b not in BASELINES]
        if unknown:
            raise LPError(f"unknown baseline '{unknown[0]}'; known: {', '.join(BASELINES)}")
        if s.max_new_tokens < 1:
            raise LPError(f"max_new_tokens must be an integer >= 1, got {s.max_new_tokens}")
        s.ladder()
        return s

    def ladder(self) -> list[tuple[int, str]]:
        """(size, lp config) per step size, each config's largest step checked against its size."""
        if self.configs is None:
            missing = [n for n in self.sizes if n not in LADDER]
            if missing:
                raise LPError(
                    f"no default config for step size {missing[0]} (known: {list(LADDER)}): give configs=[...]"
                )
            configs = [LADDER[n] for n in self.sizes]
        elif len(self.configs) != len(self.sizes):
            raise LPError(f"configs has {len(self.configs)} entries for {len(self.sizes)} sizes")
        else:
            configs = list(self.configs)
        for size, name in zip(self.sizes, configs):
            most = step_tokens_of(name)
            if most > size:
                raise LPError(f"config {name} feeds up to {most} tokens a step, more than its size {size}")
        return list(zip(self.sizes, configs))


def step_tokens_of(config: str) -> int:
    """The most tokens a step of lp config `config` (lp.bench.shapes syntax) feeds the model."""
    try:
        settings = parse_lookahead(config)
    except ValueError as e:
        raise LPError(str(e)) from None
    if "auto" in settings.values():
        raise LPError(f"the sweep needs fixed shapes, got {config!r}")
    return DecodeConfig(**settings).validate().largest_step


@dataclass(frozen=True)
class Entry:
    """One decoder of the sweep: its sweep name, config name and step size (the x axis)."""

    decoder: BenchDecoder
    name: str
    config: str
    step_tokens: int


def _entries(s: SweepSettings, ctx: Context) -> tuple[BenchDecoder, list[Entry]]:
    """The greedy reference decoder and the sweep's decoders (one model copy for the baselines)."""
    ladder = s.ladder()
    try:
        built = build(
            ["hf-greedy", "lp", *s.baselines],
            ctx,
            lookahead=[parse_lookahead(c) for _, c in ladder],
            seed=s.seed,
            pld_tokens=s.prompt_lookup_num_tokens,
            pld_ngram=s.max_matching_ngram_size,
        )
    except ValueError as e:
        raise LPError(str(e)) from None
    reference, lp, baselines = built[0], built[1 : 1 + len(ladder)], built[1 + len(ladder) :]
    entries = [Entry(d, "lp", c, n) for d, (n, c) in zip(lp, ladder)]
    for d in baselines:
        if d.name == "token-recycling":
            entries.append(Entry(d, BASELINES[d.name], f"k{d.k}n{d.template.size}", d.max_step_tokens))
        else:  # prompt lookup: the last token and its draft
            config = f"k{s.prompt_lookup_num_tokens}m{s.max_matching_ngram_size}"
            entries.append(Entry(d, BASELINES[d.name], config, 1 + s.prompt_lookup_num_tokens))
    return reference, entries


def _row(p: datasets.BenchPrompt, ids: list[int], e: Entry, o, ref: list[int]) -> dict:
    first = metrics.first_mismatch(o.output_ids, ref)
    row = {
        "id": p.id,
        "category": p.category,
        "decoder": e.name,
        "config": e.config,
        "step_tokens": e.step_tokens,
        "prompt_tokens": len(ids),
        "new_tokens": o.new_tokens,
        "steps": o.steps,
        "S": o.S,
        "step_tokens_total": sum(o.fed_per_step),
        "step_tokens_max": max(o.fed_per_step, default=0),
        "identical": first is None,
        "first_mismatch": first,
        "prefill_seconds": o.prefill_seconds,
        "decode_seconds": o.seconds,
        "status": "ok",
        "output_ids": o.output_ids,
    }
    if o.forward_seconds is not None:  # lp: decode time outside its forwards, per step (lp.bench's `_ForwardTimer`)
        row["host_ms_per_step"] = 1e3 * max(0.0, o.seconds - o.forward_seconds) / max(o.steps, 1)
    return row


def run(cfg: Mapping | SweepSettings) -> dict:
    """Run the sweep; returns {"rows", "summary", "out_dir"}."""
    from tqdm import tqdm

    from lp import models
    from lp.frontend.runtime import DTYPES, LP

    s = cfg if isinstance(cfg, SweepSettings) else SweepSettings.from_mapping(cfg)
    if not s.decode:
        return _tables_only(s)
    prompts = datasets.load(s.dataset, s.prompts, per_category=s.per_category, limit=s.limit, categories=s.categories)
    if s.threads:
        torch.set_num_threads(s.threads)
    if s.dtype not in DTYPES:
        raise LPError(f"dtype must be one of {sorted(DTYPES)}, got {s.dtype!r}")
    # each prompt from nothing: a shape's S is its own, whatever the prompts before it
    options = dict(dtype=s.dtype, device=s.device, graphs=s.graphs, compile=s.compile, draft_memory=0)
    lm = LP(s.model, **options)
    if lm.comm.world_size > 1:
        lm.close()
        raise LPError("lp.bench.sweep runs on one rank (its baselines and references run where lp does)")
    try:
        ctx = Context(lm, models.resolve(s.model), DTYPES[s.dtype], options)
        reference, entries = _entries(s, ctx)
        out = Path(s.out)
        out.mkdir(parents=True, exist_ok=True)
        refs = References(out / "references.json")
        rows = report.read_rows(out / "rows.jsonl") if s.resume and (out / "rows.jsonl").exists() else []
        done = {(r["id"], r["decoder"], r["config"]) for r in rows}
        cpu = cpu_name()
        head = _head(s, len(prompts), f"{lm.comm.device} ({cpu}, {torch.get_num_threads()} threads)")
        limit = lm.decoder.max_context
        with open(out / "rows.jsonl", "a" if s.resume else "w", encoding="utf-8") as jsonl:
            bar = tqdm(prompts, desc="prompts", file=sys.stderr, disable=not s.progress, dynamic_ncols=True)
            for p in bar:
                chat = s.chat if s.chat is not None else p.chat and lm.tokenizer.chat_template is not None
                ids = lm.encode(p.text, bool(chat))
                todo = [e for e in entries if (p.id, e.name, e.config) not in done]
                if not todo and entries:  # with no decoders at all: the references alone
                    continue
                if len(ids) + s.max_new_tokens > limit:
                    new = [{"id": p.id, "category": p.category, "decoder": e.name, "config": e.config,
                            "step_tokens": e.step_tokens, "status": f"skipped: prompt ({len(ids)} tokens) too long"}
                           for e in todo]  # fmt: skip
                else:
                    ref = refs.get(ids, s.max_new_tokens)
                    if ref is None:
                        with collector_paused():
                            ref = reference.generate(ids, s.max_new_tokens).output_ids
                        refs.put(ids, s.max_new_tokens, ref, id=p.id)
                    new = []
                    for e in todo:
                        with collector_paused():  # as lp's decoder does, for every decoder
                            o = e.decoder.generate(ids, s.max_new_tokens)
                        new.append(_row(p, ids, e, o, ref))
                for r in new:
                    jsonl.write(report.dumps(r) + "\n")
                jsonl.flush()
                rows += new
                sweep_report.write(out, head, rows)  # a run cut short keeps its table
                lp_rows = [r for r in new if r["decoder"] == "lp" and r["status"] == "ok"]
                if lp_rows:
                    bar.set_postfix_str(" ".join(f"{r['step_tokens']}:{r['S']:.2f}" for r in lp_rows))
        sweep_report.write(out, head, rows)
        return {"rows": rows, "summary": sweep_report.summarize(rows), "out_dir": str(out)}
    finally:
        lm.close()


def _tables_only(s: SweepSettings) -> dict:
    """`decode=false`: the tables of OUT/rows.jsonl, rows that other runs decoded (their devices
    and commands are theirs: the tables name none), no model loaded."""
    out = Path(s.out)
    if not (out / "rows.jsonl").exists():
        raise LPError(f"decode=false writes the tables of {out / 'rows.jsonl'}, which does not exist")
    rows = report.read_rows(out / "rows.jsonl")
    sweep_report.write(out, _head(s, len({r["id"] for r in rows}), "the rows' own runs (joined rows)"), rows)
    return {"rows": rows, "summary": sweep_report.summarize(rows), "out_dir": str(out)}


def _head(s: SweepSettings, prompts: int, device: str) -> dict:
    """sweep.json's keys but its rows."""
    return {
        "label": s.label or f"{s.dataset} sweep, {prompts} prompts, {s.max_new_tokens} new tokens",
        "command": " ".join(["python -m lp.bench.sweep", *sys.argv[1:]]),
        "device": device,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "model": s.model,
        "dataset": s.dataset,
        "prompts": prompts,
        "max_new_tokens": s.max_new_tokens,
    }


def _main(cfg) -> None:
    from omegaconf import OmegaConf

    from lp.frontend import cli

    cli.quiet_third_party()
    res = run(OmegaConf.to_container(cfg, resolve=True))
    print(Path(res["out_dir"], "sweep.md").read_text())
    print(f"lp.bench.sweep: results in {res['out_dir']}", file=sys.stderr)


def main() -> None:
    from lp.frontend import cli

    cli.entry("sweep", _main, module="lp.bench.sweep")()


if __name__ == "__main__":
    main()

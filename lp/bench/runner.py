"""The benchmark loop: every prompt through every decoder, in one process group.

Per prompt, the decoders run in the order given (rank-0-only ones on rank 0 while the other
ranks wait at the next collective); each decoder is warmed up first on the first prompt, and
those runs are not recorded. Rank 0 compares every output with the reference decoder's
(`matches_greedy`), divides the baseline's decode seconds by each decoder's (`speedup`), and
writes one JSONL row per (prompt, decoder) and the summary so far after every prompt (a run cut
short keeps its table); at the end the printed table and the per-category plots.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch

from lp.bench import datasets, metrics, report
from lp.bench.decoders import build
from lp.bench.interface import BenchDecoder, Context, DecodeOutput
from lp.bench.settings import Settings
from lp.decode.record import collector_paused
from lp.engine.kernel_choice import cpu_name, device_name
from lp.errors import LPError


def _pick(decoders: list[BenchDecoder], key: str | None, what: str) -> BenchDecoder | None:
    if key is None:
        return None
    hits = [d for d in decoders if d.label == key] or [d for d in decoders if d.name == key]
    if not hits:
        raise LPError(f"{what} '{key}' is not among the decoders {[d.label for d in decoders]}")
    return hits[0]


def _set_threads(n: int | None) -> None:
    if n and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _row(
    p: datasets.BenchPrompt,
    ids: list[int],
    d: BenchDecoder,
    o: DecodeOutput | None,
    s: Settings,
    status: str,
    tokenizer,
) -> dict:
    row = {
        "tag": s.tag,
        "dataset": p.dataset,
        "id": p.id,
        "category": p.category,
        "subcategory": p.subcategory,
        "decoder": d.label,
        "kind": d.name,
        "world_size": d.world_size if not d.local else 1,
        "model": s.model,
        "prompt_tokens": len(ids),
        "max_new_tokens": s.max_new_tokens,
    }
    row.update(
        {
            k: d.settings[k]
            for k in ("W", "N", "G", "drafts", "tree", "step_tokens", "tree_tokens", "draft_len")
            if k in d.settings
        }
    )
    if o is not None:
        row.update(
            new_tokens=o.new_tokens,
            steps=o.steps,
            S=o.S,
            prefill_seconds=o.prefill_seconds,
            decode_seconds=o.seconds,
            tokens_per_s=o.tokens_per_s,
            step_latency_median=metrics.median(o.step_latencies),
            step_tokens=metrics.mean_step_tokens(o.fed_per_step),
            step_tokens_total=sum(o.fed_per_step),
            accepted_hist=metrics.accepted_histogram(o.accepted_per_step),
            accepted_per_step=o.accepted_per_step,
            step_latencies=[round(x, 7) for x in o.step_latencies],
            output_ids=o.output_ids,
            text=tokenizer.decode(o.output_ids, skip_special_tokens=True),
        )
        if o.forward_seconds is not None:
            row.update(
                forward_seconds=o.forward_seconds, outside_forward=metrics.outside_forward(o.forward_seconds, o.seconds)
            )
        if o.after_read:  # lookahead: from each message read to the next forward, median over the steps
            row["after_read_ms_median"] = 1e3 * metrics.median(o.after_read)
        if o.chosen:  # W/N/G auto: the shape this prompt used
            row.update(
                W=o.chosen["W"],
                N=o.chosen["N"],
                G=o.chosen["G"],
                lp_mode=o.chosen["mode"],
                auto=o.chosen["auto"],
                predicted_S=o.chosen["predicted"]["S"],
                predicted_tokens_per_s=o.chosen["predicted"]["tokens_per_s"],
            )
    row["note"] = d.note
    row["status"] = status
    return row


def run(cfg: Mapping | Settings) -> dict | None:
    """Run the benchmark; on rank 0 return {"rows", "summary", "out_dir"} (None elsewhere)."""
    from tqdm import tqdm

    from lp import models
    from lp.frontend.runtime import DTYPES, LP

    s = cfg if isinstance(cfg, Settings) else Settings.from_mapping(cfg)
    prompts = datasets.load(
        s.dataset, s.prompts, per_category=s.per_category, limit=s.limit, categories=s.categories
    )  # validated on every rank before any collective
    _set_threads(s.threads)
    if s.dtype not in DTYPES:
        raise LPError(f"dtype must be one of {sorted(DTYPES)}, got {s.dtype!r}")
    options = dict(
        dtype=s.dtype,
        device=s.device,
        timeout_s=s.timeout_s,
        graphs=s.graphs,
        compile=s.compile,
        attention=s.attention,
        kernels=s.kernels,
        max_seq_len=s.max_seq_len,
        backend=s.backend,
        draft_memory=s.draft_memory,
    )
    lm = LP(s.model, tp=s.tp, **options)
    try:
        return _run(s, prompts, lm, Context(lm, models.resolve(s.model), DTYPES[s.dtype], options), tqdm=tqdm)
    finally:
        lm.close()


def _run(s: Settings, prompts, lm, ctx: Context, tqdm) -> dict | None:
    main = lm.comm.is_main
    try:
        decoders = build(
            s.decoders,
            ctx,
            lookahead=s.lookahead_configs(),
            seed=s.seed,
            pool_from_prompt=s.pool_from_prompt,
            pld_tokens=s.prompt_lookup_num_tokens,
            pld_ngram=s.max_matching_ngram_size,
            tp_impl=s.tp_impl,
            pp_balance=s.pp_balance,
        )
    except ValueError as e:
        raise LPError(str(e)) from None
    baseline = _pick(decoders, s.baseline, "baseline")
    reference = _pick(decoders, s.reference, "reference")
    for d in decoders:
        if d.unsupported and main:
            print(f"lp.bench: {d.label} not run: {d.unsupported}", file=sys.stderr)
        elif d.note and main:
            print(f"lp.bench: {d.label}: {d.note}", file=sys.stderr)

    def chat_for(p) -> bool:
        if s.chat is not None:
            return bool(s.chat)
        return p.chat and lm.tokenizer.chat_template is not None

    encoded = [lm.encode(p.text, chat_for(p)) for p in prompts]
    limit = lm.decoder.max_context

    def call(d: BenchDecoder, ids: list[int], n: int) -> DecodeOutput:
        _set_threads((s.local_threads or s.threads) if d.local else s.threads)
        with collector_paused():  # as lp's decoder does: for every decoder, baselines included
            return d.generate(ids, n)

    runnable = [d for d in decoders if not d.unsupported and (main or not d.local)]
    warm = next((ids for ids in encoded if len(ids) + s.warmup_tokens <= limit), None)
    for _ in range(s.warmup if warm is not None else 0):
        for d in runnable:
            call(d, warm, s.warmup_tokens)

    out_dir = Path(s.out_dir)
    rows: list[dict] = []
    jsonl = None
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        report.write_meta(out_dir / "meta.json", _meta(s, lm, decoders, prompts))
        jsonl = open(out_dir / "rows.jsonl", "w", encoding="utf-8")
    try:
        bar = tqdm(
            list(zip(prompts, encoded)),
            desc="prompts",
            file=sys.stderr,
            disable=not (main and s.progress),
            dynamic_ncols=True,
        )
        for p, ids in bar:
            outs: dict[str, tuple[DecodeOutput | None, str]] = {}
            too_long = len(ids) + s.max_new_tokens > limit
            for d in decoders:
                if too_long:
                    outs[d.label] = (
                        None,
                        f"skipped: prompt ({len(ids)} tokens) + max_new_tokens exceeds the context ({limit})",
                    )
                elif d.unsupported:
                    outs[d.label] = (None, f"unsupported: {d.unsupported}")
                elif d.local and not main:
                    continue
                else:
                    try:
                        outs[d.label] = (call(d, ids, s.max_new_tokens), "ok")
                    except Exception as e:  # noqa: BLE001
                        if not d.local and lm.comm.world_size > 1:
                            raise  # a collective decoder failed: the ranks cannot stay in step
                        outs[d.label] = (None, f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            if not main:
                continue
            ref = outs.get(reference.label, (None, ""))[0] if reference else None
            base = outs.get(baseline.label, (None, ""))[0] if baseline else None
            for d in decoders:
                o, status = outs[d.label]
                row = _row(p, ids, d, o, s=s, status=status, tokenizer=lm.tokenizer)
                if o is not None:
                    bs = base.seconds if base is not None else None
                    row["baseline"] = baseline.label if baseline else None
                    row["baseline_seconds"] = bs
                    row["speedup"] = metrics.speedup(bs, o.seconds)
                    if ref is not None:
                        mm = metrics.first_mismatch(o.output_ids, ref.output_ids)
                        row["matches_greedy"], row["first_mismatch"] = mm is None, mm
                    else:
                        row["matches_greedy"], row["first_mismatch"] = None, None
                rows.append(row)
                jsonl.write(report.dumps(row) + "\n")
            jsonl.flush()
            report.write_summary(out_dir, metrics.summarize(rows))  # a run cut short keeps its table
            lp_rows = [r for r in rows[-len(decoders) :] if r.get("kind") == "lp" and r["status"] == "ok"]
            if lp_rows:
                bar.set_postfix_str(f"S={lp_rows[0]['S']:.2f} x{lp_rows[0]['speedup']:.2f}")
    finally:
        if jsonl:
            jsonl.close()
    if not main:
        return None
    summary = metrics.summarize(rows)
    report.write_summary(out_dir, summary)
    if s.print_table:
        print(report.table(summary))
    if s.plots and rows:
        from lp.bench import plots

        try:
            plots.per_category(summary, out_dir / "categories.png")
        except Exception as e:  # noqa: BLE001 -- a plot must never lose the results
            print(f"lp.bench: plot failed: {e}", file=sys.stderr)
    return {"rows": rows, "summary": summary, "out_dir": str(out_dir)}


def _meta(s: Settings, lm, decoders: list[BenchDecoder], prompts) -> dict:
    dev = lm.comm.device
    return {
        "settings": asdict(s),
        "world_size": lm.comm.world_size,
        "device": str(dev),
        "device_name": device_name(dev),
        "cpu": cpu_name(),  # the host's, on a GPU machine too
        "kernels": lm.decoder.worker.kernels.describe(),  # lp's matmuls' formulations, as chosen at load
        "threads_per_rank": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "prompts": len(prompts),
        "decoders": [
            {
                "label": d.label,
                "kind": d.name,
                "world_size": 1 if d.local else d.world_size,
                "rank0_only": d.local,
                "unsupported": d.unsupported,
                "note": d.note,
                "settings": d.settings,
            }
            for d in decoders
        ],
    }

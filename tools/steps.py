"""Step cost of a named architecture with random weights, built on the device (no download).

Step latency against step tokens, lp `mode=ar` against transformers `generate`, and the
weight-read floor.

    python -m tools.steps arch=llama-7b [key=value ...]      (--help lists every key)

Weights are random, so every number here is a timing and nothing else: the outputs of a random
model mean nothing, and S (tokens per step) never comes from this tool; it depends on a trained
model and real text, not on the hardware. What it measures:

- step latency (median, p10, p90 over `reps`) of one lp forward of a causal block of T tokens
  after a `prompt_len`-token prefill, for every T of `tokens`, and of the lookahead step shapes
  of `W=auto`'s ladder (lp/decode/auto.py), labelled with their (W, N, G, step size);
- decoding tokens/s of lp `mode=ar`, transformers' eager `generate(do_sample=False)` and
  `generate(cache_implementation="static")` on the same model and prompt, `new_tokens` each
  (eos never stops them), medians of `runs` runs after one warm-up of each, interleaved;
- copy bandwidth (one large device buffer copied, bytes read + written / seconds, median of
  `reps`), and from it the weight-read floor: the weights one token's forward must read
  (every parameter except an untied input embedding, of which a token reads one row) divided
  by that bandwidth. lp's tokens/s is reported as a fraction of the floor's, and against
  static `generate`.

Writes OUT/steps.json, OUT/steps.md and OUT/steps.png, and prints the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lp.bench import metrics
from lp.bench.report import clean
from lp.decode.ladder import LADDER
from lp.engine.kernel_choice import device_name
from lp.errors import LPError
from lp.lookahead.mask import StepLayout, step_layout
from lp.models import cache_dir

RANDOM_WEIGHTS = "random (timing only: outputs mean nothing; S never comes from this tool)"


@dataclass(frozen=True)
class Arch:
    """A real model's shape: its transformers config family and fields, and the longest
    sequence (prompt + new tokens) this tool gives lp's decoder."""

    family: str  # "llama" (LlamaConfig) or "qwen2" (Qwen2Config)
    config: dict
    max_context: int


ARCHS: dict[str, Arch] = {
    "tiny": Arch(
        "llama",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=256,
            max_position_embeddings=4096,
            initializer_range=0.05,
        ),
        4096,
    ),  # context: long Spec-Bench prompts (project)
    "llama-7b": Arch(
        "llama",
        dict(
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
        ),
        4096,
    ),
    "llama3-8b": Arch(
        "llama",
        dict(
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_position_embeddings=8192,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
        ),
        8192,
    ),
    # Context 32768, but lp's cache here holds 4096 tokens at most (plenty for a timing run).
    "qwen2.5-7b": Arch(
        "qwen2",
        dict(
            hidden_size=3584,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            intermediate_size=18944,
            vocab_size=152064,
            max_position_embeddings=32768,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
        ),
        4096,
    ),
}

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 120, 128, 240, 256, 480, 512, 768, 1024)


@dataclass
class Engine:
    """Where and how a timing tool runs lp's engine on an architecture with random weights."""

    arch: str = "llama-7b"
    device: str = "auto"
    dtype: str = "auto"
    graphs: str = "auto"
    attention: str = "auto"
    seed: int = 0

    def validate_engine(self) -> None:
        if self.arch not in ARCHS:
            raise LPError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for key, allowed in (
            ("device", ("auto", "cpu", "cuda")),
            ("dtype", ("auto", "float32", "bfloat16", "float16")),
            ("graphs", ("auto", "true", "false")),
        ):
            if getattr(self, key) not in allowed:
                raise LPError(f"{key} must be one of {'|'.join(allowed)}, got {getattr(self, key)!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise LPError("device=cuda, but torch sees no CUDA device")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        from lp.frontend.runtime import DTYPES

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    @property
    def use_graphs(self) -> bool:
        return self.torch_device.type == "cuda" if self.graphs == "auto" else self.graphs == "true"

    def worker(self, model: torch.nn.Module):
        """lp's Worker for `model`: the one place it is built, as its keyword arguments change."""
        from lp.worker import Worker

        return Worker(model, graphs=self.use_graphs, attention=self.attention, max_seq_len=ARCHS[self.arch].max_context)


@dataclass
class Settings(Engine):
    """The tool's keys (`key=value` on the command line; lists as `1,2,4` or `[1,2,4]`)."""

    prompt_len: int = 200
    tokens: list[int] = field(default_factory=lambda: list(DEFAULT_TOKENS))
    reps: int = 20
    warmup: int = 3
    new_tokens: int = 128
    runs: int = 3
    copy_mib: int = 0
    batches: list[int] = field(default_factory=list)
    out: str = ""

    def validate(self) -> Settings:
        self.validate_engine()
        for key, low in (
            ("prompt_len", 1),
            ("reps", 1),
            ("warmup", 0),
            ("new_tokens", 2),
            ("runs", 0),
            ("copy_mib", 0),
        ):
            if getattr(self, key) < low:
                raise LPError(f"{key} must be >= {low}, got {getattr(self, key)}")
        if not self.tokens or min(self.tokens) < 1:
            raise LPError(f"tokens must be step sizes >= 1, got {self.tokens}")
        if any(b < 1 for b in self.batches):
            raise LPError(f"batches must be sequence counts >= 1, got {self.batches}")
        if self.prompt_len + self.new_tokens > ARCHS[self.arch].max_context:
            raise LPError(
                f"prompt_len + new_tokens exceeds {self.arch}'s context here ({ARCHS[self.arch].max_context})"
            )
        return self


HELP = {
    "arch": f"architecture, random weights: {', '.join(ARCHS)} (default llama-7b)",
    "device": "auto | cpu | cuda (auto: cuda when available)",
    "dtype": "auto | float32 | bfloat16 | float16 (auto: bfloat16 on cuda, float32 on cpu)",
    "prompt_len": "prefill tokens before every timed step and prompt length of the decode comparison (200)",
    "tokens": f"causal step sizes T to time (default {','.join(map(str, DEFAULT_TOKENS))})",
    "reps": "timed repetitions of each step and of the bandwidth copy (20)",
    "warmup": "untimed repetitions of each step first; the first one captures its CUDA graph (3)",
    "new_tokens": "tokens each decoder generates in the tokens/s comparison (128)",
    "runs": "timed runs of each decoder in that comparison, after one warm-up each (3; 0: no comparison)",
    "graphs": "auto | true | false: lp's fixed-shape steps, CUDA graphs on a GPU (auto: on cuda)",
    "attention": "auto | sdpa | flex: lp's attention backend (auto: sdpa)",
    "copy_mib": "MiB copied per bandwidth repetition (0: 2048 on cuda, 256 on cpu)",
    "batches": "packed steps of B sequences to time too, each after its own prompt_len tokens, a step's tokens "
    "split among them (e.g. 1,8,32; default none)",
    "seed": "seed of the random weights and token ids (0)",
    "out": "results directory (default $LP_CACHE/bench/steps/ARCH-DEVICE-DTYPE-TIME, $LP_CACHE = ~/.cache/lp)",
}


def parse(argv: list[str]) -> Settings:
    """Settings from `key=value` arguments (`--help` prints every key)."""
    return parse_keys(argv, Settings, HELP, "python -m tools.steps", __doc__.splitlines()[0])


def parse_keys(argv: list[str], cls: type, help: dict[str, str], prog: str, description: str):
    """`cls(**values).validate()` from `key=value` arguments, one per field of the dataclass
    `cls` (int, float, list of ints, or str); `--help` prints every key with its line of `help`."""
    fields = dataclasses.fields(cls)
    width = max(len(f.name) for f in fields) + 1
    epilog = "keys:\n" + "\n".join(f"  {f.name:<{width}} {help[f.name]}" for f in fields)
    ap = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("settings", nargs="*", metavar="key=value")
    types = {f.name: f.type for f in fields}
    values: dict = {}
    for item in ap.parse_args(argv).settings:
        key, eq, value = item.partition("=")
        if not eq or key not in types:
            ap.error(f"expected key=value with a key among {', '.join(types)}, got {item!r}")
        try:
            if types[key] == "int":
                values[key] = int(value)
            elif types[key] == "float":
                values[key] = float(value)
            elif types[key].startswith("list"):
                values[key] = [int(v) for v in value.strip("[]").split(",") if v.strip()]
            else:
                values[key] = value
        except ValueError:
            ap.error(f"{key} needs numbers, got {value!r}")
    return cls(**values).validate()


# ----------------------------------------------------------------------------------- model
def build(arch: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A causal LM of `arch` with random weights, created directly on `device` (eval, sdpa)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    spec = ARCHS[arch]
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[spec.family]
    config = config_cls(**spec.config, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    # Every decoder must produce all its new tokens: a random model may emit eos anywhere.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(parameter bytes, bytes a one-token forward reads): all parameters, less an input
    embedding that is not also the output head (a token reads one row of it)."""
    params = {p.data_ptr(): p for p in model.parameters()}.values()  # tied weights once
    total = sum(p.numel() * p.element_size() for p in params)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    skipped = 0 if emb.data_ptr() == head.data_ptr() else emb.numel() * emb.element_size()
    return total, total - skipped


# ----------------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> list[float]:
    """Seconds of each of `reps` calls of `fn` (after `warmup` untimed ones), device work included."""
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def copy_bandwidth(device: torch.device, mib: int, reps: int) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written (median)."""
    src = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = statistics.median(timed(lambda: dst.copy_(src), device, reps, warmup=2))
    return 2 * src.numel() / seconds


def _progress(message: str) -> None:
    """One line per measurement on stderr: a run cut off by a time limit still leaves them."""
    print(f"tools.steps: {message}", file=sys.stderr, flush=True)


def _shape(step: dict) -> str:
    """A ladder step's shape as the tables print it (W, N, G and its size, where the file has it)."""
    size = step.get("step_tokens")
    return f"{step['W']},{step['N']},{step['G']}" + ("" if size is None else f",{size}")


def _percentiles(seconds: list[float]) -> dict:
    p10, p50, p90 = np.percentile(seconds, [10, 50, 90]).tolist()
    return {"median_ms": 1e3 * p50, "p10_ms": 1e3 * p10, "p90_ms": 1e3 * p90}


def step_shapes(tokens: list[int]) -> list[tuple[dict, StepLayout]]:
    """(label, layout) of every timed step: causal blocks of T tokens (logits for one row, as
    W=auto's calibration), then the largest lookahead steps of the ladder (the most pending
    tokens, the tree they leave of the step's size)."""
    causal = {"kind": "causal", "W": None, "N": None, "G": None, "step_tokens": None}
    shapes = [(causal, step_layout(T, 1, 2, range(0), 0)) for T in tokens]
    shapes += [
        (
            {"kind": "ladder", "W": s.W, "N": s.N, "G": s.G, "step_tokens": s.step_tokens},
            step_layout(s.config.max_commit, s.W, s.N, range(s.W), (-1,) * s.config.tree_budget(s.config.max_commit)),
        )
        for s in LADDER
    ]
    return shapes


@torch.inference_mode()
def step_latencies(worker, prompt: torch.Tensor, cfg: Settings, vocab: int) -> tuple[list[dict], dict[int, dict]]:
    """Latency of each step shape after a prefill of `prompt` (steps write KV but never commit,
    so every repetition runs at the same position); and on a GPU with CUDA graphs, each bucket's
    memory (`_graph_memory`)."""
    shapes = step_shapes(cfg.tokens)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    memory: dict[int, dict] = {}
    kv = worker.sequence(len(prompt), max(layout.size for _, layout in shapes))
    worker.prefill(kv, prompt.cpu().numpy())
    rows = []
    for label, layout in shapes:
        ids = torch.randint(0, vocab, (layout.size,), generator=gen).numpy()
        with _graph_memory(worker, memory):  # a bucket is compiled and captured at its first step
            seconds = timed(
                lambda ids=ids, layout=layout: worker.step(kv, layout, ids).argmax().item(),
                worker.device,
                cfg.reps,
                cfg.warmup,
            )
        rows.append({**label, "tokens": layout.size, **_percentiles(seconds)})
        _progress(f"{label['kind']} step, {layout.size} tokens: {rows[-1]['median_ms']:.3f} ms")
    one = next((r["median_ms"] for r in rows if r["tokens"] == 1), None)
    for r in rows:  # cost relative to a one-token step, as W=auto sees it
        r["relative"] = r["median_ms"] / one if one else None
    return rows, memory


@torch.inference_mode()
def packed_latencies(worker, cfg: Settings, memory: dict[int, dict]) -> list[dict]:
    """Latency of packed steps of B sequences (each of `batches`), each sequence after its own
    `prompt_len` committed tokens, a step of T tokens (each of `tokens` from B up) split evenly among
    them as causal blocks, a logits row a token (as a tree's nodes have): the batched step's cost
    per bucket."""
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    rows = []
    for B in cfg.batches:
        with worker.random_sequences([cfg.prompt_len] * B, max(cfg.tokens), gen) as kvs:
            for T in (t for t in cfg.tokens if t >= B):
                step = worker.random_step(kvs, [T // B + (i < T % B) for i in range(B)], gen)
                with _graph_memory(worker, memory):
                    seconds = timed(
                        lambda step=step: worker.run(step)[0].argmax().item(), worker.device, cfg.reps, cfg.warmup
                    )
                rows.append(
                    {
                        "kind": "packed",
                        "sequences": B,
                        "W": None,
                        "N": None,
                        "G": None,
                        "step_tokens": None,
                        "tokens": T,
                        **_percentiles(seconds),
                    }
                )
                _progress(f"packed step, {B} sequences, {T} tokens: {rows[-1]['median_ms']:.3f} ms")
    return rows


@contextmanager
def _graph_memory(worker, memory: dict[int, dict]) -> Iterator[None]:
    """Around work that may capture a bucket (a GPU's fixed-shape steps): the memory a bucket new
    in it kept allocated (its graph's private pool, its static buffers) and its peak above that,
    as `torch.cuda.memory_allocated` and `max_memory_allocated` see them, into `memory`."""
    captures = worker.fixed.capture_seconds if worker.fixed is not None else {}
    if worker.device.type != "cuda":
        yield
        return
    known = set(captures)
    torch.cuda.synchronize(worker.device)
    torch.cuda.reset_peak_memory_stats(worker.device)
    before = torch.cuda.memory_allocated(worker.device)
    yield
    for B in set(captures) - known:
        kept, peak = torch.cuda.memory_allocated(worker.device), torch.cuda.max_memory_allocated(worker.device)
        memory[B] = {"allocated_mib": (kept - before) / 2**20, "peak_mib": (peak - before) / 2**20}
        _progress(f"bucket {B}: {memory[B]['allocated_mib']:.0f} MiB kept, {memory[B]['peak_mib']:.0f} MiB peak")


def decode_rates(model: torch.nn.Module, worker, prompt: list[int], cfg: Settings) -> dict:
    """Decoding tokens/s of lp `mode=ar`, eager and static-cache `generate` (medians of `runs`).

    Decode time only: lp's clock starts after its prefill (the prompt minus its last token),
    so all `new_tokens` come from decode steps; transformers' first forward (prompt -> first
    token) is its prefill, so its rate counts the other new_tokens - 1 over the time after it."""
    from lp.bench.baselines import HFGenerate
    from lp.collective import Collective
    from lp.config import DecodeConfig
    from lp.decode.loop import Decoder

    n = cfg.new_tokens
    lp = Decoder(worker, Collective(device=worker.device), set(), ARCHS[cfg.arch].max_context)
    ar = DecodeConfig(mode="ar", max_new_tokens=n)
    eager = HFGenerate(model, [], 0, label="hf-eager")
    static = HFGenerate(model, [], 0, label="hf-static", cache_implementation="static")

    def run_lp() -> tuple[list[int], float]:
        g = lp.generate(prompt, ar)
        return g.output_ids, metrics.tokens_per_s(g.new_tokens, g.seconds)

    def run_hf(d: HFGenerate) -> Callable[[], tuple[list[int], float]]:
        def go() -> tuple[list[int], float]:
            o = d.generate(prompt, n)
            return o.output_ids, metrics.tokens_per_s(len(o.output_ids) - 1, o.seconds)

        return go

    runners = {"lp_ar": run_lp, "hf_eager": run_hf(eager), "hf_static": run_hf(static)}
    for name, go in runners.items():  # warm-up: kernels, CUDA graphs, static generate's compilation
        _progress(f"{name} warm-up: {go()[1]:.1f} tok/s")
    rates: dict[str, list[float]] = {k: [] for k in runners}
    outputs: dict[str, list[int]] = {}
    for _ in range(cfg.runs):  # interleaved, so drift (clocks, heat) hits every decoder alike
        for name, go in runners.items():
            outputs[name], rate = go()
            rates[name].append(rate)
            _progress(f"{name}: {rate:.1f} tok/s")
    return {
        name: {"tok_s": statistics.median(r), "tok_s_runs": r, "new_tokens": len(outputs[name])}
        for name, r in rates.items()
    } | {
        "outputs_identical": {
            "lp_ar_vs_hf_eager": outputs["lp_ar"] == outputs["hf_eager"],
            "hf_static_vs_hf_eager": outputs["hf_static"] == outputs["hf_eager"],
        }
    }


# ----------------------------------------------------------------------------------- run
def run(cfg: Settings) -> dict:
    """Measure everything and return the result document (not yet written)."""
    device, dtype = cfg.torch_device, cfg.torch_dtype
    copy_mib = cfg.copy_mib or (2048 if device.type == "cuda" else 256)
    bandwidth = copy_bandwidth(device, copy_mib, cfg.reps)  # before the model takes the memory
    _progress(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s on {device_name(device)}")
    t0 = time.perf_counter()
    model = build(cfg.arch, device, dtype, cfg.seed)
    _progress(f"built {cfg.arch} ({dtype}) with random weights in {time.perf_counter() - t0:.1f} s")
    params, read = weight_bytes(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(0, vocab, (cfg.prompt_len,), generator=gen)
    worker = cfg.worker(model)
    steps, memory = step_latencies(worker, prompt.to(device), cfg, vocab)
    one = next((r["median_ms"] for r in steps if r["tokens"] == 1), None)
    for row in packed_latencies(worker, cfg, memory):  # cost relative to one sequence's 1-token step
        steps.append({**row, "relative": row["median_ms"] / one if one else None})
    decode = decode_rates(model, worker, prompt.tolist(), cfg) if cfg.runs else None
    floor_tok_s = bandwidth / read
    lp_tok_s = decode["lp_ar"]["tok_s"] if decode else None
    return {
        "tool": "tools.steps",
        "weights": RANDOM_WEIGHTS,
        "arch": cfg.arch,
        "config": ARCHS[cfg.arch].config | {"family": ARCHS[cfg.arch].family},
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "graphs": cfg.use_graphs,
        "attention": worker.attention,
        # per step size: compile + warm-up + CUDA graph capture, paid once per process
        "capture_seconds": dict(worker.fixed.capture_seconds) if worker.fixed is not None else {},
        "graph_memory": memory,  # per bucket captured on a GPU, MiB
        "settings": dataclasses.asdict(cfg),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "parameters": sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values()),
        "parameter_bytes": params,
        "steps": steps,
        "decode": decode,
        "floor": {
            "copy_mib": copy_mib,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "weight_bytes_per_token": read,
            "seconds_per_token": read / bandwidth,
            "tok_s": floor_tok_s,
        },
        "ratios": None
        if decode is None
        else {
            "lp_ar_over_hf_static": lp_tok_s / decode["hf_static"]["tok_s"],
            "lp_ar_over_hf_eager": lp_tok_s / decode["hf_eager"]["tok_s"],
            "lp_ar_fraction_of_floor": lp_tok_s / floor_tok_s,
        },
    }


def _opt(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def markdown(r: dict) -> str:
    """The result as markdown: who and what measured, the step latency table, the decode rates."""
    f, d = r["floor"], r["decode"]
    lines = [
        f"# lp step cost: {r['arch']} ({r['dtype']}) on {r['device_name']}",
        "",
        f"- weights: **{r['weights']}**",
        f"- device: {r['device']} ({r['device_name']}); torch {r['torch']}; transformers {r['transformers']}; "
        f"dtype {r['dtype']}; lp CUDA graphs: {str(r['graphs']).lower()}; {r['started']}",
        f"- {r['parameters']:,} parameters, {r['parameter_bytes'] / 1e9:.3f} GB; a token's forward reads "
        f"{f['weight_bytes_per_token'] / 1e9:.3f} GB of them",
        f"- steps after a {r['settings']['prompt_len']}-token prefill; median, p10, p90 of "
        f"{r['settings']['reps']} repetitions after {r['settings']['warmup']} warm-up(s)",
        "",
        "| step | W,N,G,size | tokens | median ms | p10 ms | p90 ms | x 1-token step |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in r["steps"]:
        shape = _shape(s) if s["kind"] == "ladder" else ""
        kind = f"packed, {s['sequences']} sequences" if s["kind"] == "packed" else s["kind"]
        lines.append(
            f"| {kind} | {shape} | {s['tokens']} | {s['median_ms']:.3f} | {s['p10_ms']:.3f} | "
            f"{s['p90_ms']:.3f} | {_opt(s['relative'], '.2f')} |"
        )
    if r.get("graph_memory"):
        lines += ["", "CUDA graph memory per bucket (captured with the step of that size first run here):", ""]
        lines += ["| bucket | kept MiB | peak above it MiB |", "|---|---|---|"]
        for B, m in sorted(r["graph_memory"].items(), key=lambda x: int(x[0])):
            lines.append(f"| {B} | {m['allocated_mib']:.0f} | {m['peak_mib']:.0f} |")
    if d is None:
        lines += [
            "",
            f"- weight-read floor: {1e3 * f['seconds_per_token']:.3f} ms per token; decoders not run (runs=0)",
        ]
        return "\n".join(lines) + "\n"
    n = r["settings"]["new_tokens"]
    lines += [
        "",
        f"Decoding, {n} new tokens after the {r['settings']['prompt_len']}-token prompt (decode time only; median "
        f"of {r['settings']['runs']} runs after a warm-up):",
        "",
        "| decoder | tok/s | runs |",
        "|---|---|---|",
    ]
    names = {
        "lp_ar": "lp `mode=ar`",
        "hf_eager": "transformers `generate` (eager)",
        "hf_static": "transformers `generate` (static cache)",
    }
    for key, name in names.items():
        lines.append(f"| {name} | {d[key]['tok_s']:.1f} | {', '.join(f'{x:.1f}' for x in d[key]['tok_s_runs'])} |")
    ratios = r["ratios"]
    lines += [
        "",
        f"- copy bandwidth: {f['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (bytes read + written, {f['copy_mib']} "
        f"MiB buffer, median)",
        f"- weight-read floor: {1e3 * f['seconds_per_token']:.3f} ms per token = {f['tok_s']:.1f} tok/s",
        f"- lp `mode=ar`: {ratios['lp_ar_fraction_of_floor']:.1%} of the floor's tok/s; "
        f"{ratios['lp_ar_over_hf_static']:.2f}x static-cache `generate`, {ratios['lp_ar_over_hf_eager']:.2f}x eager",
        f"- outputs identical (informative only, random weights): lp vs eager "
        f"{str(d['outputs_identical']['lp_ar_vs_hf_eager']).lower()}, static vs eager "
        f"{str(d['outputs_identical']['hf_static_vs_hf_eager']).lower()}",
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> Path:
    """Step latency (median, p10-p90 band) against step tokens, the ladder's shapes labelled,
    and the weight-read floor as a line."""
    from lp.bench.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    causal = [s for s in r["steps"] if s["kind"] == "causal"]
    ladder = [s for s in r["steps"] if s["kind"] == "ladder"]
    xs = [s["tokens"] for s in causal]
    ax.plot(xs, [s["median_ms"] for s in causal], marker="o", label="causal block of T tokens (median)")
    ax.fill_between(xs, [s["p10_ms"] for s in causal], [s["p90_ms"] for s in causal], alpha=0.25, label="p10-p90")
    ax.scatter(
        [s["tokens"] for s in ladder],
        [s["median_ms"] for s in ladder],
        marker="D",
        color="C3",
        label="W=auto ladder step (W,N,G,size)",
        zorder=3,
    )
    for B in sorted({s["sequences"] for s in r["steps"] if s["kind"] == "packed"}):
        packed = [s for s in r["steps"] if s["kind"] == "packed" and s["sequences"] == B]
        ax.plot(
            [s["tokens"] for s in packed],
            [s["median_ms"] for s in packed],
            marker="x",
            ls=":",
            label=f"packed: {B} sequences",
        )
    for s in ladder:
        ax.annotate(
            _shape(s),
            (s["tokens"], s["median_ms"]),
            fontsize=7,
            xytext=(3, -9),
            textcoords="offset points",
        )
    ax.axhline(
        1e3 * r["floor"]["seconds_per_token"],
        color="grey",
        ls="--",
        lw=0.8,
        label="weight-read floor (weights / copy bandwidth)",
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("step tokens")
    ax.set_ylabel("step latency (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(
        f"{r['arch']} {r['dtype']} on {r['device_name']}\nrandom weights, timing only; "
        f"torch {r['torch']}, transformers {r['transformers']}",
        fontsize=9,
    )
    return _save(plt, fig, path)


def write(
    r: dict, out: Path, stem: str, markdown: Callable[[dict], str], plot: Callable[[dict, Path], Path]
) -> list[Path]:
    """OUT/STEM.json, .md and .png of one tool's results."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(clean(r), indent=1, allow_nan=False) + "\n")
    (out / f"{stem}.md").write_text(markdown(r))
    return [out / f"{stem}.json", out / f"{stem}.md", plot(r, out / f"{stem}.png")]


def tool_main(
    name: str,
    argv: list[str],
    parse: Callable,
    run: Callable[..., dict],
    markdown: Callable[[dict], str],
    plot: Callable[[dict, Path], Path],
) -> int:
    """The command line of a timing tool (`python -m lp.bench.NAME`): parse, run, write the results
    under `out` (default $LP_CACHE/bench/NAME/ARCH-DEVICE-DTYPE-TIME), print the markdown; an
    LPError is one `lp: error:` line."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        cfg = parse(argv)
        r = run(cfg)
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    out = (
        Path(cfg.out)
        if cfg.out
        else cache_dir() / "bench" / name / (f"{cfg.arch}-{r['device']}-{r['dtype']}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    paths = write(r, out, name, markdown, plot)
    print(markdown(r))
    print(f"lp.bench.{name}: results in {', '.join(map(str, paths))}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return tool_main("steps", sys.argv[1:] if argv is None else argv, parse, run, markdown, plot)


if __name__ == "__main__":
    sys.exit(main())

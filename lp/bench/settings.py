"""`lp.bench`'s settings: the keys of configs/bench.yaml, read and checked (one LPError line each)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from lp.bench.decoders import KINDS
from lp.bench.shapes import parse_lookahead
from lp.engine.kernel_choice import check_choice, requested
from lp.errors import LPError
from lp.lookahead.memory import check_budget
from lp.mesh import check_tp


@dataclass
class PromptKeys:
    """The keys of the model and the prompts, which `lp.bench` and `lp.bench.sweep` share
    (`model` is the model's name or path)."""

    model: str = "smollm2-135m"
    dtype: str = "float32"
    dataset: str = "spec_bench"
    prompts: str | None = None
    per_category: int | None = None
    categories: list[str] | None = None
    limit: int | None = None
    chat: bool | None = None

    @classmethod
    def values(cls, cfg: Mapping) -> dict:
        """The keys of `cls` in a composed config, as plain Python values (hydra's `model`
        group, {name, dtype}, gives `model` and `dtype`)."""
        known = {f.name for f in fields(cls)}
        data = {}
        for k, v in dict(cfg).items():
            if k == "model" and isinstance(v, Mapping):
                data["model"] = v["name"]
                data.setdefault("dtype", v.get("dtype", "float32"))
            elif k in known:
                data[k] = list(v) if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig" else v
        return data


@dataclass
class Settings(PromptKeys):
    """The keys of configs/bench.yaml."""

    decoders: list[str] = field(default_factory=lambda: ["hf-greedy", "lp-ar", "lp", "hf-prompt-lookup"])
    baseline: str | None = "hf-greedy"
    reference: str | None = "hf-greedy"
    W: int = 5
    N: int = 3
    G: int = 5
    lookahead: list[str] | None = None
    max_new_tokens: int = 128
    seed: int = 0
    pool_from_prompt: bool = True
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    tp_impl: str = "dtensor"
    tp: int | str = "auto"
    pp_balance: bool = True
    warmup: int = 1
    warmup_tokens: int = 16
    threads: int | None = None
    local_threads: int | None = None
    device: str = "auto"
    graphs: bool | str = "auto"
    compile: bool | str = "auto"
    attention: str = "auto"
    kernels: str | None = None
    max_seq_len: int | None = None
    backend: str = "auto"
    draft_memory: int = 0
    nproc: int = 1  # read by the command line (lp/frontend/cli.py), which starts the ranks itself
    timeout_s: float = 600.0
    out_dir: str = "bench-results/latest"
    tag: str | None = None
    plots: bool = True
    progress: bool = True
    print_table: bool = True

    @classmethod
    def from_mapping(cls, cfg: Mapping) -> Settings:
        s = cls(**cls.values(cfg))
        s.validate()
        return s

    def validate(self) -> None:
        check_budget(self.draft_memory)
        for key, low in (
            ("max_new_tokens", 1),
            ("warmup", 0),
            ("warmup_tokens", 1),
            ("W", 1),
            ("N", 2),
            ("G", 0),
            ("prompt_lookup_num_tokens", 1),
            ("max_matching_ngram_size", 1),
        ):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise LPError(f"{key} must be an integer >= {low}, got {v!r}")
        if not self.decoders:
            raise LPError("decoders is empty")
        unknown = [d for d in self.decoders if d not in KINDS]
        if unknown:
            raise LPError(f"unknown decoder '{unknown[0]}'; known: {', '.join(KINDS)}")
        if self.tp_impl not in ("dtensor", "hf", "lp"):
            raise LPError(f"tp_impl must be dtensor, hf or lp, got {self.tp_impl!r}")
        check_tp(self.tp)
        check_choice(requested(self.kernels))
        try:
            self.lookahead_configs()
        except ValueError as e:
            raise LPError(str(e)) from None

    def lookahead_configs(self) -> list[dict]:
        if self.lookahead:
            return [parse_lookahead(s) for s in self.lookahead]
        return [dict(W=self.W, N=self.N, G=self.G)]

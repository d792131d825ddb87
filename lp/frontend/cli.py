"""What `python -m lp.generate` and `python -m lp.bench` share: the hydra entry point, help
rendered from the yaml files' comments, and one `lp: error:` line for every bad input.

The yaml files in configs/ are the single source of truth for the keys: their defaults are
the config, and their comments are the help (`hydra.help.template: ${lp_help:NAME}`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from lp.errors import LPError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ERROR_EXIT = 2  # lp rejected the input or the run (Python's own crashes exit 1)
HELP_WIDTH = 24  # the KEY=DEFAULT column of --help
RANK_GRACE_S = 3.0  # a non-zero rank waits this long before exiting on an error (see fail())

_KEY = re.compile(r"^(?P<key>[A-Za-z_]\w*):\s*(?P<value>[^#]*?)\s*(?:#\s?(?P<doc>.*))?$")
_GROUP = re.compile(r"^\s+-\s+(?P<key>[A-Za-z_]\w*):\s*(?P<value>[^#\s]+)\s*(?:#\s?(?P<doc>.*))?$")


def model_names() -> list[str]:
    """The named models of the `model` config group (configs/model/NAME.yaml)."""
    return sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))


def keys(name: str) -> list[tuple[str, str, str | None]]:
    """(key, default as written, comment) for every key of configs/NAME.yaml, in file order,
    including config groups from its `defaults` list (not hydra's own)."""
    found = []
    for line in (CONFIGS / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        m = _GROUP.match(line) or _KEY.match(line)
        if m and m["key"] not in ("defaults", "hydra") and not line.lstrip().startswith("- override"):
            found.append((m["key"], m["value"], m["doc"]))
    return found


def help_text(name: str) -> str:
    """`--help` for configs/NAME.yaml: its header comment (usage, examples), then every key
    with its default and comment, under the file's `# --- section` titles."""
    lines = (CONFIGS / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    body = False
    width = min(max(len(f"{k}={v}") for k, v, _ in keys(name)), HELP_WIDTH)
    for line in lines:
        if line.startswith("hydra:"):
            break
        if line.startswith("defaults:"):
            body = True
            out += ["", "Keys (KEY=DEFAULT, what it does):"]
            continue
        m = _GROUP.match(line) or _KEY.match(line)
        if m and not line.lstrip().startswith("- override"):
            docs = [m["doc"] or ""]
            if m["key"] == "model":
                docs.append(f"named: {', '.join(model_names())}; model.dtype=float32 | bfloat16 | float16")
            setting = f"{m['key']}={m['value']}"
            if len(setting) > width:  # a long default gets a line of its own
                out.append(f"  {setting}")
                setting = ""
            out += [f"  {setting if i == 0 else '':<{width}}  {doc}".rstrip() for i, doc in enumerate(docs)]
        elif line.startswith("# --- "):
            out += ["", line[6:].capitalize() + ":"]
        elif line.startswith("#"):
            out.append(("  " if body else "") + line[2:])
        elif not line.strip() and not body:
            out.append("")
    return "\n".join(out).strip("\n") + "\n"


# hydra renders its help with string.Template: `$` must be doubled to print as itself.
OmegaConf.register_new_resolver("lp_help", lambda name: help_text(name).replace("$", "$$"), replace=True)


def is_main_rank() -> bool:
    """True on rank 0 of a torchrun launch, and when no launcher describes ranks."""
    return os.environ.get("RANK", "0") == "0"


def fail(message: str) -> None:
    """Exit with one `lp: error:` line, printed by rank 0 only.

    Every rank reaches the same error on the same input; under torchrun the first rank to exit
    makes torchrun stop the others, so the other ranks wait a moment for rank 0 to report."""
    if is_main_rank():
        print(f"lp: error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(RANK_GRACE_S)
    sys.exit(ERROR_EXIT)


def _one_line(e: BaseException) -> str:
    """hydra's and omegaconf's messages span lines (with hints about HYDRA_FULL_ERROR)."""
    if isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError)):
        return f"unknown key '{e.__cause__.full_key}'"
    return " ".join(str(e).split("\n")[0].split())


def _model_override(argv: list[str]) -> list[str]:
    """`model=NAME` where NAME has no yaml in configs/model/ means `model.name=NAME`: a path or
    hub id, or an unknown name that lp.models then reports in one line."""
    groups = model_names()
    return [f"model.name={a[6:]}" if a.startswith("model=") and a[6:] not in groups else a for a in argv]


def quiet_third_party() -> None:
    """No progress bars or warnings from transformers and torch.distributed unless an error."""
    import logging
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)


def _nproc(argv: list[str]) -> int:
    """The `nproc=P` of the command line (1 when absent; checked by the config otherwise)."""
    for a in argv:
        if a.startswith("nproc="):
            try:
                return int(a[6:])
            except ValueError:
                fail(f"nproc must be an integer >= 1, got {a[6:]!r}")
    return 1


def launch(module: str, nproc: int, argv: list[str]) -> int:
    """Run `module` on `nproc` local ranks under torchrun and return its exit status. When a
    rank refuses with lp's error line, what torchrun prints after it (its report of the failed
    ranks, a traceback of its own) says nothing more, so it is dropped and lp's line is the
    last one; a crash keeps torchrun's whole report."""
    if nproc < 1:
        fail(f"nproc must be an integer >= 1, got {nproc}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *argv,
    ]
    env = {"OMP_NUM_THREADS": "1", **os.environ}  # torchrun's own default, without its banner
    error = None
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, bufsize=1, env=env) as p:
        for line in p.stderr:
            if error is None and line.startswith("lp: error:"):
                error = line
            elif error is None:
                sys.stderr.write(line)
    if error is not None:
        sys.stderr.write(error)
        return ERROR_EXIT
    return p.returncode


def entry(config_name: str, task: Callable[[DictConfig], None], module: str | None = None) -> Callable[[], None]:
    """The `main()` of a CLI: hydra composes configs/CONFIG_NAME.yaml with the command line
    and calls `task`; an LPError from it, or a hydra or omegaconf error about the command line,
    ends the process through `fail`. `module` (default `lp.CONFIG_NAME`) is what `nproc=P`
    starts on P ranks."""

    def job(cfg: DictConfig) -> None:
        try:
            task(cfg)
        except LPError as e:  # here, not past hydra's job runner, which would print its own line
            fail(str(e))

    hydra_main = hydra.main(config_path=str(CONFIGS), config_name=config_name, version_base=None)(job)

    def main() -> None:
        nproc = _nproc(sys.argv[1:])
        if nproc != 1 and "RANK" not in os.environ:  # lp starts the ranks itself
            sys.exit(launch(module or f"lp.{config_name}", nproc, sys.argv[1:]))
        # hydra then raises its errors to us instead of printing them with a hint.
        os.environ["HYDRA_FULL_ERROR"] = "1"
        sys.argv[1:] = _model_override(sys.argv[1:])
        try:
            hydra_main()
        except (HydraException, OmegaConfBaseException) as e:
            fail(f"{_one_line(e)}; see --help for the keys")

    return main

"""`python -m lp.bench [key=value ...]`, or `torchrun --nproc_per_node P -m lp.bench ...`.
Keys: configs/bench.yaml (`python -m lp.bench --help`). Writes OUT_DIR/rows.jsonl,
summary.csv, summary.json, meta.json, config.yaml and categories.png (rank 0), and prints the
summary table."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lp.frontend import cli


def run(cfg: DictConfig) -> None:
    """The benchmark job (lp/bench/runner.py), with its config saved next to its results."""
    cli.quiet_third_party()
    from lp.bench.runner import run as bench

    res = bench(OmegaConf.to_container(cfg, resolve=True))
    if res is not None:
        Path(res["out_dir"], "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        print(f"lp.bench: results in {res['out_dir']}", file=sys.stderr)


main = cli.entry("bench", run)

if __name__ == "__main__":
    main()

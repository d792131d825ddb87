"""`python -m lp.bench [key=value ...]`, or `torchrun --nproc_per_node P -m lp.bench ...`.
Keys: configs/bench.yaml. Writes OUT_DIR/rows.jsonl, summary.csv, summary.json, meta.json,
config.yaml and categories.png (rank 0), and prints the summary table."""
from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from lp.errors import LPError

CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")


@hydra.main(config_path=CONFIGS, config_name="bench", version_base=None)
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    from lp.bench.runner import run

    try:
        res = run(OmegaConf.to_container(cfg, resolve=True))
    except LPError as e:
        sys.exit(f"lp: error: {e}")
    if res is not None:
        Path(res["out_dir"], "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        print(f"lp.bench: results in {res['out_dir']}", file=sys.stderr)


if __name__ == "__main__":
    main()

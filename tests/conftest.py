"""Registers the unit tests' fixtures, which live in helpers.py with the helpers."""

import torch
from helpers import cli_env, tiny_model_dir, tiny_models  # noqa: F401  (fixtures)

torch.set_num_threads(1)

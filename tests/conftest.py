"""Registers the unit tests' fixtures, which live in helpers.py with the helpers."""

import importlib.util

import torch
from helpers import cli_env, tiny_model_dir, tiny_models  # noqa: F401  (fixtures)

torch.set_num_threads(1)

# The server is the optional `serve` extra (`lp[test]` installs it): where it is absent, as on a
# bare CUDA image running `pytest -m cuda`, the modules that import it are not collected.
SERVE = ("fastapi", "uvicorn")
collect_ignore = [] if all(map(importlib.util.find_spec, SERVE)) else ["test_cli_help.py", "test_serve_cli.py"]

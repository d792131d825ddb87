"""Registers the unit tests' fixtures, which live in unit_helpers.py with the helpers."""

from unit_helpers import *  # noqa: F401,F403

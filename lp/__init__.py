"""lp: exact, draft-free lookahead decoding with Lookahead Parallelism."""

from lp.config import DecodeConfig
from lp.errors import LPError

__all__ = ["LP", "DecodeConfig", "LPError", "Result"]


def __getattr__(name: str):
    # Lazy: `python -m lp.models` must not import lp.models through lp.frontend.runtime first.
    if name in ("LP", "Result"):
        from lp.frontend import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'lp' has no attribute {name!r}")

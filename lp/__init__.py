"""lp: exact, draft-free lookahead decoding with Lookahead Parallelism."""
from lp.config import DecodeConfig
from lp.errors import LPError
from lp.runtime import LP, Result

__all__ = ["LP", "DecodeConfig", "LPError", "Result"]

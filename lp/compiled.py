"""numba's on-disk cache for a compiled loop that calls other modules' loops.

numba keys its cache of a function by that function's own source file, not by the files of the
loops it calls: an edit there would leave the caller's cached machine code stale. It also keys a
cached closure by the values of the closure's variables; so a module makes such a loop inside a
function of `sources_digest(modules it calls)` and reads the digest in the loop's body, and an
edit in any of those modules recompiles the loop (lp/decode/plan.py, lp/decode/policy.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType


def sources_digest(*modules: ModuleType) -> str:
    """The sha256 of the modules' source files."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


__all__ = ["sources_digest"]

"""lp's compiled host code: the `compiled` decorator and the numba type of a compiled state object.

A decode's host work runs loops over a few hundred rows and nodes a step, which Python would
take a microsecond each for, so it is compiled with numba (wheels: no toolchain at install time).
Compiling all of it takes tens of seconds, so numba caches the machine code on disk, beside each
module (__pycache__). numba keys a cached function by its own source file only, while a function
inlines the compiled functions of the other modules it calls: an edit there would leave its cached
code stale. So lp keeps a digest of every module that compiles code (those that import this one)
with the cache, and drops all of lp's cached code when it changes: an edit compiles anew, once.
The cache is beside the modules, or under `NUMBA_CACHE_DIR` where that is set (a folder per
source folder, named as numba names it).

State that the compiled code keeps between steps (the text index, the n-gram pool, ...) is a
`State`: a numba StructRef, a mutable record of arrays and numbers that compiled code reads and
writes by field name and Python holds as one object (one cheap argument for a compiled call).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba import config, njit, types
from numba.core.caching import UserProvidedCacheLocator

_PACKAGE = Path(__file__).parent
_IMPORT = b"from lp.jit import"
STAMP = "numba-sources.sha256"  # the digest the cached code was compiled from, in the package's cache folder


def _sources_digest(package: Path) -> str:
    """A digest of this module and of every module of `package` that imports it."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        source = path.read_bytes()
        if _IMPORT in source or path.name == "jit.py" and path.parent == package:
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + source)
    return digest.hexdigest()


def cache_folder(folder: Path, cache_dir: str | None) -> Path:
    """Where numba keeps the machine code of the modules in `folder`: its `__pycache__`, or with
    `cache_dir` (NUMBA_CACHE_DIR) the folder numba names after it there."""
    if not cache_dir:
        return folder / "__pycache__"
    return Path(cache_dir) / UserProvidedCacheLocator.get_suitable_cache_subpath(str(folder / "any.py"))


def drop_stale_code(package: Path, cache_dir: str | None) -> bool:
    """Remove `package`'s cached machine code if it was compiled from other sources (where the
    cache is lp's to write: an installed, read-only lp does not change); whether it did."""
    package = Path(os.path.abspath(package))
    digest = _sources_digest(package)
    stamp = cache_folder(package, cache_dir) / STAMP
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return False
        for folder in {path.parent for path in package.rglob("*.py")}:
            for cached in cache_folder(folder, cache_dir).glob("*.nb[ci]"):
                cached.unlink(missing_ok=True)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        return False
    return True


drop_stale_code(_PACKAGE, config.CACHE_DIR)
compiled = njit(cache=True)  # a function compiled by numba (nopython), its machine code cached


@compiled
def bit_length(x: int) -> int:
    """`x.bit_length()` for x >= 0 (numba has no int.bit_length): hash tables are sized
    `1 << bit_length(n)`, the least power of two above n."""
    bits = 0
    while x:
        x >>= 1
        bits += 1
    return bits


class State(types.StructRef):
    """The numba type of a compiled state object: its fields' literal types are widened, so a field
    made with the value 0 holds any int64 later."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


__all__ = ["STAMP", "State", "bit_length", "cache_folder", "compiled", "drop_stale_code"]

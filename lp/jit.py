"""lp's compiled host code: the `compiled` decorator and the numba type of a compiled state object.

A decode's host work runs loops over a few hundred rows and nodes a step, which Python would
take a microsecond each for, so it is compiled with numba (wheels: no toolchain at install time).
Compiling all of it takes tens of seconds, so numba caches the machine code on disk, beside each
module (__pycache__). numba keys a cached function by its own source file only, while a function
inlines the compiled functions of the other modules it calls: an edit there would leave its cached
code stale. So lp keeps a digest of every module that compiles code (those that import this one)
with the cache, and drops all of lp's cached code when it changes: an edit compiles anew, once.

State that the compiled code keeps between steps (the text index, the n-gram pool, ...) is a
`State`: a numba StructRef, a mutable record of arrays and numbers that compiled code reads and
writes by field name and Python holds as one object (one cheap argument for a compiled call).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from numba import njit, types

_PACKAGE = Path(__file__).parent
_IMPORT = b"from lp.jit import"
_STAMP = _PACKAGE / "__pycache__" / "numba-sources.sha256"  # the digest the cached code was compiled from


def _sources_digest() -> str:
    """A digest of this module and of every module of lp that imports it."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source = path.read_bytes()
        if _IMPORT in source or path == Path(__file__):
            digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + source)
    return digest.hexdigest()


def _drop_stale_code() -> None:
    """Remove lp's cached machine code if it was compiled from other sources (where the cache is
    lp's to write: an installed, read-only lp does not change)."""
    digest = _sources_digest()
    try:
        if _STAMP.exists() and _STAMP.read_text() == digest:
            return
        for cached in _PACKAGE.rglob("__pycache__/*.nb[ci]"):
            cached.unlink(missing_ok=True)
        _STAMP.parent.mkdir(exist_ok=True)
        _STAMP.write_text(digest)
    except OSError:
        return


_drop_stale_code()
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


__all__ = ["State", "bit_length", "compiled"]

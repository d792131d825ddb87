"""lp's compiled host code: the `compiled` decorator and the numba type of a compiled state object.

A decode's host work runs loops over a few hundred rows and nodes a step, which Python would
take a microsecond each for, so it is compiled with numba (wheels: no toolchain at install time).
Compiling all of it takes tens of seconds, so the machine code is cached on disk. numba keys a
cached function by its own source file only, while a function inlines the compiled functions of
the other modules it calls: an edit there would leave its cached code stale. So lp's compiled
functions are cached in one directory per version of the modules that hold them (those that
import this one): an edit to any of them compiles them all anew, once.

State that the compiled code keeps between steps (the text index, the n-gram pool, ...) is a
`State`: a numba StructRef, a mutable record of arrays and numbers that compiled code reads and
writes by field name and Python holds as one object (one cheap argument for a compiled call).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numba
from numba import njit, types

from lp.models import cache_dir

_PACKAGE = Path(__file__).parent
_IMPORT = b"from lp.jit import"
STALE_DAYS = 7  # cache directories of other versions unused this long are removed


def _sources_digest() -> str:
    """A digest of this module and of every module of lp that imports it."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        source = path.read_bytes()
        if _IMPORT in source or path == Path(__file__):
            digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + source)
    return digest.hexdigest()[:16]


def _cache_root() -> Path:
    """This version's numba cache directory (made, and the stale ones of other versions removed)."""
    versions = cache_dir() / "numba"
    mine = versions / _sources_digest()
    if not mine.is_dir():
        mine.mkdir(parents=True, exist_ok=True)
        for other in versions.iterdir():
            if other != mine and time.time() - other.stat().st_mtime > STALE_DAYS * 86400:
                shutil.rmtree(other, ignore_errors=True)
    return mine


_CACHE = str(_cache_root())
F = TypeVar("F", bound=Callable)


def compiled(fn: F) -> F:
    """`fn` compiled by numba (nopython), its machine code cached in this version's directory."""
    given = numba.config.CACHE_DIR  # numba picks a function's cache directory when it is decorated
    numba.config.CACHE_DIR = _CACHE
    try:
        return njit(cache=True)(fn)
    finally:
        numba.config.CACHE_DIR = given


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

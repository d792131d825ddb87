"""lp's compiled host code: the `compiled` decorator and the numba type of a compiled state object.

A decode's host work runs loops over a few hundred rows and nodes a step, which Python would
take a microsecond each for, so it is compiled with numba (wheels: no toolchain at install time).
Compiling all of it takes tens of seconds, so numba caches the machine code on disk, beside each
module (__pycache__). numba keys a cached function by its own source file only, while a function
inlines the compiled functions of the other modules it calls: an edit there would leave its cached
code stale. So lp keeps a digest of every module that compiles code (those that import this one)
with the cache, and drops all of lp's cached code when it changes: an edit compiles anew, once.
numba keeps the cache under `NUMBA_CACHE_DIR` where that is set, else beside the modules, else (a
read-only install) in the user's cache, whichever it can write first; each place has its digest.

State that the compiled code keeps between steps (the text index, the n-gram pool, ...) is a
`State`: a numba StructRef, a mutable record of arrays and numbers that compiled code reads and
writes by field name and Python holds as one object (one cheap argument for a compiled call).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba import config, njit, types

_PACKAGE = Path(__file__).parent
_IMPORT = b"from lp.jit import"
STAMP = "numba-sources.sha256"  # the digest the cached code was compiled from, in each cache place


def _sources_digest(package: Path, paths: list[Path]) -> str:
    """A digest of this module and of every module of `package` (its `paths`) that imports it."""
    digest = hashlib.sha256()
    for path in paths:
        source = path.read_bytes()
        if _IMPORT in source or (path.name == "jit.py" and path.parent == package):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + source)
    return digest.hexdigest()


def cache_places(folder: Path, cache_dir: str | None) -> list[Path]:
    """Every folder where numba may keep the machine code of the modules in `folder`, in the order
    it tries them (it takes the first it can write): under `cache_dir` (NUMBA_CACHE_DIR) where set,
    beside them (`__pycache__`), in the user's cache; as numba's own locators name them."""
    # imported here: a numba that moves them turns the guard off, not lp's import
    from numba.core.caching import InTreeCacheLocator, UserProvidedCacheLocator, UserWideCacheLocator

    module = str(folder / "any.py")
    places = [Path(L(cache_places, module).get_cache_path()) for L in (InTreeCacheLocator, UserWideCacheLocator)]
    return (
        [Path(cache_dir) / UserProvidedCacheLocator.get_suitable_cache_subpath(module), *places]
        if cache_dir
        else places
    )


def drop_stale_code(package: Path, cache_dir: str | None) -> bool:
    """Remove `package`'s cached machine code, in each place numba may keep it, where it was
    compiled from other sources (the place's stamp differs); whether any was. The first place lp
    can write gets the stamp (numba takes the first it can write), a later one only where it
    holds code or a stamp. A place lp cannot write, or a numba that names its places otherwise,
    is left as it is: the guard must never stop lp from loading."""
    dropped = settled = False
    try:
        package = Path(os.path.abspath(package))
        paths = sorted(package.rglob("*.py"))
        digest = _sources_digest(package, paths)
        places = {folder: cache_places(folder, cache_dir) for folder in {package, *(path.parent for path in paths)}}
    except (OSError, ImportError, AttributeError, TypeError):
        return False
    for i, place in enumerate(places[package]):
        stamp = place / STAMP
        try:
            stamped = stamp.exists()
            current = stamped and stamp.read_text() == digest
            if not current:
                cached = [
                    path
                    for by_folder in places.values()
                    if by_folder[i].is_dir()
                    for path in by_folder[i].glob("*.nb[ci]")
                ]
                if cached or stamped or not settled:
                    for path in cached:
                        path.unlink(missing_ok=True)
                    dropped = dropped or bool(cached)
                    stamp.parent.mkdir(parents=True, exist_ok=True)
                    stamp.write_text(digest)
                    current = True
            settled = settled or current
        except (OSError, ValueError):
            continue
    return dropped


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


__all__ = ["STAMP", "State", "bit_length", "cache_places", "compiled", "drop_stale_code"]

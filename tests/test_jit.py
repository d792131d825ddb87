"""lp.jit's cache guard: cached machine code is dropped when a module that compiles code changes,
wherever numba keeps it (beside the modules, or under NUMBA_CACHE_DIR), and kept otherwise."""

import os
import subprocess
import sys

import pytest

from lp.jit import cache_folder, drop_stale_code


@pytest.mark.parametrize("under", [False, True])
def test_stale_code_is_dropped_where_numba_keeps_it(tmp_path, under):
    package, cache_dir = tmp_path / "pkg", str(tmp_path / "cache") if under else None
    (package / "sub").mkdir(parents=True)
    (package / "jit.py").write_text("x = 1\n")
    (package / "sub" / "a.py").write_text("from lp.jit import compiled\n")
    (package / "sub" / "plain.py").write_text("y = 2\n")
    folder = cache_folder(package / "sub", cache_dir)

    def cached():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "a.f-1.py311.nbi").write_text("")
        return folder / "a.f-1.py311.nbi"

    f = cached()
    assert drop_stale_code(package, cache_dir) and not f.exists()  # compiled from unknown sources
    f = cached()
    assert not drop_stale_code(package, cache_dir) and f.exists()  # the same sources
    (package / "sub" / "plain.py").write_text("y = 3\n")
    assert not drop_stale_code(package, cache_dir) and f.exists()  # a module that compiles nothing
    (package / "sub" / "a.py").write_text("from lp.jit import compiled\n# edited\n")
    assert drop_stale_code(package, cache_dir) and not f.exists()


def test_cache_folder_is_where_numba_writes(tmp_path):
    (tmp_path / "mod.py").write_text("from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(tmp_path)}
    subprocess.run([sys.executable, "-c", "import mod; mod.f(1)"], env=env, check=True, cwd=tmp_path)
    assert list(cache_folder(tmp_path, str(cache_dir)).glob("mod.f-*.nbi"))

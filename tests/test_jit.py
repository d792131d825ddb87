"""lp.jit's cache guard: cached machine code is dropped when a module that compiles code changes,
in every place numba may keep it (under NUMBA_CACHE_DIR, beside the modules, the user's cache),
and kept otherwise; a module whose compiled code inlines another's runs the other's new code."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.caching import InTreeCacheLocator, UserWideCacheLocator

import lp.jit
from lp.jit import STAMP, cache_places, drop_stale_code


@pytest.mark.parametrize("under", [False, True])
def test_stale_code_is_dropped_where_it_is_kept(tmp_path, under):
    package, cache_dir = tmp_path / "pkg", str(tmp_path / "cache") if under else None
    (package / "sub").mkdir(parents=True)
    (package / "jit.py").write_text("x = 1\n")
    (package / "sub" / "a.py").write_text("from lp.jit import compiled\n")
    (package / "sub" / "plain.py").write_text("y = 2\n")
    folder = cache_places(package / "sub", cache_dir)[0]

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
    for edited in (package / "sub" / "a.py", package / "jit.py"):
        edited.write_text(edited.read_text() + "# edited\n")
        assert drop_stale_code(package, cache_dir) and not f.exists()
        f = cached()


def test_places_are_numbas(tmp_path):
    """The places in numba's order, each where its locator puts a module's code."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import m
    finally:
        sys.path.remove(str(tmp_path))
    mine, theirs = cache_places(tmp_path, str(tmp_path / "c")), cache_places(tmp_path, None)
    assert mine[1:] == theirs and mine[0].parent == tmp_path / "c"
    assert [str(p) for p in theirs] == [
        InTreeCacheLocator(m.f, str(module)).get_cache_path(),
        UserWideCacheLocator(m.f, str(module)).get_cache_path(),
    ]


def _run(toy: Path, cache_dir: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update({"PYTHONPATH": os.pathsep.join([str(toy), str(Path(lp.jit.__file__).parents[1])])})
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    code = (
        "import sys; from pathlib import Path; from numba import config; from lp.jit import drop_stale_code; "
        "drop_stale_code(Path(sys.argv[1]), config.CACHE_DIR); import a; print(a.f(1))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(toy)], env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.parametrize("cache", ["beside", "NUMBA_CACHE_DIR", "NUMBA_CACHE_DIR unusable"])
def test_an_edit_reaches_the_code_that_inlines_it(tmp_path, cache):
    """a.f calls (inlines) b.g: after b.g changes, a.f's cached code is not run again, wherever
    numba keeps it (an unusable NUMBA_CACHE_DIR: beside the modules)."""
    toy = tmp_path / "toy"
    toy.mkdir()
    (toy / "a.py").write_text(
        "from b import g\n\nfrom lp.jit import compiled\n\n\n@compiled\ndef f(x):\n    return g(x) + 1\n"
    )
    (toy / "b.py").write_text("from lp.jit import compiled\n\n\n@compiled\ndef g(x):\n    return x\n")
    cache_dir = {"beside": None, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CACHE_DIR unusable": None}[cache]
    if cache == "NUMBA_CACHE_DIR unusable":
        cache_dir = str(tmp_path / "a file")
        Path(cache_dir).write_text("")
    assert _run(toy, cache_dir) == "2\n"
    (toy / "b.py").write_text((toy / "b.py").read_text().replace("return x", "return x + 1"))
    assert _run(toy, cache_dir) == "3\n"


def test_lp_stamps_numbas_cache_dir(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", "import lp.jit"], env=env, check=True)
    assert (cache_places(Path(os.path.abspath(lp.jit.__file__)).parent, str(tmp_path))[0] / STAMP).exists()

"""labkit.jit, the one numba switch: the options reach numba, LABKIT_JIT=0 leaves plain functions, a package's
cache folder follows its compiled sources, and stale cache folders go at the first compile, never at import."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkit import jit
from labkit.quant import kernels_jit
from labkit.unified_memory import loop, policies

from .refusals import assert_refused

ROOT = Path(__file__).resolve().parent.parent


def test_this_process_compiles_unless_told_not_to():
    assert jit.ENABLED == (jit.numba is not None and os.environ.get("LABKIT_JIT", "1") != "0")
    assert (jit.prange is range) != jit.ENABLED


def test_the_options_reach_numba():
    if not jit.ENABLED:
        pytest.skip("numba is not in use")
    paging, kernel, helper = loop.replay.targetoptions, kernels_jit.blocked.targetoptions, policies.touch.targetoptions
    assert paging["nogil"] and kernel["nogil"] and not paging.get("parallel") and paging["_nrt"] is False
    assert kernel["parallel"] and kernel["fastmath"] and "_nrt" not in kernel
    assert helper["inline"] == "always" and paging["inline"] == "never"
    assert type(loop.replay._cache).__name__ == "FunctionCache" == type(kernels_jit.blocked._cache).__name__


def test_labkit_jit_0_leaves_plain_functions():
    code = ("from labkit import jit; from labkit.quant import kernels_jit as kj; g = lambda x: x; "
            "f = jit.njit(parallel=True)(g); print(jit.ENABLED, f is g and f.py_func is g, jit.prange is range, "
            "jit.max_threads(), jit.get_threads(), type(kj.blocked).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LABKIT_JIT="0"), capture_output=True,
                         text=True, check=True, timeout=300, cwd=ROOT)
    assert out.stdout.split() == ["False", "True", "True", "1", "1", "function"]


def test_set_threads_refuses_a_count_outside_one_to_max_threads():
    assert_refused(lambda: jit.set_threads(0), ValueError, "n", 0, "an int in")
    assert_refused(lambda: jit.set_threads(jit.max_threads() + 1), ValueError, "n", jit.max_threads() + 1, "an int in")


def write_package(folder: Path, constant: int = 1) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "consts.py").write_text(f"STEP = {constant}\n")
    (folder / "other.py").write_text("X = 1\n")
    (folder / "mod.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        from labkit.jit import njit, source_cache_dir
        from .consts import STEP
        CACHE = source_cache_dir(Path(__file__).parent, b"@njit")
        @njit(nrt=False, cache_dir=CACHE)
        def add(x):
            return x + STEP
        """))


def test_the_cache_folder_follows_the_compiled_sources_and_what_they_import(tmp_path):
    package = tmp_path / "pkg"
    write_package(package)
    first = jit.sources_hash(package, b"@njit")
    (package / "other.py").write_text("X = 2\n")  # imported by no compiled module
    assert jit.sources_hash(package, b"@njit") == first
    write_package(package, constant=2)            # a constant the compiled code reads
    assert jit.sources_hash(package, b"@njit") != first and len(first) == 16


def test_stale_caches_go_at_the_first_compile_never_at_import(tmp_path):
    if not jit.ENABLED:
        pytest.skip("numba is not in use")
    write_package(tmp_path / "pkg")
    stale = tmp_path / "pkg" / "__pycache__" / "numba-0123456789abcdef"
    kept = tmp_path / "pkg" / "__pycache__" / "numba-notahash"
    stale.mkdir(parents=True), kept.mkdir()
    code = ("import sys, pathlib; from pkg import mod; stale = pathlib.Path(sys.argv[1]); "
            "print(stale.exists(), mod.add(2), stale.exists(), pathlib.Path(mod.CACHE).is_dir())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", code, str(stale)], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.split() == ["True", "3", "False", "True"]
    assert kept.exists()  # only numba-<16 hex digits> folders are caches of older sources


def test_remove_stale_caches_leaves_the_users_numba_cache_dir(tmp_path):
    mine, other = tmp_path / "numba-0123456789abcdef", tmp_path / "numba-fedcba9876543210"
    mine.mkdir(), other.mkdir()
    assert jit.remove_stale_caches(str(mine)) == [] and other.exists()
    (tmp_path / "__pycache__").mkdir()
    here, old = (tmp_path / "__pycache__" / p.name for p in (mine, other))
    here.mkdir(), old.mkdir()
    assert jit.remove_stale_caches(str(here)) == [old] and here.exists() and not old.exists()

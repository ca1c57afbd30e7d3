"""This package's jit: labkit.jit's switch (numba when it is installed and LABKIT_JIT is not 0, plain Python
otherwise) without reference counting, cached in a folder named after the package's compiled sources."""
import os
import subprocess
import sys
from pathlib import Path

import labkit.jit
from labkit.unified_memory import jit, loop


def test_this_process_compiles_unless_told_not_to():
    wanted = os.environ.get("LABKIT_JIT", "1") != "0" and jit.numba is not None
    assert jit.ENABLED == wanted
    assert callable(loop.replay.py_func) and type(loop.replay.py_func).__name__ == "function"
    if wanted:
        assert type(loop.replay).__name__ == "CPUDispatcher"
        assert jit.CACHE_DIR.endswith("numba-" + labkit.jit.sources_hash(Path(loop.__file__).parent))
        assert loop.replay.targetoptions["_nrt"] is False and loop.replay._cache._cache_path.startswith(jit.CACHE_DIR)


def test_labkit_jit_0_runs_plain_python():
    code = ("from labkit.unified_memory import jit, loop, policies; "
            "print(jit.ENABLED, jit.CACHE_DIR, type(loop.replay).__name__, policies.touch.py_func is policies.touch)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LABKIT_JIT="0"), capture_output=True,
                         text=True, check=True, timeout=300)
    assert out.stdout.split() == ["False", "None", "function", "True"]


def test_decorating_without_numba_leaves_the_function():
    def f(x):
        return x + 1
    if not jit.ENABLED:
        assert jit.jit(f) is f and f.py_func is f
    else:
        compiled = jit.jit(inline=True)(f)
        assert compiled.py_func is f and compiled(2) == 3

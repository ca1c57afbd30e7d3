"""Compile the paging loop with numba when it is there, run it as plain Python when it is not (notebook 02).

    @jit
    def replay(...): ...      # numba's njit(cache=True) if numba imports and LABKIT_JIT is not "0",
                              # else the function itself, unchanged

Either way the decorated object has `.py_func`, the plain Python function (what `labkit.show` prints and
what a test can call to run the loop uncompiled). The choice is made once, when labkit.unified_memory is
imported: set LABKIT_JIT=0 in the environment before that to debug the loop with print() or pdb.
The compiled code is cached on disk (numba's cache=True, in __pycache__ beside the source): the one-time
compile, a few seconds, is paid once per machine and source version.
"""

from __future__ import annotations

import os

try:
    import numba
except ImportError:  # numba is pinned in pyproject.toml; without it everything still runs, slowly
    numba = None

ENABLED = numba is not None and os.environ.get("LABKIT_JIT", "1") != "0"


def jit(fn):
    """numba.njit(cache=True)(fn) when ENABLED, else fn itself with fn.py_func = fn."""
    if ENABLED:
        return numba.njit(cache=True)(fn)
    fn.py_func = fn
    return fn

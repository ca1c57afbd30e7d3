"""How this package compiles its paging loop (notebook 02): labkit.jit's switch, with the package's own options.

    @jit                 labkit.jit.njit(nrt=False, cache_dir=CACHE_DIR): numba when ENABLED, else fn itself
    @jit(inline=True)    the small helpers the loop calls per access: numba pastes them into the caller

Either way the decorated object has `.py_func`, the plain Python function. Set LABKIT_JIT=0 in the environment
before labkit is imported to run the loop as plain Python (to debug it with print() or pdb).

Compiled without numba's reference counting (nrt=False): the compiled functions allocate nothing and only use
arrays their caller owns, so counting is not needed, and with it every call of a helper such as touch() would
pay atomic reference-count updates on its array arguments (the loop ran 5-10x slower).

Cached in CACHE_DIR, a folder named after a hash of this package's compiled modules and the modules they import
(labkit.jit.source_cache_dir): the loop in loop.py inlines policies.py and prefetch.py and reads the constants of
state.py and faultlog.py, so editing any of them compiles everything afresh. The folders of older sources are
removed when numba first compiles here (labkit.jit.remove_stale_caches).
"""

from __future__ import annotations

from pathlib import Path

from ..jit import ENABLED, njit, numba, source_cache_dir

__all__ = ["CACHE_DIR", "ENABLED", "jit", "numba"]

CACHE_DIR = source_cache_dir(Path(__file__).resolve().parent)  # None unless ENABLED


def jit(fn=None, *, inline: bool = False):
    """labkit.jit.njit(fn, inline=inline, nrt=False, cache_dir=CACHE_DIR): compiled when ENABLED, else fn itself
    with fn.py_func = fn."""
    if fn is None:
        return lambda f: jit(f, inline=inline)
    return njit(fn, inline=inline, nrt=False, cache_dir=CACHE_DIR)

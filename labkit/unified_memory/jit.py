"""Compile the paging loop with numba when it is there, run it as plain Python when it is not (notebook 02).

    @jit
    def replay(...): ...      # numba's njit(cache=True) if numba imports and LABKIT_JIT is not "0",
                              # else the function itself, unchanged

Either way the decorated object has `.py_func`, the plain Python function (what `labkit.show` prints and
what a test can call to run the loop uncompiled). The choice is made once, when labkit.unified_memory is
imported: set LABKIT_JIT=0 in the environment before that to debug the loop with print() or pdb.

Compiled without numba's reference counting (_nrt=False): the compiled functions allocate nothing and
only use arrays their caller owns, so counting is not needed, and with it every call of a helper such as
touch() would pay atomic reference-count updates on its array arguments (the loop ran 5-10x slower).

Compiled with nogil=True: a compiled loop that never ended would otherwise hold the GIL, and no watchdog
thread (pytest-timeout's thread method) could stop it; the loops are bounded by construction besides.

The compiled code is cached on disk (numba's cache=True): the one-time compile, a few seconds, is paid once
per machine and source version. numba checks only the caller's own file before reusing a cached function,
not the files of the functions it calls (the loop in loop.py inlines policies.py and prefetch.py), so the
cache lives in a folder named after a hash of every compiled module of this package: editing any of them
compiles everything afresh (__pycache__/numba-<hash>/, or under NUMBA_CACHE_DIR when that is set).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

try:
    import numba
except ImportError:  # numba is pinned in pyproject.toml; without it everything still runs, slowly
    numba = None

ENABLED = numba is not None and os.environ.get("LABKIT_JIT", "1") != "0"
HERE = Path(__file__).resolve().parent


def _sources_hash() -> str:
    """sha256 of the package's modules that use @jit (this one included), 16 hex digits."""
    digest = hashlib.sha256()
    for path in sorted(HERE.glob("*.py")):
        text = path.read_bytes()
        if path.name == "jit.py" or b"@jit" in text:
            digest.update(path.name.encode() + b"\0" + text)
    return digest.hexdigest()[:16]


def _cache_dir() -> str:
    """NUMBA_CACHE_DIR/numba-<hash>, or __pycache__/numba-<hash> beside this file, where the folders of
    older sources are removed (they can never be used again)."""
    if numba.config.CACHE_DIR:
        return os.path.join(numba.config.CACHE_DIR, f"numba-{_sources_hash()}")
    here = HERE / "__pycache__" / f"numba-{_sources_hash()}"
    for old in here.parent.glob("numba-*"):
        if old != here:
            shutil.rmtree(old, ignore_errors=True)
    return str(here)


CACHE_DIR = _cache_dir() if ENABLED else None


def jit(fn=None, *, inline: bool = False):
    """numba.njit(cache=True, _nrt=False, nogil=True)(fn) when ENABLED (cached in CACHE_DIR), else fn itself with
    fn.py_func = fn. jit(inline=True) for the small helpers the loop calls per access: numba pastes them
    into the caller."""
    if fn is None:
        return lambda f: jit(f, inline=inline)
    if not ENABLED:
        fn.py_func = fn
        return fn
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = CACHE_DIR  # read once, when the dispatcher picks its cache folder
    try:
        return numba.njit(cache=True, _nrt=False, nogil=True, inline="always" if inline else "never")(fn)
    finally:
        numba.config.CACHE_DIR = before

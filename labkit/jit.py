"""One switch for numba in labkit: compile a loop when numba imports and LABKIT_JIT is not "0", run it as plain
Python otherwise (lab 02's paging loop in labkit.unified_memory, lab 03's INT4 kernels in labkit.quant).

    @njit                                  numba.njit(cache=True, nogil=True)(fn), or fn itself
    @njit(inline=True)                     a small helper that numba pastes into its callers
    @njit(parallel=True, fastmath=True)    loops over prange(...) spread over the threads; float sums reordered
    @njit(nrt=False, cache_dir=folder)     without reference counting; cached in `folder`

Either way the decorated object has `.py_func`, the plain Python function (what `labkit.show` prints and what a
test calls to run the loop uncompiled). ENABLED is decided once, when this module is imported: set LABKIT_JIT=0
in the environment before that to debug a loop with print() or pdb.

nogil=True: a compiled loop that never ended would otherwise hold the GIL, and no watchdog thread
(pytest-timeout's thread method) could stop it.

The compiled code is cached on disk (numba's cache=True): the one-time compile, seconds, is paid once per
machine and source version. numba checks only a function's own file before reusing its cached code, not the
files of the functions it inlines nor of the constants it reads; a package whose compiled loops span several
files caches them in source_cache_dir(folder), a folder named after a hash of those files. The folders of older
sources are removed the first time numba compiles a function cached there (or by remove_stale_caches).
Importing this module writes and deletes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from ._checks import check_int

try:
    import numba
    from numba.core import event
except ImportError:  # numba is pinned in pyproject.toml; without it everything still runs, slowly
    numba = event = None

ENABLED = numba is not None and os.environ.get("LABKIT_JIT", "1") != "0"
prange = numba.prange if ENABLED else range  # a parallel loop's range under @njit(parallel=True)
_CLEANUPS: dict[str, "_StaleCacheCleanup"] = {}  # cache folder -> its cleanup, waiting for a first compile


def njit(fn=None, *, inline: bool = False, parallel: bool = False, fastmath: bool = False, nrt: bool = True,
         cache_dir: str | None = None):
    """numba.njit(cache=True, nogil=True, ...)(fn) when ENABLED, else fn itself with fn.py_func = fn.

    inline: numba pastes fn into its callers. parallel: prange loops run on the threads (set_threads).
    fastmath: LLVM may reorder float operations (results differ in the last digits). nrt=False: compiled without
    numba's reference counting, for loops that allocate nothing and only use their callers' arrays (every call
    of a helper then skips atomic count updates on its array arguments). cache_dir: the folder numba caches fn
    in (source_cache_dir), else numba's own choice (__pycache__ beside fn's file, or NUMBA_CACHE_DIR)."""
    if fn is None:
        return lambda f: njit(f, inline=inline, parallel=parallel, fastmath=fastmath, nrt=nrt, cache_dir=cache_dir)
    if not ENABLED:
        fn.py_func = fn
        return fn
    options = dict(cache=True, nogil=True, inline="always" if inline else "never", parallel=parallel,
                   fastmath=fastmath)
    if not nrt:
        options["_nrt"] = False
    if cache_dir is None:
        return numba.njit(**options)(fn)
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = cache_dir  # read once, when the dispatcher picks its cache folder
    try:
        dispatcher = numba.njit(**options)(fn)
    finally:
        numba.config.CACHE_DIR = before
    if cache_dir not in _CLEANUPS:
        _CLEANUPS[cache_dir] = _StaleCacheCleanup(cache_dir)
        event.register("numba:compile", _CLEANUPS[cache_dir])
    _CLEANUPS[cache_dir].dispatchers[id(dispatcher)] = dispatcher
    return dispatcher


def sources_hash(folder: Path, marker: bytes = b"@jit") -> str:
    """sha256 (16 hex digits) of the modules of `folder` that hold `marker` or are named jit.py, of the sibling
    modules they import (`from .name import`, followed to the end: they hold constants the compiled code
    reads) and of this module."""
    folder = Path(folder)
    chosen = {p for p in folder.glob("*.py") if p.name == "jit.py" or marker in p.read_bytes()}
    todo = list(chosen)
    while todo:
        for name in re.findall(rb"^from \.(\w+) import", todo.pop().read_bytes(), re.M):
            path = folder / f"{name.decode()}.py"
            if path.exists() and path not in chosen:
                chosen.add(path)
                todo.append(path)
    digest = hashlib.sha256()
    for path in sorted(chosen) + [Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def source_cache_dir(folder: Path, marker: bytes = b"@jit") -> str | None:
    """Where the compiled functions of the package in `folder` are cached: NUMBA_CACHE_DIR/numba-<hash> when
    NUMBA_CACHE_DIR is set, else <folder>/__pycache__/numba-<hash> (hash: sources_hash); None unless ENABLED."""
    if not ENABLED:
        return None
    name = f"numba-{sources_hash(folder, marker)}"
    if numba.config.CACHE_DIR:
        return os.path.join(numba.config.CACHE_DIR, name)
    return str(Path(folder).resolve() / "__pycache__" / name)


def remove_stale_caches(cache_dir: str) -> list[Path]:
    """Delete the numba-<hash> folders beside `cache_dir` (a source_cache_dir under a package's __pycache__) other
    than cache_dir itself: the caches of older sources, never used again. Returns the folders removed; under
    NUMBA_CACHE_DIR (the user's folder) it removes nothing."""
    here = Path(cache_dir)
    if here.parent.name != "__pycache__":
        return []
    stale = [p for p in here.parent.glob("numba-*") if p != here and re.fullmatch(r"numba-[0-9a-f]{16}", p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


if event is not None:
    class _StaleCacheCleanup(event.Listener):
        """Runs remove_stale_caches(cache_dir) once, when numba first compiles (a cache miss) one of the
        functions cached in cache_dir."""

        def __init__(self, cache_dir: str):
            self.cache_dir, self.dispatchers, self.done = cache_dir, {}, False  # dispatchers: id -> dispatcher

        def on_start(self, ev) -> None:
            if not self.done and id((ev.data or {}).get("dispatcher")) in self.dispatchers:
                self.done = True
                remove_stale_caches(self.cache_dir)

        def on_end(self, ev) -> None:
            pass


def max_threads() -> int:
    """The most threads a parallel loop may use (numba's NUMBA_NUM_THREADS, the core count; 1 without numba)."""
    return numba.config.NUMBA_NUM_THREADS if ENABLED else 1


def get_threads() -> int:
    """The parallel loops' thread count: numba's, 1 without numba."""
    return numba.get_num_threads() if ENABLED else 1


def set_threads(n: int) -> None:
    """Set the parallel loops' thread count to n, in [1, max_threads()]."""
    check_int("n", n, 1, max_threads())
    if ENABLED:
        numba.set_num_threads(n)

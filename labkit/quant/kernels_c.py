"""Rungs 6 and 7 of the INT4 GEMV ladder: int4_gemv.c built by this machine's C compiler (notebook 03,
section 8; labkit.quant.kernels calls them).

    int4_gemv.c --(cc -O3 -march=native -fopenmp -shared -fPIC)--> int4_gemv-<hash>.so --(ctypes)--> gemv(...)
                                                                                                  gemv_int8(...)

Built once per machine and source on first use (about a second), kept beside the package's bytecode
(__pycache__, else the user's cache folder, else the temporary folder) under a name that hashes the source,
the compiler's version and the flags, so that a new CPU flag or an edited kernel builds a new library. The
compiler is $CC when set, else cc, gcc or clang on PATH. Flags are tried best first: -march=native (the
CPU's own SIMD) with OpenMP, then without OpenMP (one thread), then plain -O3 (Apple clang without libomp
stops at the second); $LABKIT_CFLAGS replaces them with one set of your own (try "-O3 -march=haswell
-fopenmp" on an AVX-512 machine to see what its wider registers buy; add -DLANES=16 for AVX-512's layout on
an AVX2 CPU). With no compiler, or when every build fails, available() says why and gemv and gemv_int8 raise
a RuntimeError naming the reason: the other rungs do not need it (lab 08's compiler probe does the same for
torch.compile). LABKIT_C=0 switches rungs 6 and 7 off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._checks import fail

SOURCE = Path(__file__).with_name("int4_gemv.c")
FLAGS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))
_f32 = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_u32 = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
_i64 = ctypes.c_int64


def compiler() -> str | None:
    """The C compiler's path: $CC, else cc, gcc or clang on PATH; None when there is none."""
    return _which(os.environ.get("CC") or None)


@functools.lru_cache(maxsize=None)
def _which(cc: str | None) -> str | None:
    """Cached: a PATH search on every product would cost more than a small product's arithmetic."""
    return next(filter(None, map(shutil.which, [cc] if cc else ["cc", "gcc", "clang"])), None)


def _folders() -> list[Path]:
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "labkit"
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")  # Windows has no uid
    return [SOURCE.parent / "__pycache__", home, Path(tempfile.gettempdir()) / f"labkit-{user}"]


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _build(cc: str, flags: tuple[str, ...]) -> tuple[Path | None, str]:
    """(library, "") built or found in a cache folder, or (None, the compiler's complaint)."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + repr((_version(cc), flags, platform.machine())).encode()).hexdigest()[:16]
    why = "no writable cache folder"
    for folder in _folders():
        lib = folder / f"int4_gemv-{key}.so"
        if lib.is_file():
            return lib, ""
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
        except OSError as e:
            why = f"cannot write to {folder} ({e})"
            continue
        try:
            done = subprocess.run([cc, *flags, "-shared", "-fPIC", str(SOURCE), "-o", tmp],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(tmp, lib)  # atomic: two processes building at once both end with a whole file
                return lib, ""
            return None, done.stderr.strip()[:300] or f"exit status {done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{type(e).__name__}: {e}"
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return None, why


def _flag_sets() -> tuple[tuple[str, ...], ...]:
    own = os.environ.get("LABKIT_CFLAGS", "").split()
    return (tuple(own),) if own else FLAGS


def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, how it was built) or (None, why not)."""
    if os.environ.get("LABKIT_C", "1") == "0":
        return None, "LABKIT_C=0 switches rungs 6 and 7 off"
    return _load(compiler(), _flag_sets())


@functools.lru_cache(maxsize=None)
def _load(cc: str | None, flag_sets: tuple[tuple[str, ...], ...]) -> tuple[ctypes.CDLL | None, str]:
    """_library's work, once per process, compiler and flags."""
    if cc is None:
        return None, "no C compiler (set $CC, or install gcc or clang)"
    complaints = []
    for flags in flag_sets:
        lib, why = _build(cc, flags)
        if lib is None:
            complaints.append(f"{' '.join(flags)}: {why.splitlines()[0] if why else '?'}")
            continue
        try:
            dll = ctypes.CDLL(str(lib))
        except OSError as e:
            complaints.append(f"{' '.join(flags)}: built but would not load ({e})")
            continue
        dll.int4_gemv_lanes.restype = dll.int4_gemv_int8_simd.restype = ctypes.c_int
        dll.int4_gemv.restype = None
        dll.int4_gemv.argtypes = [_f32, _f32, _u32, _f32, _f32, _i64, _i64, _i64, _i64, ctypes.c_int, _f32]
        dll.int4_gemv_int8.restype = None
        dll.int4_gemv_int8.argtypes = [_f32, _u32, _f32, _f32, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, _f32]
        openmp = "OpenMP threads" if "-fopenmp" in flags else "one thread (no OpenMP)"
        rung_7 = "AVX2 byte products" if dll.int4_gemv_int8_simd() else "plain C"
        return dll, f"{cc} {' '.join(flags)}: {openmp}, {dll.int4_gemv_lanes()} float lanes, rung 7 in {rung_7}"
    return None, f"{cc} could not build {SOURCE.name}: " + "; ".join(complaints)


def available() -> tuple[bool, str]:
    """(True, compiler, flags and lanes) when rungs 6 and 7 are built and loaded here, (False, why not)
    otherwise."""
    dll, how = _library()
    return dll is not None, how


def lanes() -> int:
    """The float lanes rungs 6-7 were built for here (16 with AVX-512, else 8; -DLANES in $LABKIT_CFLAGS sets
    it). RuntimeError when not built."""
    return _loaded().int4_gemv_lanes()


@dataclass(frozen=True, eq=False)
class LaneLayout:
    """One weight laid out for int4_gemv.c with `lanes` output rows per SIMD vector (see its comment):
    words uint32 [B, K / 8, lanes], scale and offset float32 [B, G, lanes], B = ceil(N / lanes) row blocks."""
    words: np.ndarray
    scale: np.ndarray
    offset: np.ndarray

    @property
    def lanes(self) -> int:
        return self.words.shape[2]


def lay_out(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, lanes: int) -> LaneLayout:
    """int4_gemv.c's layout of int8 codes [N, K] (K a multiple of 8) with their float32 scale and zero point
    [N, G]; rows past N (up to a whole block) get code -8 and scale 0."""
    n, k = codes.shape
    blocks = -(-n // lanes)
    nibbles = np.zeros((blocks * lanes, k), np.uint8)
    nibbles[:n] = (codes.astype(np.int16) + 8).astype(np.uint8)
    nibbles = nibbles.reshape(blocks, lanes, k // 8, 8)  # [B, lane, word, t]
    words = sum(nibbles[..., t].astype(np.uint32) << np.uint32(4 * t) for t in range(8))  # [B, lane, word]

    def by_block(a: np.ndarray) -> np.ndarray:  # [N, G] -> [B, G, lane]
        padded = np.zeros((blocks * lanes, a.shape[1]), np.float32)
        padded[:n] = a
        return np.ascontiguousarray(padded.reshape(blocks, lanes, -1).transpose(0, 2, 1))

    offset = scale * (np.float32(24) + zero)  # float32: 24 = 8 (the nibble's offset) + 16 (the bit trick's 1)
    return LaneLayout(np.ascontiguousarray(words.transpose(0, 2, 1)), by_block(scale), by_block(offset))


def _loaded() -> ctypes.CDLL:
    dll, how = _library()
    if dll is None:
        raise RuntimeError(f"rungs 6 and 7 (C) are not available on this machine: {how}")
    return dll


def _checked(x_shape: tuple[int, int], groups: int, layout: LaneLayout, n_rows: int, y: np.ndarray,
             **inputs: tuple[tuple[int, ...], tuple[int, ...]]) -> ctypes.CDLL:
    """The library, once every shape the C loops trust is what x [M, K], `groups` and `layout` call for
    (inputs: name -> (expected shape, shape)): a wrong one would read or write past an array's end."""
    dll = _loaded()
    if layout.lanes != dll.int4_gemv_lanes():  # laid out before LABKIT_CFLAGS changed the build
        raise RuntimeError(f"the weight is laid out for {layout.lanes} lanes, rungs 6 and 7 are built here for "
                           f"{dll.int4_gemv_lanes()}: lay it out again with kernels.pack_weight")
    m_rows, k = x_shape
    if groups < 1 or k % groups or (k // groups) % 8:
        fail("groups", groups, f"a count of groups of a multiple of 8 of x's {k} inputs")
    blocks = -(-n_rows // layout.lanes)
    expected = {**inputs, "y": ((m_rows, n_rows), y.shape),
                "layout.words": ((blocks, k // 8, layout.lanes), layout.words.shape),
                "layout.scale": ((blocks, groups, layout.lanes), layout.scale.shape),
                "layout.offset": ((blocks, groups, layout.lanes), layout.offset.shape)}
    for name, (want, got) in expected.items():
        if tuple(got) != want:
            fail(name, tuple(got), f"shape {want} for x {x_shape}")
    return dll


def gemv(x: np.ndarray, x_sums: np.ndarray, layout: LaneLayout, n_rows: int, threads: int, y: np.ndarray) -> None:
    """int4_gemv.c's float product into y [M, n_rows] (x [M, K], x_sums [M, G]; layout from lay_out(...,
    lanes())). RuntimeError when rung 6 is not built here, or the layout was written for another build."""
    if x.ndim != 2 or x_sums.ndim != 2:
        fail("x", (tuple(x.shape), tuple(x_sums.shape)), "x [M, K] and x_sums [M, G]")
    m_rows, groups = x_sums.shape
    dll = _checked(x.shape, groups, layout, n_rows, y, x_sums=((x.shape[0], groups), x_sums.shape))
    dll.int4_gemv(x, x_sums, layout.words, layout.scale, layout.offset, m_rows, n_rows, x.shape[1], groups,
                  threads, y)


def gemv_int8(x: np.ndarray, block: int, groups: int, layout: LaneLayout, n_rows: int, threads: int,
              y: np.ndarray) -> None:
    """int4_gemv.c's integer product (rung 7) into y [M, n_rows]: x float32 [M, K] rounded to int8 per block of
    `block` inputs (8, 16 or 32, inside one of the `groups` groups), the codes multiplied as bytes.
    RuntimeError when rung 7 is not built here, or the layout was written for another build."""
    if x.ndim != 2:
        fail("x", tuple(x.shape), "x [M, K]")
    if not np.isfinite(x).all():  # the C loop would round a NaN to a code and report an inf as out of memory
        fail("x", "a NaN or inf", "finite values")
    k = x.shape[1]
    if groups < 1 or k % groups:
        fail("groups", groups, f"a count of groups that divides x's {k} inputs")
    if block not in (8, 16, 32) or (k // groups) % block:
        fail("block", block, f"8, 16 or 32 inputs, dividing each of the {groups} groups of x's {k} inputs")
    dll = _checked(x.shape, groups, layout, n_rows, y)
    dll.int4_gemv_int8(x, layout.words, layout.scale, layout.offset, x.shape[0], n_rows, k, groups, block, threads,
                       y)
    if np.isnan(y).all() and y.size:  # int4_gemv_int8 could not allocate its int8 copy of x
        raise MemoryError(f"rung 7 could not allocate {x.size} bytes for x rounded to int8 and its scales")

"""Rungs 6 and 7 of the INT4 GEMV ladder: int4_gemv.c built by this machine's C compiler (notebook 03,
section 8; labkit.quant.kernels calls them).

    int4_gemv.c --(cc -O3 -march=native -fopenmp -shared -fPIC)--> int4_gemv-<hash>.so --(ctypes)--> gemv(...)
                                                                                                  gemv_int8(...)

Built once per CPU and source on first use (about a second), kept beside the package's bytecode
(__pycache__, else the user's cache folder, else the temporary folder) under a name that hashes the source,
the compiler's version, the flags and what they target (the compiler's predefined macros for them: what
-march=native resolves to on this CPU), so that another CPU sharing the folder, a new flag or an edited kernel
builds its own library. A library whose instructions this CPU lacks (built elsewhere, or for another CPU by
$LABKIT_CFLAGS) is refused before any of its vector code runs (int4_gemv_missing_isa).

The compiler is $CC when set, else cc, gcc or clang on PATH. Flags are tried best first: -march=native (the
CPU's own SIMD) with OpenMP, then without OpenMP (one thread), then plain -O3 (Apple clang without libomp
stops at the second); $LABKIT_CFLAGS replaces them with one set of your own (try "-O3 -march=haswell
-fopenmp" on an AVX-512 machine to see what its wider registers buy; add -DLANES=16 for AVX-512's layout on
an AVX2 CPU). Rung 7 multiplies bytes with VNNI's vpdpbusd where the flags target it, else with AVX2's two
instructions, else in plain C: available() names the path. With no compiler, or when every build fails,
available() says why and gemv and gemv_int8 raise a RuntimeError naming the reason: the other rungs do not
need it (lab 08's compiler probe does the same for torch.compile). LABKIT_C=0 switches rungs 6 and 7 off.
These settings are read when a weight is laid out (lay_out): the layout keeps the library it was laid out for,
and its products run on that build whatever the settings say later (a product reads no environment variable:
that cost 20 us of a 0.7 ms product).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._checks import check_type, fail

SOURCE = Path(__file__).with_name("int4_gemv.c")
FLAGS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))
_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64  # arrays go in as addresses: numpy's ndpointer checks cost 15 us a call
_GEMV_ARGS = [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, ctypes.c_int, _ptr]  # int4_gemv's C signature
_INT8_ARGS = [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, _ptr]  # int4_gemv_int8's
INT8_NO_MEMORY, INT8_X_NOT_FINITE = 1, 2  # int4_gemv_int8's status when y is not written (its enum, int4_gemv.c)


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


@functools.lru_cache(maxsize=None)
def target(cc: str, flags: tuple[str, ...]) -> str:
    """What `flags` make `cc` target here: its predefined macros (__AVX2__, __AVX512F__, __AVX512VNNI__, the
    architecture, ...), which on another CPU differ for the same -march=native; "" when the compiler cannot say."""
    try:
        done = subprocess.run([cc, *flags, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return "\n".join(sorted(done.stdout.splitlines())) if done.returncode == 0 else ""


def _key(cc: str, flags: tuple[str, ...]) -> str:
    """The cache name's hash: the source, the compiler, the flags and what they target on this CPU."""
    what = repr((_version(cc), flags, platform.machine(), target(cc, flags)))
    return hashlib.sha256(SOURCE.read_bytes() + what.encode()).hexdigest()[:16]


def _build(cc: str, flags: tuple[str, ...]) -> tuple[Path | None, str]:
    """(library, "") built or found in a cache folder, or (None, the compiler's complaint)."""
    key = _key(cc, flags)
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


@dataclass(frozen=True)
class Build:
    """How rungs 6 and 7 were built and loaded here: compiler, flags, float lanes and rung 7's instruction path
    (int4_gemv_int8_path: "AVX-512 VNNI", "AVX2", ...)."""
    cc: str
    flags: tuple[str, ...]
    lanes: int
    int8_path: str

    @property
    def openmp(self) -> bool:
        return "-fopenmp" in self.flags

    def __str__(self) -> str:
        threads = "OpenMP threads" if self.openmp else "one thread (no OpenMP)"
        return f"{self.cc} {' '.join(self.flags)}: {threads}, {self.lanes} float lanes, rung 7 in {self.int8_path}"


def _library() -> tuple[ctypes.CDLL | None, Build | str]:
    """(the loaded library, how it was built) or (None, why not)."""
    if os.environ.get("LABKIT_C", "1") == "0":
        return None, "LABKIT_C=0 switches rungs 6 and 7 off"
    return _load(compiler(), _flag_sets())


@functools.lru_cache(maxsize=None)
def _load(cc: str | None, flag_sets: tuple[tuple[str, ...], ...]) -> tuple[ctypes.CDLL | None, Build | str]:
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
        dll.int4_gemv_missing_isa.restype = dll.int4_gemv_int8_path.restype = ctypes.c_char_p
        missing = dll.int4_gemv_missing_isa().decode()
        if missing:
            complaints.append(f"{' '.join(flags)}: built for instructions this CPU lacks ({missing})")
            continue
        dll.int4_gemv_lanes.restype = ctypes.c_int
        dll.int4_gemv.restype = None
        dll.int4_gemv.argtypes = _GEMV_ARGS
        dll.int4_gemv_int8.restype = ctypes.c_int  # 0 (INT8_DONE) once y is written, else why not
        dll.int4_gemv_int8.argtypes = _INT8_ARGS
        return dll, Build(cc, tuple(flags), dll.int4_gemv_lanes(), dll.int4_gemv_int8_path().decode())
    return None, f"{cc}: no build of {SOURCE.name} runs here: " + "; ".join(complaints)


def available() -> tuple[bool, str]:
    """(True, the build's line: compiler, flags, lanes, rung 7's path) when rungs 6 and 7 are built and loaded
    here, (False, why not) otherwise."""
    dll, how = _library()
    return dll is not None, str(how)


def build() -> Build | None:
    """The build of rungs 6 and 7 loaded here, or None (available() says why)."""
    dll, how = _library()
    return how if dll is not None else None


def lanes() -> int:
    """The float lanes rungs 6-7 were built for here (16 with AVX-512, else 8; -DLANES in $LABKIT_CFLAGS sets
    it). RuntimeError when not built."""
    return _loaded().int4_gemv_lanes()


@dataclass(frozen=True, eq=False)
class LaneLayout:
    """One weight laid out for int4_gemv.c with `lanes` output rows per SIMD vector (see its comment):
    words uint32 [B, K / 8, lanes], scale and offset float32 [B, G, lanes], B = ceil(N / lanes) row blocks.
    `library`: the build it was laid out for, which computes its products (lay_out without `lanes`); None for a
    layout alone, which the build of the moment reads when its lanes match. `addresses`: where the C loops read
    words, scale and offset (the layout holds a second reference to each array, so that numpy refuses to
    resize one, which would move its values and leave the address dangling)."""
    words: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    library: ctypes.CDLL | None = field(default=None, repr=False)
    addresses: tuple[int, int, int] = field(init=False, repr=False)
    _pinned: tuple[np.ndarray, ...] = field(init=False, repr=False)

    def __post_init__(self):
        """The C loops trust these dtypes and shapes: checked once here, so that a product checks only its own
        arrays against them (_checked)."""
        for name, a, dtype in (("words", self.words, np.uint32), ("scale", self.scale, np.float32),
                               ("offset", self.offset, np.float32)):
            check_type(name, a, np.ndarray, f"a numpy array of {dtype.__name__}")
            if a.dtype != dtype or a.ndim != 3 or not a.flags.c_contiguous:
                fail(name, (a.dtype, a.shape, "C-contiguous" if a.flags.c_contiguous else "strided"),
                     f"a C-contiguous {dtype.__name__} array [B, ., lanes]")
        if self.offset.shape != self.scale.shape or self.scale.shape[::2] != self.words.shape[::2]:
            fail("scale and offset", (self.scale.shape, self.offset.shape),
                 f"one shape [B, G, lanes] with words' B and lanes {self.words.shape[::2]}")
        if self.library is not None:  # one _load set up, whose argument types pass addresses as 64-bit pointers
            if getattr(self.library.int4_gemv_int8, "argtypes", None) != _INT8_ARGS:
                fail("library", self.library, "a library loaded by kernels_c (kernels_c.lay_out gives one)")
            if self.library.int4_gemv_lanes() != self.lanes:
                fail("library", self.library.int4_gemv_lanes(), f"a build for the layout's {self.lanes} lanes")
        arrays = (self.words, self.scale, self.offset)
        object.__setattr__(self, "addresses", tuple(a.ctypes.data for a in arrays))
        object.__setattr__(self, "_pinned", arrays)

    @property
    def lanes(self) -> int:
        return self.words.shape[2]

    def __copy__(self) -> LaneLayout:  # nothing in it changes
        return self

    def __deepcopy__(self, memo: dict) -> LaneLayout:  # the copy shares the build: one library per process
        return LaneLayout(*(copy.deepcopy(a, memo) for a in (self.words, self.scale, self.offset)), self.library)

    def __reduce__(self):  # another process has its own build: the layout travels alone
        return LaneLayout, (self.words, self.scale, self.offset)


def lay_out(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, lanes: int | None = None) -> LaneLayout:
    """int4_gemv.c's layout of int8 codes [N, K] (K a multiple of 8) with their float32 scale and zero point
    [N, G]; rows past N (up to a whole block) get code -8 and scale 0. lanes=None: for this machine's build,
    which the layout keeps (its products need no look at the environment; RuntimeError when rungs 6-7 are not
    built here); a count: the layout alone."""
    check_type("codes", codes, np.ndarray, "a numpy array of int8 codes [N, K]")
    if codes.dtype != np.int8 or codes.ndim != 2 or codes.size == 0 or codes.shape[1] % 8:
        fail("codes", (codes.dtype, codes.shape),
             "int8 codes [N, K], N >= 1 and K a multiple of 8 (a word's 8 nibbles)")
    if codes.min() < -8 or codes.max() > 7:  # a code outside 4 bits would spill into its neighbour's nibble
        fail("codes", (int(codes.min()), int(codes.max())), "4-bit codes in -8..7")
    for name, a in (("scale", scale), ("zero", zero)):
        check_type(name, a, np.ndarray, "a float32 numpy array [N, G]")
        if a.ndim != 2 or a.shape[0] != codes.shape[0] or a.shape[1] < 1 or codes.shape[1] % a.shape[1]:
            fail(name, a.shape, f"[{codes.shape[0]}, G] with G groups dividing K = {codes.shape[1]}")
    if zero.shape != scale.shape:
        fail("zero", zero.shape, f"scale's shape {scale.shape}")
    if lanes is not None and lanes not in (8, 16):
        fail("lanes", lanes, "8 or 16 (the lane counts int4_gemv.c builds), or None for this machine's build")
    library = None if lanes is not None else _loaded()
    lanes = lanes if library is None else library.int4_gemv_lanes()
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

    scale, zero = scale.astype(np.float32, copy=False), zero.astype(np.float32, copy=False)
    offset = scale * (np.float32(24) + zero)  # float32: 24 = 8 (the nibble's offset) + 16 (the bit trick's 1)
    return LaneLayout(np.ascontiguousarray(words.transpose(0, 2, 1)), by_block(scale), by_block(offset), library)


def _loaded() -> ctypes.CDLL:
    dll, how = _library()
    if dll is None:
        raise RuntimeError(f"rungs 6 and 7 (C) are not available on this machine: {how}")
    return dll


def _checked(x_shape: tuple[int, int], groups: int, layout: LaneLayout, n_rows: int, y: np.ndarray,
             *inputs: tuple[str, tuple[int, ...], tuple[int, ...]]) -> ctypes.CDLL:
    """The library that reads `layout` (its own, else this machine's), once every shape the C loops trust is
    what x [M, K], `groups` and `layout` call for (inputs: (name, expected shape, shape)): a wrong one would
    read or write past an array's end."""
    dll = layout.library
    if dll is None:  # a layout alone: this machine's build reads it, when their lanes match
        dll = _loaded()
        if layout.lanes != dll.int4_gemv_lanes():
            raise RuntimeError(f"the weight is laid out for {layout.lanes} lanes, rungs 6 and 7 are built here for "
                               f"{dll.int4_gemv_lanes()}: lay it out again with kernels.pack_weight")
    m_rows, k = x_shape
    if groups < 1 or k % groups or (k // groups) % 8:
        fail("groups", groups, f"a count of groups of a multiple of 8 of x's {k} inputs")
    blocks, lanes = -(-n_rows // layout.lanes), layout.lanes
    expected = (*inputs, ("y", (m_rows, n_rows), y.shape),  # layout.offset: LaneLayout checks it is scale's shape
                ("layout.words", (blocks, k // 8, lanes), layout.words.shape),
                ("layout.scale", (blocks, groups, lanes), layout.scale.shape))
    for name, want, got in expected:
        if got != want:
            fail(name, got, f"shape {want} for x {x_shape}")
    return dll


def _address(name: str, a: np.ndarray, write: bool = False) -> int:
    """Where a's values start, once a is a C-contiguous float32 array (and writable, to `write` into)."""
    check_type(name, a, np.ndarray, "a float32 numpy array")
    if a.dtype != np.float32 or not a.flags.c_contiguous or (write and not a.flags.writeable):
        fail(name, (a.dtype, "C-contiguous" if a.flags.c_contiguous else "strided",
                    "writable" if a.flags.writeable else "read-only"),
             "a C-contiguous float32 array" + (" that can be written" if write else ""))
    return a.ctypes.data


def gemv(x: np.ndarray, x_sums: np.ndarray, layout: LaneLayout, n_rows: int, threads: int, y: np.ndarray) -> None:
    """int4_gemv.c's float product into y [M, n_rows] (x [M, K], x_sums [M, G]; layout from lay_out).
    RuntimeError when rung 6 is not built here, or a layout alone was written for another build."""
    if x.ndim != 2 or x_sums.ndim != 2:
        fail("x", (tuple(x.shape), tuple(x_sums.shape)), "x [M, K] and x_sums [M, G]")
    m_rows, groups = x_sums.shape
    dll = _checked(x.shape, groups, layout, n_rows, y, ("x_sums", (x.shape[0], groups), x_sums.shape))
    dll.int4_gemv(_address("x", x), _address("x_sums", x_sums), *layout.addresses, m_rows, n_rows, x.shape[1],
                  groups, threads, _address("y", y, write=True))


def gemv_int8(x: np.ndarray, block: int, groups: int, layout: LaneLayout, n_rows: int, threads: int,
              y: np.ndarray) -> None:
    """int4_gemv.c's integer product (rung 7) into y [M, n_rows]: x float32 [M, K] rounded to int8 per block of
    `block` inputs (8, 16 or 32, inside one of the `groups` groups), the codes multiplied as bytes.
    RuntimeError when rung 7 is not built here, or a layout alone was written for another build; ValueError for a
    NaN or inf in x (the C loop finds it as it rounds x, and leaves y as it was)."""
    if x.ndim != 2:
        fail("x", tuple(x.shape), "x [M, K]")
    k = x.shape[1]
    if groups < 1 or k % groups:
        fail("groups", groups, f"a count of groups that divides x's {k} inputs")
    if block not in (8, 16, 32) or (k // groups) % block:
        fail("block", block, f"8, 16 or 32 inputs, dividing each of the {groups} groups of x's {k} inputs")
    dll = _checked(x.shape, groups, layout, n_rows, y)
    status = dll.int4_gemv_int8(_address("x", x), *layout.addresses, x.shape[0], n_rows, k, groups, block, threads,
                                _address("y", y, write=True))
    if status == INT8_X_NOT_FINITE:
        fail("x", "a NaN or inf", "finite values")
    if status == INT8_NO_MEMORY:
        raise MemoryError(f"rung 7 could not allocate {x.size} bytes for x rounded to int8 and its scales")
    if status:
        raise RuntimeError(f"int4_gemv_int8 returned status {status}, which kernels_c does not know")
